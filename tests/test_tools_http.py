"""The ``http`` tool kind and the SSRF guard, against a real server on 127.0.0.1.

What every kind does (invalid input, timeouts, cancellation, the output cap, failures, the
idempotency key) is in ``tests/conformance/test_tool_kinds.py``.
"""

from __future__ import annotations

import base64
import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.core.errors import ToolError
from corral.resources.kinds import HttpAuth, HttpToolSpec, ToolSpecModel
from corral.tools import http as http_tool
from corral.tools.base import Tool, ToolContext
from corral.tools.ssrf import Resolver, blocked_reason, check_destination
from http_endpoints import Server, serving


@pytest.fixture
def server() -> Iterator[Server]:
    with serving() as state:
        yield state


def context(tmp_path: Path) -> ToolContext:
    return ToolContext(
        run_id="run-9",
        agent="fetcher",
        namespace="default",
        call_id="call-4",
        idempotency_key="run-9:1:call-4",
        workspace=tmp_path,
    )


def make(url: str, *, secrets: dict[str, str] | None = None, **http: Any) -> Tool:
    spec = ToolSpecModel(
        type="http",
        parameters={"type": "object", "properties": {}},
        http=HttpToolSpec(url=url, **http),
    )
    return http_tool.create("remote", spec, secrets or {})


