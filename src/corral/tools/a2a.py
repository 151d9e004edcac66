"""The ``a2a`` tool kind: a remote A2A agent called as a governed tool, with the ``a2a-sdk``.

A call reads the remote agent card (once per tool; again after a failure), sends one
``message/send`` (``SendMessage``) with the call's text and waits for the answer:
a ``Message``, or a ``Task`` (polled with ``GetTask`` while it is still working).

- **Input.** Arguments of one string (the default schema: ``{input}``) are sent as
  that text; any other arguments as their JSON text. ``messageId`` is the call's
  idempotency key with a digest of its arguments (stable across retries and replays,
  so a remote that dedupes by message id never runs a call twice, and a model asked
  again after a crash that asks differently is not answered the old question); the
  metadata carries the key itself with the run and call ids.
- **Result.** The answer's parts (a completed task's artifacts, else its status
  message): text parts joined as text, one data part as its JSON, anything else as a
  list describing each part (files by name, type and URL; never their bytes).
- **Failures** are ``ToolError``: a failed or rejected task ``execution_failed`` with
  the remote's reason; a cancelled one, or one asking for input or auth, too; HTTP 408,
  429, 5xx and unreachable hosts ``unavailable`` (retryable); 4xx and redirects (not
  followed) ``execution_failed``; an answer that is not A2A ``execution_failed``
  ("malformed answer"); a client timeout ``timeout``; an answer over
  :data:`MAX_RESPONSE_BYTES` ``output_too_large``.
- **SSRF.** Every request (the card, then the interface URL the card names) goes
  through :class:`GuardedTransport`: checked by :func:`corral.tools.ssrf.check_destination`
  and sent to the checked address. Proxies from the environment are not used.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio
import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.client.client import Client
from a2a.client.errors import A2AClientError, A2AClientTimeoutError, AgentCardResolutionError
from a2a.types.a2a_pb2 import (
    AgentCard,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    Task,
    TaskState,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, TransportProtocol
from a2a.utils.errors import A2AError
from google.protobuf.json_format import MessageToDict, ParseError

from corral.core.errors import ConfigurationError, ToolError, ToolErrorCode
from corral.resources.kinds import ToolSpecModel
from corral.tools.base import Tool, ToolContext
from corral.tools.http import auth_headers
from corral.tools.naming import declared_spec
from corral.tools.ssrf import Resolver, check_destination, system_resolver

__all__ = ["MAX_RESPONSE_BYTES", "A2aTool", "GuardedTransport", "create"]

#: an answer (card or JSON-RPC) larger than this fails the call with ``output_too_large``
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
#: how often a task the remote still works on is read again
POLL_SECONDS = 0.5
_RETRYABLE_STATUS = frozenset({408, 425, 429})
_FAILED = {
    TaskState.TASK_STATE_FAILED: "the remote agent's task failed",
    TaskState.TASK_STATE_REJECTED: "the remote agent rejected the task",
    TaskState.TASK_STATE_CANCELED: "the remote agent cancelled the task",
    TaskState.TASK_STATE_INPUT_REQUIRED: "the remote agent asks for more input",
    TaskState.TASK_STATE_AUTH_REQUIRED: "the remote agent asks for authentication",
}


class _CappedStream(httpx.AsyncByteStream):
    """A response body that fails past ``limit`` bytes."""

    def __init__(self, inner: httpx.AsyncByteStream, limit: int, url: str) -> None:
        self.inner, self.limit, self.url = inner, limit, url

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self.inner:
            seen += len(chunk)
            if seen > self.limit:
                raise ToolError(
                    ToolErrorCode.OUTPUT_TOO_LARGE,
                    f"{self.url}: the answer is larger than {self.limit} bytes",
                )
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class GuardedTransport(httpx.AsyncBaseTransport):
    """Every request checked by the SSRF guard and sent to the checked address; every
    answer capped at ``max_bytes``."""

    def __init__(
        self,
        *,
        allow_private: bool,
        resolver: Resolver = system_resolver,
        inner: httpx.AsyncBaseTransport | None = None,
        max_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        self.allow_private = allow_private
        self.resolver = resolver
        self.inner = inner or httpx.AsyncHTTPTransport(trust_env=False)
        self.max_bytes = max_bytes

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        destination = await check_destination(
            request.url, allow_private=self.allow_private, resolver=self.resolver
        )
        request.url = destination.pinned_url
        request.headers["Host"] = destination.host_header
        if destination.sni_hostname is not None:
            request.extensions = {**request.extensions, "sni_hostname": destination.sni_hostname}
        response = await self.inner.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_CappedStream(response.stream, self.max_bytes, url),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


def _split_card_url(url: str) -> tuple[str, str]:
    """(base URL, card path) of the configured url."""
    path = AGENT_CARD_WELL_KNOWN_PATH
    if url.rstrip("/").endswith(path):
        return url.rstrip("/")[: -len(path)], path
    return url.rstrip("/"), path


def message_text(arguments: dict[str, Any]) -> str:
    """What a call sends: its one string argument, else the arguments as JSON."""
    if len(arguments) == 1:
        [value] = arguments.values()
        if isinstance(value, str):
            return value
    return json.dumps(arguments, ensure_ascii=False)


def _part(part: Part) -> dict[str, Any]:
    kind = part.WhichOneof("content")
    if kind == "text":
        return {"text": part.text}
    if kind == "data":
        return {"data": MessageToDict(part)["data"]}
    described: dict[str, Any] = {"media_type": part.media_type, "filename": part.filename}
    if kind == "url":
        described["url"] = part.url
    elif kind == "raw":
        described["bytes"] = len(part.raw)
    return {"file": {k: v for k, v in described.items() if v}}


def parts_result(parts: list[Part]) -> Any:
    """The tool result of an answer's parts (see the module docstring)."""
    described = [_part(p) for p in parts]
    if described and all("text" in d for d in described):
        return "\n".join(d["text"] for d in described)
    if len(described) == 1 and "data" in described[0]:
        return described[0]["data"]
    return described


