"""The ``http`` tool kind: POST (or PUT) the call's arguments as JSON to an endpoint.

Every request carries ``Idempotency-Key`` (stable across retries and replays of
the same call), ``X-Corral-Run-Id`` and ``X-Corral-Tool-Call-Id``, plus the
Tool's headers and its auth profile (``bearer``, ``api-key``, ``basic``, each
from a secret). Redirects are not followed, proxies from the environment are
not used, and unless ``allow_private`` is set the destination passes the SSRF
guard (:mod:`corral.tools.ssrf`) and the request goes to the checked address.

Failures map to ``ToolError``: 4xx is ``execution_failed`` and not retryable
(except 408 and 429), 5xx is ``execution_failed`` and retryable, a connection
failure is ``unavailable`` and retryable, a client-side timeout is ``timeout``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import httpx

from corral.core.errors import ConfigurationError, ToolError, ToolErrorCode
from corral.resources.kinds import HttpAuth, ToolSpecModel
from corral.resources.secrets import header_secret
from corral.tools.base import Tool, ToolContext
from corral.tools.naming import declared_spec
from corral.tools.ssrf import Resolver, check_destination, system_resolver

__all__ = [
    "MAX_RESPONSE_BYTES",
    "HttpTool",
    "auth_headers",
    "create",
    "http_client",
    "send_checked",
]

#: a response body larger than this fails the call with ``output_too_large``
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
_REASON_BODY_CHARS = 1000
_RETRYABLE_4XX = frozenset({408, 425, 429})


def auth_headers(
    auth: HttpAuth | None, secrets: Mapping[str, str], *, owner: str
) -> dict[str, str]:
    """The headers of an auth profile; a missing or malformed secret is a ``ConfigurationError``."""
    if auth is None:
        return {}
    value = secrets.get(auth.secret)
    if value is None:
        raise ConfigurationError(f"{owner}: auth secret {auth.secret!r} is not available")
    if auth.type == "bearer":
        return {"Authorization": f"Bearer {header_secret(value, owner=owner, secret=auth.secret)}"}
    if auth.type == "api-key":
        return {auth.header: header_secret(value, owner=owner, secret=auth.secret)}
    if ":" not in value:
        raise ConfigurationError(
            f"{owner}: basic auth secret {auth.secret!r} must hold 'user:password'"
        )
    token = base64.b64encode(value.encode("utf-8")).decode("ascii")
    return {"Authorization": f"Basic {token}"}


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers.get("retry-after", ""))
    except ValueError:
        return None


def _decode(response: httpx.Response, body: bytes) -> Any:
    text = body.decode(response.encoding or "utf-8", errors="replace")
    if "json" in response.headers.get("content-type", "").lower() and text.strip():
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def _status_error(response: httpx.Response, body: bytes, url: str) -> ToolError:
    status = response.status_code
    excerpt = body.decode(response.encoding or "utf-8", errors="replace")[:_REASON_BODY_CHARS]
    details: dict[str, Any] = {"status_code": status, "url": url}
    if 300 <= status < 400:
        location = response.headers.get("location", "")
        details["location"] = location
        return ToolError(
            ToolErrorCode.EXECUTION_FAILED,
            f"HTTP {status}: redirect to {location!r} not followed",
            details=details,
        )
    retry_after = _retry_after(response)
    if retry_after is not None:
        details["retry_after"] = retry_after
    if excerpt:
        details["body"] = excerpt
    reason = f"HTTP {status} {response.reason_phrase}".rstrip()
    return ToolError(
        ToolErrorCode.EXECUTION_FAILED,
        f"{reason}: {excerpt}" if excerpt.strip() else reason,
        retryable=status >= 500 or status in _RETRYABLE_4XX,
        details=details,
    )


def http_client(
    timeout: httpx.Timeout, transport: httpx.AsyncBaseTransport | None
) -> httpx.AsyncClient:
    """A client for calls past the SSRF guard: no redirects followed, no proxies or
    credentials from the environment."""
    return httpx.AsyncClient(
        transport=transport, follow_redirects=False, trust_env=False, timeout=timeout
    )


async def send_checked(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    content: bytes,
    headers: Mapping[str, str],
    allow_private: bool,
    resolver: Resolver = system_resolver,
    max_bytes: int = MAX_RESPONSE_BYTES,
) -> tuple[httpx.Response, bytes]:
    """Send one request to ``url`` past the SSRF guard (to the checked address, with the
    name's ``Host`` and SNI) and read its answer, at most ``max_bytes`` of it.

    Whatever the status, the response and its body come back. ``ToolError``:
    ``blocked_destination`` (the guard), ``timeout``, ``unavailable`` (no connection,
    retryable), ``output_too_large`` (a longer body), ``execution_failed`` (anything
    else httpx raises).
    """
    destination = await check_destination(url, allow_private=allow_private, resolver=resolver)
    extensions = {}
    if destination.sni_hostname is not None:
        extensions["sni_hostname"] = destination.sni_hostname
    request = client.build_request(
        method,
        destination.pinned_url,
        content=content,
        headers={**headers, "Host": destination.host_header},
        extensions=extensions,
    )
    try:
        response = await client.send(request, stream=True)
        try:
            body = await _read_capped(response, url, max_bytes)
        finally:
            await response.aclose()
    except httpx.TimeoutException as exc:
        raise ToolError(
            ToolErrorCode.TIMEOUT, f"{url}: {type(exc).__name__}", retryable=True
        ) from exc
    except httpx.TransportError as exc:
        raise ToolError(
            ToolErrorCode.UNAVAILABLE,
            f"{url}: {type(exc).__name__}: {exc}",
            retryable=True,
            details={"url": url},
        ) from exc
    except httpx.HTTPError as exc:
        raise ToolError(
            ToolErrorCode.EXECUTION_FAILED, f"{url}: {type(exc).__name__}: {exc}"
        ) from exc
    return response, body


async def _read_capped(response: httpx.Response, url: str, max_bytes: int) -> bytes:
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > max_bytes:
            raise ToolError(
                ToolErrorCode.OUTPUT_TOO_LARGE,
                f"{url}: the response is larger than {max_bytes} bytes",
            )
    return bytes(body)


class HttpTool(Tool):
    """A Tool that sends each call to an HTTP endpoint; see the module docstring.

    The Tool keeps one connection pool; :meth:`aclose` releases it.
    """

    def __init__(
        self,
        name: str,
        spec: ToolSpecModel,
        headers: dict[str, str],
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        resolver: Resolver = system_resolver,
    ) -> None:
        assert spec.http is not None
        self.ref = name
        self.spec = declared_spec(name, spec)
        self.idempotent = spec.idempotent
        self._http = spec.http
        self._headers = headers
        self._timeout = httpx.Timeout(spec.timeout_seconds)
        self._transport = transport
        self._resolver = resolver
        self._client: httpx.AsyncClient | None = None

    def _get_client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = http_client(self._timeout, self._transport)
        return self._client

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        url = self._http.url
        headers = {
            "Accept": "application/json, text/plain;q=0.9, */*;q=0.5",
            **self._headers,
            "Content-Type": "application/json",
            "Idempotency-Key": ctx.idempotency_key,
            "X-Corral-Run-Id": ctx.run_id,
            "X-Corral-Tool-Call-Id": ctx.call_id,
        }
        response, body = await send_checked(
            self._get_client(),
            self._http.method,
            url,
            content=json.dumps(arguments).encode("utf-8"),
            headers=headers,
            allow_private=self._http.allow_private,
            resolver=self._resolver,
        )
        if not response.is_success:
            raise _status_error(response, body, url)
        return _decode(response, body)

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()


def create(
    name: str,
    spec: ToolSpecModel,
    secrets: Mapping[str, str],
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    resolver: Resolver = system_resolver,
) -> Tool:
    """Build an ``http`` Tool; a missing or malformed auth secret raises ``ConfigurationError``.

    The url is not checked here: apply refused a bad one already, and every call
    checks it again (:func:`check_destination`), so a bad url fails that tool's
    calls (``blocked_destination``), never the agent that has the tool.
    ``transport`` and ``resolver`` are seams for tests and embedding (an
    ``httpx.MockTransport``, a fixed resolver); production uses the defaults.
    """
    if spec.http is None:
        raise ConfigurationError(f"Tool {name!r}: type 'http' needs an 'http' block")
    owner = f"Tool {name!r}"
    headers = {**spec.http.headers, **auth_headers(spec.http.auth, secrets, owner=owner)}
    return HttpTool(name, spec, headers, transport=transport, resolver=resolver)