class RefusingTransport(httpx.AsyncBaseTransport):
    """Records every request that reaches the network layer, and sends none."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        raise httpx.ConnectError("the test transport never connects", request=request)


async def test_call_posts_json_with_run_headers(server: Server, tmp_path: Path) -> None:
    tool = make(server.url(), allow_private=True, headers={"X-Team": "blue"})
    try:
        result = await tool.call({"city": "Oslo", "days": 3}, context(tmp_path))
    finally:
        await tool.aclose()
    assert result["body"] == {"city": "Oslo", "days": 3}
    [request] = server.requests
    assert request.method == "POST"
    assert request.headers["X-Corral-Run-Id"] == "run-9"
    assert request.headers["X-Corral-Tool-Call-Id"] == "call-4"
    assert request.headers["X-Team"] == "blue"
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["Host"] == f"127.0.0.1:{server.port}"


@pytest.mark.parametrize(
    ("auth", "secret", "header", "expected"),
    [
        (HttpAuth(type="bearer", secret="tok"), "abc123", "Authorization", "Bearer abc123"),
        (HttpAuth(type="api-key", secret="tok", header="X-Api-Key"), "k-1", "X-Api-Key", "k-1"),
        (
            HttpAuth(type="basic", secret="tok"),
            "ada:pa:ss",
            "Authorization",
            "Basic " + base64.b64encode(b"ada:pa:ss").decode(),
        ),
    ],
)
async def test_auth_profiles_send_their_header(
    server: Server, tmp_path: Path, auth: HttpAuth, secret: str, header: str, expected: str
) -> None:
    tool = make(server.url(), allow_private=True, auth=auth, secrets={"tok": secret}, method="PUT")
    try:
        await tool.call({}, context(tmp_path))
    finally:
        await tool.aclose()
    [request] = server.requests
    assert request.method == "PUT"
    assert request.headers[header] == expected


def resolving_to(address: str) -> Resolver:
    """A resolver that answers ``address`` for any name (a DNS record an attacker controls)."""

    async def resolve(host: str, port: int) -> list[str]:
        return [address]

    return resolve


@pytest.mark.parametrize(
    "address",
    [
        "169.254.169.254",
        "10.0.0.1",
        "fd00:ec2::254",
        "::ffff:169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
    ],
)
async def test_ssrf_guard_blocks_a_name_resolving_to_a_private_address_before_any_connection(
    address: str, tmp_path: Path
) -> None:
    # A literal private address is refused when the Tool is applied; a name is only
    # known to be private once it is resolved, on the call.
    transport = RefusingTransport()
    spec = ToolSpecModel(
        type="http",
        parameters={"type": "object"},
        http=HttpToolSpec(url="http://tools.example.test/latest"),
    )
    tool = http_tool.create("remote", spec, {}, transport=transport, resolver=resolving_to(address))
    with pytest.raises(ToolError) as caught:
        await tool.call({}, context(tmp_path))
    assert caught.value.code == "blocked_destination"
    assert caught.value.retryable is False
    assert str(ipaddress.ip_address(address)) in caught.value.info.reason
    assert transport.requests == []
    await tool.aclose()


async def test_a_loopback_name_is_blocked_unless_private_is_allowed(
    server: Server, tmp_path: Path
) -> None:
    url = server.url(host="tools.internal.test")
    spec = ToolSpecModel(type="http", parameters={"type": "object"}, http=HttpToolSpec(url=url))
    blocked = http_tool.create("remote", spec, {}, resolver=resolving_to("127.0.0.1"))
    with pytest.raises(ToolError) as caught:
        await blocked.call({}, context(tmp_path))
    assert caught.value.code == "blocked_destination"
    assert server.requests == []

    allowed = make(server.url(), allow_private=True)
    try:
        await allowed.call({}, context(tmp_path))
    finally:
        await allowed.aclose()
    assert len(server.requests) == 1


async def test_connection_goes_to_the_checked_address(server: Server, tmp_path: Path) -> None:
    async def resolver(host: str, port: int) -> list[str]:
        assert host == "tools.internal.test"
        return ["127.0.0.1"]

    spec = ToolSpecModel(
        type="http",
        parameters={"type": "object"},
        http=HttpToolSpec(url=server.url(host="tools.internal.test"), allow_private=True),
    )
    tool = http_tool.create("remote", spec, {}, resolver=resolver)
    try:
        await tool.call({}, context(tmp_path))
    finally:
        await tool.aclose()
    assert server.requests[0].headers["Host"] == f"tools.internal.test:{server.port}"


async def test_a_name_with_any_private_address_is_blocked() -> None:
    async def resolver(host: str, port: int) -> list[str]:
        return ["93.184.215.14", "10.1.2.3"]

    with pytest.raises(ToolError) as caught:
        await check_destination("https://api.example.test/v1", resolver=resolver)
    assert caught.value.code == "blocked_destination"
    assert "10.1.2.3" in caught.value.info.reason


async def test_public_address_is_pinned_with_host_and_sni() -> None:
    async def resolver(host: str, port: int) -> list[str]:
        return ["93.184.215.14"]

    destination = await check_destination("https://api.example.test:8443/v1?q=1", resolver=resolver)
    assert str(destination.pinned_url) == "https://93.184.215.14:8443/v1?q=1"
    assert destination.host_header == "api.example.test:8443"
    assert destination.sni_hostname == "api.example.test"


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/x", "gopher://x/"])
async def test_non_http_schemes_are_blocked(url: str) -> None:
    with pytest.raises(ToolError) as caught:
        await check_destination(url, allow_private=True)
    assert caught.value.code == "blocked_destination"


@pytest.mark.parametrize(
    ("address", "blocked"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("169.254.169.254", True),
        ("fe80::1", True),
        ("10.0.0.1", True),
        ("172.16.0.1", True),
        ("192.168.1.1", True),
        ("fc00::1", True),
        ("100.64.0.1", True),
        ("0.0.0.0", True),
        ("224.0.0.1", True),
        ("240.0.0.1", True),
        ("64:ff9b::a9fe:a9fe", True),
        ("2002:a00:1::", True),
        ("8.8.8.8", False),
        ("2606:4700:4700::1111", False),
    ],
)
def test_blocked_address_classes(address: str, blocked: bool) -> None:
    assert (blocked_reason(ipaddress.ip_address(address)) is not None) is blocked


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(400, False), (404, False), (408, True), (429, True), (500, True), (503, True)],
)
async def test_error_statuses_map_to_tool_errors(
    server: Server, tmp_path: Path, status: int, retryable: bool
) -> None:
    tool = make(server.url(f"/status/{status}"), allow_private=True)
    try:
        with pytest.raises(ToolError) as caught:
            await tool.call({}, context(tmp_path))
    finally:
        await tool.aclose()
    error = caught.value
    assert error.code == "execution_failed"
    assert error.retryable is retryable
    assert error.info.details["status_code"] == status
    assert f"status {status} body" in error.info.reason
    if status == 429:
        assert error.info.details["retry_after"] == 3.0


async def test_redirects_are_not_followed(server: Server, tmp_path: Path) -> None:
    tool = make(server.url("/status/302"), allow_private=True)
    try:
        with pytest.raises(ToolError) as caught:
            await tool.call({}, context(tmp_path))
    finally:
        await tool.aclose()
    assert "not followed" in caught.value.info.reason
    assert len(server.requests) == 1


async def test_text_responses_are_returned_as_text(server: Server, tmp_path: Path) -> None:
    tool = make(server.url("/text"), allow_private=True)
    try:
        assert await tool.call({}, context(tmp_path)) == "plain answer"
    finally:
        await tool.aclose()


async def test_connection_refused_is_retryable_unavailable(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    tool = make(f"http://127.0.0.1:{port}/", allow_private=True)
    try:
        with pytest.raises(ToolError) as caught:
            await tool.call({}, context(tmp_path))
    finally:
        await tool.aclose()
    assert caught.value.code == "unavailable"
    assert caught.value.retryable is True