def _status_text(task: Task) -> str:
    return "\n".join(p.text for p in task.status.message.parts if p.text)


def task_result(task: Task) -> Any:
    """A finished task's result; ``ToolError`` for one that did not complete."""
    state = task.status.state
    if not task.id or state == TaskState.TASK_STATE_UNSPECIFIED:
        raise ValueError("the task has no id or no state")
    if state == TaskState.TASK_STATE_COMPLETED:
        parts = [p for a in task.artifacts for p in a.parts] or list(task.status.message.parts)
        return parts_result(parts)
    what = _FAILED.get(state, f"the remote agent answered task state {state}")
    reason = _status_text(task)
    raise ToolError(
        ToolErrorCode.EXECUTION_FAILED,
        f"{what}: {reason}" if reason else what,
        details={"task_id": task.id, "state": TaskState.Name(state)},
    )


def _status_error(status: int | None, what: str, url: str) -> ToolError:
    details: dict[str, Any] = {"url": url}
    if status is not None:
        details["status_code"] = status
    if status is None or status >= 500 or status in _RETRYABLE_STATUS:
        return ToolError(ToolErrorCode.UNAVAILABLE, what, retryable=True, details=details)
    return ToolError(ToolErrorCode.EXECUTION_FAILED, what, details=details)


def remote_error(exc: A2AError, url: str) -> ToolError:
    """A ToolError for what the SDK raised (see the module docstring)."""
    cause = exc.__cause__
    if isinstance(exc, A2AClientTimeoutError) or isinstance(cause, httpx.TimeoutException):
        return ToolError(
            ToolErrorCode.TIMEOUT, f"{url}: the remote agent timed out", retryable=True
        )
    if isinstance(cause, httpx.HTTPStatusError):
        status = cause.response.status_code
        hint = ""
        if 300 <= status < 400:
            hint = f": redirect to {cause.response.headers.get('location', '')!r} not followed"
        return _status_error(status, f"{url}: HTTP {status}{hint}", url)
    if isinstance(exc, AgentCardResolutionError) and exc.status_code is not None:
        return _status_error(exc.status_code, f"{url}: HTTP {exc.status_code}", url)
    if isinstance(cause, httpx.TransportError):
        return _status_error(None, f"{url}: unreachable: {type(cause).__name__}", url)
    if isinstance(exc, A2AClientError | AgentCardResolutionError):
        return ToolError(
            ToolErrorCode.EXECUTION_FAILED,
            f"{url}: malformed answer: {exc.message}"[:1000],
            details={"url": url},
        )
    # a JSON-RPC error of the remote agent
    return ToolError(
        ToolErrorCode.EXECUTION_FAILED,
        f"{url}: the remote agent refused the call: {exc.message}"[:1000],
        details={"url": url, "error": type(exc).__name__},
    )


