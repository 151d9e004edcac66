"""Hostile callers of the A2A server and hostile remotes of the ``a2a`` tool.

The server side runs a real ``corral serve`` (SQLite) and speaks raw JSON-RPC, as a
careless or malicious client would; the tool side calls the hand-written remotes of
tests/a2a_remotes.py. Expected everywhere: a clear error with a stable code, no
traceback in the log, nothing leaked, and the process serving on.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import uvicorn

from a2a_remotes import Remote, serving
from corral.bus.local import LocalBus
from corral.core.messages import ToolCall
from corral.core.settings import Settings
from corral.core.tokens import Role, mint_token
from corral.resources.kinds import STORED, A2aToolSpec, ToolSpecModel
from corral.resources.loader import load_text
from corral.server import create_app
from corral.store import open_store
from corral.tools import a2a as a2a_tool
from corral.tools.base import Tool, ToolContext
from corral.tools.governance import GovernedTool, ToolOutcome, ToolPolicy, Toolset
from server_harness import LiveServer, apply, echo_turn, resources, wait_for

NS = "alpha"
V1 = {"A2A-Version": "1.0"}


# ----------------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("home"), workers=2) as server:
        with server.client(server.mint(NS, Role.ADMIN)) as admin:
            apply(admin, resources("greeter", ["{text: hello there}"] * 20))
            schema = "  output_schema: {type: object}"
            for depth in (24, 40, 150):
                deep = '{"a": ' * depth + "{}" + "}" * depth
                turns = [f"{{text: '{deep}'}}"] * 3
                apply(admin, resources(f"deep{depth}", turns, extra=schema))
        yield server


def rpc(method: str, params: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()


def message(text: str, message_id: str, **fields: str) -> dict[str, Any]:
    return {
        "message": {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": text}]}
        | fields
    }


def post(live: LiveServer, body: bytes, agent: str = "greeter") -> httpx.Response:
    token = live.mint(NS, Role.OPERATOR)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", **V1}
    return httpx.post(f"{live.url}/a2a/{NS}/{agent}", content=body, headers=headers, timeout=60)


def card_urls(live: LiveServer, headers: dict[str, str]) -> set[str]:
    """Every URL the agent card of ``greeter`` names, fetched with ``headers``."""
    token = live.mint(NS, Role.VIEWER)
    answer = httpx.get(
        f"{live.url}/a2a/{NS}/greeter/.well-known/agent-card.json",
        headers={"Authorization": f"Bearer {token}", **headers},
    )
    assert answer.status_code == 200, answer.text
    card = answer.json()
    interfaces = {i["url"] for i in card["supportedInterfaces"]}
    return interfaces | {card["url"], card["provider"]["url"]}


@pytest.mark.parametrize(
    "headers",
    [
        {"Host": "attacker.example"},
        {"Host": "attacker.example:443", "X-Forwarded-Host": "attacker.example"},
        {"Host": "127.0.0.1:1", "X-Forwarded-Proto": "https"},
    ],
)
def test_a_forged_host_header_does_not_change_the_url_the_card_advertises(
    live: LiveServer, headers: dict[str, str]
) -> None:
    assert card_urls(live, headers) == {f"{live.url}/a2a/{NS}/greeter", live.url}


def test_the_card_advertises_corral_public_url_whatever_host_the_client_sends(
    tmp_path: Path,
) -> None:
    public = "https://corral.example.com"
    with LiveServer(tmp_path, workers=0, public_url=public) as server:
        with server.client(server.mint(NS, Role.ADMIN)) as admin:
            apply(admin, resources("greeter", ["{text: hi}"]))
        urls = card_urls(server, {"Host": "attacker.example"})
    assert urls == {f"{public}/a2a/{NS}/greeter", public}


async def test_an_app_served_without_corral_serve_or_a_public_url_refuses_the_card(
    tmp_path: Path,
) -> None:
    """``create_app`` under plain uvicorn: no listening address was recorded and
    ``CORRAL_PUBLIC_URL`` is unset, so no URL may be guessed from the Host header."""
    settings = Settings(home=tmp_path, db_url=f"sqlite:///{tmp_path / 'c.db'}", secret_key=None)
    store = await open_store(settings.db_url, settings=settings)
    token, plain = mint_token(NS, Role.VIEWER)
    await store.create_token(token)
    await store.apply(load_text(resources("greeter", ["{text: hi}"]), default_namespace=NS))
    app = create_app(store, LocalBus(), settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(server.serve)
            with anyio.fail_after(20):
                while not server.started:  # uvicorn says nothing else when it listens
                    await anyio.sleep(0.02)
            port = server.servers[0].sockets[0].getsockname()[1]
            async with httpx.AsyncClient() as http:
                answer = await http.get(
                    f"http://127.0.0.1:{port}/a2a/{NS}/greeter/.well-known/agent-card.json",
                    headers={"Authorization": f"Bearer {plain}", "Host": "attacker.example"},
                )
            server.should_exit = True
    finally:
        await store.close()
    assert answer.status_code == 503, answer.text
    assert answer.json()["code"] == "public_url_unset"
    assert "CORRAL_PUBLIC_URL" in answer.json()["detail"]
    assert "attacker" not in answer.text


def test_a_message_id_with_nul_is_invalid_params_as_the_apis_idempotency_key(
    live: LiveServer,
) -> None:
    # PostgreSQL cannot store NUL in text: the key would fail the store, not the caller
    response = post(live, rpc("SendMessage", message("hi", "a\x00b")))

    assert response.status_code == 200
    error = response.json()["error"]
    assert error["code"] == -32602 and "messageId" in error["message"], error
    tasks = live.client(live.mint(NS, Role.VIEWER)).get("/v1/tasks").json()["items"]
    assert not any("\x00" in (t["idempotency_key"] or "") for t in tasks)


@pytest.mark.parametrize(
    "body",
    [
        rpc("GetTask", {"id": "x" * 500_000}),
        rpc("CancelTask", {"id": "x" * 500_000}),
        rpc("SubscribeToTask", {"id": "x" * 500_000}),
        rpc("SendMessage", message("hi", "m-huge-context", contextId="x" * 500_000)),
    ],
    ids=["get", "cancel", "subscribe", "context"],
)
def test_a_huge_id_is_not_echoed_back_into_the_answer_and_the_log(
    live: LiveServer, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        response = post(live, body)

    assert response.status_code == 200
    assert len(response.content) < 2000, response.content[:200]
    assert response.json()["error"]["code"] in (-32001, -32602)
    assert all(len(r.getMessage()) < 2000 for r in caplog.records)


@pytest.mark.parametrize("depth", [24, 40, 150])
def test_an_output_nested_deeper_than_a_data_part_is_answered_as_json_text(
    live: LiveServer, caplog: pytest.LogCaptureFixture, depth: int
) -> None:
    # protobuf decodes 100 message levels, a JSON level takes about three: a run's JSON
    # output may nest deeper than a data part can
    agent = f"deep{depth}"
    with caplog.at_level(logging.WARNING):
        answer = post(live, rpc("SendMessage", message("go", f"deep-{depth}")), agent=agent)
        again = post(live, rpc("GetTask", {"id": answer.json()["result"]["task"]["id"]}), agent)

    task = answer.json()["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    [part] = task["artifacts"][0]["parts"]
    assert part["mediaType"] == "application/json"
    value = part["data"] if depth <= 24 else json.loads(part["text"])
    levels = 0
    while value:
        levels, value = levels + 1, value["a"]
    assert levels == depth
    assert again.json()["result"]["artifacts"] == task["artifacts"]
    assert not [r for r in caplog.records if r.exc_info]


async def _requests_in_flight() -> int:
    """The HTTP requests the server is still handling (uvicorn runs each in a task)."""
    return sum("run_asgi" in t.get_coro().__qualname__ for t in asyncio.all_tasks())  # type: ignore[union-attr]


@pytest.mark.parametrize("door", ["a2a", "prompt"])
def test_a_blocking_send_whose_client_went_away_stops_waiting(tmp_path: Path, door: str) -> None:
    # SendMessage (and POST /prompt) wait for the run to settle: a client that gave up
    # must not leave a request behind, waiting up to max_prompt_timeout_seconds
    with LiveServer(tmp_path, workers=1) as live:
        with live.client(live.mint(NS, Role.ADMIN)) as admin:
            apply(admin, resources("sleeper", [echo_turn("zzz", seconds=60), "{text: woke}"]))
        abandon_sends(live, door)


def abandon_sends(live: LiveServer, door: str) -> None:
    token = live.mint(NS, Role.OPERATOR)
    headers = {"Authorization": f"Bearer {token}", **V1}

    async def abandon(count: int) -> None:
        async with httpx.AsyncClient(headers=headers, timeout=0.5) as http:

            async def one(index: int) -> None:
                with pytest.raises(httpx.TimeoutException):
                    if door == "a2a":
                        body = rpc("SendMessage", message("go", f"gone-{door}-{index}"))
                        await http.post(
                            f"{live.url}/a2a/{NS}/sleeper",
                            content=body,
                            headers={"Content-Type": "application/json"},
                        )
                    else:
                        await http.post(
                            f"{live.url}/v1/agents/sleeper/prompt", json={"input": "go"}
                        )

            async with anyio.create_task_group() as group:
                for index in range(count):
                    group.start_soon(one, index)

    anyio.run(abandon, 20)

    wait_for(lambda: live.call(_requests_in_flight()) == 0, 10, "the abandoned requests to end")
    assert httpx.get(f"{live.url}/healthz").status_code == 200


def test_streams_opened_and_abandoned_in_bulk_leave_nothing_behind(tmp_path: Path) -> None:
    with LiveServer(tmp_path, workers=1, poll_seconds=0.2) as live:
        with live.client(live.mint(NS, Role.ADMIN)) as admin:
            apply(admin, resources("sleeper", [echo_turn("zzz", seconds=60), "{text: woke}"]))
        token = live.mint(NS, Role.OPERATOR)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", **V1}
        url = f"{live.url}/a2a/{NS}/sleeper"
        started = httpx.post(
            url,
            content=rpc(
                "SendMessage", message("go", "s0") | {"configuration": {"returnImmediately": True}}
            ),
            headers=headers,
        )
        task_id = started.json()["result"]["task"]["id"]

        async def abandon(count: int) -> None:
            async with httpx.AsyncClient(headers=headers, timeout=30) as http:

                async def one(index: int) -> None:
                    body = (
                        rpc("SubscribeToTask", {"id": task_id})
                        if index % 2
                        else rpc("SendStreamingMessage", message("go", f"stream-{index}"))
                    )
                    async with http.stream("POST", url, content=body) as response:
                        async for line in response.aiter_lines():
                            if line.startswith("data:"):
                                return  # the first event read: the client goes away

                async with anyio.create_task_group() as group:
                    for index in range(count):
                        group.start_soon(one, index)

        anyio.run(abandon, 60)

        wait_for(lambda: live.call(_requests_in_flight()) == 0, 10, "the streams to end")
        task = httpx.post(url, content=rpc("GetTask", {"id": task_id}), headers=headers).json()
        assert task["result"]["status"]["state"] == "TASK_STATE_WORKING"


# ----------------------------------------------------------------------------- the tool


@pytest.fixture(scope="module")
def remote() -> Iterator[Remote]:
    with serving() as running:
        yield running


class Forwarding(httpx.AsyncBaseTransport):
    """The transport under the SSRF guard (its seam): what the guard let through goes to
    the local remote; every URL it was asked for is kept."""

    def __init__(self, remote: Remote) -> None:
        self.remote, self.asked = remote, list[str]()
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.asked.append(str(request.url))
        request.url = request.url.copy_with(host="127.0.0.1", port=self.remote.port)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def public(host: str, port: int) -> list[str]:
    return ["93.184.216.34"]  # every name resolves to a public address


def make(
    url: str, *, allow_private: bool = True, inner: httpx.AsyncBaseTransport | None = None
) -> Tool:
    a2a = A2aToolSpec.model_validate({"url": url, "allow_private": allow_private}, context=STORED)
    spec = ToolSpecModel(type="a2a", a2a=a2a)
    return a2a_tool.create("remote", spec, {}, resolver=public, inner=inner)


async def invoke(tool: Tool, tmp_path: Path, **policy: Any) -> ToolOutcome:
    toolset = Toolset([GovernedTool(tool, ToolPolicy(**policy))])
    call = ToolCall("call-1", tool.spec.name, json.dumps({"input": "x"}))
    ctx = ToolContext("run-1", "tester", "default", "call-1", "run-1:1:0", tmp_path)
    try:
        return await toolset.invoke(call, ctx)
    finally:
        await tool.aclose()


async def test_a_card_naming_a_metadata_address_is_blocked_before_any_request_to_it(
    remote: Remote, tmp_path: Path
) -> None:
    forwarding = Forwarding(remote)
    tool = make("http://agents.example/metadata", allow_private=False, inner=forwarding)

    outcome = await invoke(tool, tmp_path)

    assert outcome.error is not None
    assert outcome.error.code == "blocked_destination", outcome.error
    assert not any("169.254" in url for url in forwarding.asked), forwarding.asked


@pytest.mark.parametrize("agent", ["deep", "deepanswer"])
async def test_a_remote_nesting_its_json_too_deeply_is_a_malformed_answer_without_traceback(
    remote: Remote, tmp_path: Path, caplog: pytest.LogCaptureFixture, agent: str
) -> None:
    with caplog.at_level(logging.WARNING):
        outcome = await invoke(make(remote.url(agent)), tmp_path)

    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.retryable) == ("execution_failed", False)
    assert "malformed answer" in outcome.error.reason, outcome.error.reason
    assert not [r for r in caplog.records if r.exc_info], "a remote wrote a traceback"


@pytest.mark.parametrize("depth", [10, 40, 150])
async def test_a_data_part_nested_deeply_is_its_data_or_a_malformed_answer_without_traceback(
    remote: Remote, tmp_path: Path, caplog: pytest.LogCaptureFixture, depth: int
) -> None:
    with caplog.at_level(logging.WARNING):
        outcome = await invoke(make(remote.url(f"deepdata{depth}")), tmp_path)

    if outcome.error is None:
        levels, value = 0, json.loads(outcome.output)
        while value:
            levels, value = levels + 1, value["a"]
        assert levels == depth
    else:
        assert (outcome.error.code, outcome.error.retryable) == ("execution_failed", False)
        assert "malformed answer" in outcome.error.reason, outcome.error.reason
    assert not [r for r in caplog.records if r.exc_info], "a remote wrote a traceback"


async def test_a_card_larger_than_the_limit_is_output_too_large(
    remote: Remote, tmp_path: Path
) -> None:
    outcome = await invoke(make(remote.url("hugecard")), tmp_path)

    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.retryable) == ("output_too_large", False)


async def test_a_remote_answering_an_endless_stream_is_stopped_by_the_timeout(
    remote: Remote, tmp_path: Path
) -> None:
    with anyio.fail_after(20):
        outcome = await invoke(make(remote.url("endless")), tmp_path, timeout_seconds=1)

    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.retryable) == ("timeout", True)


async def test_a_replayed_call_asking_something_else_is_not_answered_with_the_old_answer(
    live: LiveServer, tmp_path: Path
) -> None:
    # a model asked again after a crash keeps the call's idempotency key (run, step,
    # index) but may ask differently: the Corral agent behind must run the new question
    block = A2aToolSpec.model_validate(
        {
            "url": f"{live.url}/a2a/{NS}/greeter",
            "allow_private": True,
            "auth": {"type": "bearer", "secret": "token"},
        },
        context=STORED,
    )
    spec = ToolSpecModel(type="a2a", a2a=block)
    tool = a2a_tool.create("greeter", spec, {"token": live.mint(NS, Role.OPERATOR)})
    ctx = ToolContext("run_replayed", "caller", "default", "call-1", "run_replayed:1:0", tmp_path)
    try:
        for text in ("the first question", "another question", "another question"):
            await tool.call({"input": text}, ctx)
    finally:
        await tool.aclose()

    viewer = live.client(live.mint(NS, Role.VIEWER))
    items = viewer.get("/v1/tasks", params={"agent": "greeter"}).json()["items"]
    keyed = [t for t in items if "run_replayed:1:0" in (t["idempotency_key"] or "")]
    assert sorted(t["input"] for t in keyed) == ["another question", "the first question"]