class A2aTool(Tool):
    """A Tool that sends each call to a remote A2A agent; see the module docstring."""

    def __init__(
        self,
        name: str,
        spec: ToolSpecModel,
        headers: dict[str, str],
        *,
        resolver: Resolver = system_resolver,
        inner: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        assert spec.a2a is not None
        self.ref = name
        self.spec = declared_spec(name, spec)
        self.idempotent = spec.idempotent
        self.url = spec.a2a.url
        self._base, self._card_path = _split_card_url(spec.a2a.url)
        self._http = httpx.AsyncClient(
            transport=GuardedTransport(
                allow_private=spec.a2a.allow_private, resolver=resolver, inner=inner
            ),
            headers=headers,
            follow_redirects=False,
            trust_env=False,
            timeout=httpx.Timeout(spec.timeout_seconds),
        )
        self._client: Client | None = None

    async def _connected(self) -> Client:
        if self._client is None:
            resolver = A2ACardResolver(self._http, self._base, self._card_path)
            card: AgentCard = await resolver.get_agent_card()
            bindings = [TransportProtocol.JSONRPC.value, TransportProtocol.HTTP_JSON.value]
            config = ClientConfig(
                httpx_client=self._http, streaming=False, supported_protocol_bindings=bindings
            )
            factory = ClientFactory(config)
            try:
                self._client = factory.create(card)
            except ValueError as exc:  # no interface this client speaks
                raise ToolError(
                    ToolErrorCode.EXECUTION_FAILED,
                    f"{self.url}: the agent card offers no JSON-RPC or HTTP+JSON interface ({exc})",
                ) from None
        return self._client

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        # the remote dedupes by messageId: the call's key with its arguments' digest
        message = Message(message_id=ctx.key_with(arguments), role=Role.ROLE_USER)
        message.parts.append(Part(text=message_text(arguments)))
        message.metadata.update(
            {
                "corral/idempotency_key": ctx.idempotency_key,
                "corral/run_id": ctx.run_id,
                "corral/tool_call_id": ctx.call_id,
            }
        )
        try:
            client = await self._connected()
            return await self._send(client, SendMessageRequest(message=message))
        except A2AError as exc:
            self._client = None  # read the card again next time: the remote may have moved
            raise remote_error(exc, self.url) from None
        except (ParseError, ValueError, KeyError, TypeError, RecursionError) as exc:
            # an answer that is not A2A (or JSON nested deeper than the parser goes)
            raise ToolError(
                ToolErrorCode.EXECUTION_FAILED,
                f"{self.url}: malformed answer: {type(exc).__name__}: {exc}"[:1000],
                details={"url": self.url},
            ) from None

    async def _send(self, client: Client, request: SendMessageRequest) -> Any:
        answer = None
        async for response in client.send_message(request):
            answer = response
        if answer is None:
            raise ValueError("no answer")
        if answer.HasField("message"):
            return parts_result(list(answer.message.parts))
        if not answer.HasField("task"):
            raise ValueError("the answer is neither a task nor a message")
        task = answer.task
        while task.status.state in (
            TaskState.TASK_STATE_SUBMITTED,
            TaskState.TASK_STATE_WORKING,
        ):  # the governance timeout bounds this
            await anyio.sleep(POLL_SECONDS)
            task = await client.get_task(GetTaskRequest(id=task.id))
        return task_result(task)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()


def create(
    name: str,
    spec: ToolSpecModel,
    secrets: Mapping[str, str],
    *,
    resolver: Resolver = system_resolver,
    inner: httpx.AsyncBaseTransport | None = None,
) -> Tool:
    """Build an ``a2a`` Tool; a missing or malformed auth secret raises ``ConfigurationError``.

    As for ``http`` tools the url is checked on every call, not here; ``resolver`` and
    ``inner`` (the transport under the guard) are seams for tests and embedding.
    """
    if spec.a2a is None:
        raise ConfigurationError(f"Tool {name!r}: type 'a2a' needs an 'a2a' block")
    owner = f"Tool {name!r}"
    headers = {**spec.a2a.headers, **auth_headers(spec.a2a.auth, secrets, owner=owner)}
    return A2aTool(name, spec, headers, resolver=resolver, inner=inner)
