"""Hostile callers of the A2A server and hostile remotes of the ``a2a`` tool.

The server side runs a real ``corral serve`` (SQLite) and speaks raw JSON-RPC, as a
careless or malicious client would; the tool side calls the hand-written remotes of
tests/a2a_remotes.py. Expected everywhere: a clear error with a stable code, no
traceback in the log, nothing leaked, and the process serving on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import subprocess
import sys
import urllib.parse
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
from databases import PostgresServer
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


# ----------------------------------------------------------------------------- ids on PostgreSQL

#: a task id a careless or hostile caller sends: NUL (PostgreSQL keeps no NUL in text),
#: then a newline and what would read as a line of the server's log
FORGING_ID = "run_1\x00\n2026-01-01 00:00:00,000 ERROR forged: the admin token is corral_x"


class ServeProcess:
    """``corral serve`` as a user runs it (its log on stderr, kept in a file), on a store."""

    def __init__(self, home: Path, db_url: str) -> None:
        from nats_servers import free_port

        home.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        env.update(CORRAL_HOME=str(home), CORRAL_DB_URL=db_url)
        self.home, self.log = home, home / "serve.log"
        self.url = f"http://127.0.0.1:{free_port()}"
        argv = [sys.executable, "-m", "corral", "serve", "--workers", "0"]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [*argv, "--port", self.url.rsplit(":", 1)[1]], env=env, stdout=out, stderr=out
            )
        wait_for(self._ready, timeout=60, message="corral serve to be ready")
        self.admin = (home / "admin.token").read_text().strip()

    def _ready(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()
        try:
            return httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> str:
        """Stop it; its whole log."""
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return self.log.read_text()


@pytest.fixture(scope="module")
def serve_on_postgres(
    tmp_path_factory: pytest.TempPathFactory, postgres: PostgresServer
) -> Iterator[ServeProcess]:
    database = postgres.create(migrated=True)
    server = ServeProcess(tmp_path_factory.mktemp("pg-home"), postgres.url(database))
    try:
        headers = {"Authorization": f"Bearer {server.admin}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as admin:
            apply(admin, resources("greeter", ["{text: hi}"]))
        yield server
    finally:
        server.stop()
        postgres.drop(database)


def test_a2a_ids_no_run_can_have_are_task_not_found_on_postgresql_and_forge_no_log_line(
    serve_on_postgres: ServeProcess,
) -> None:
    server = serve_on_postgres
    headers = {"Authorization": f"Bearer {server.admin}", **V1}
    base = f"{server.url}/a2a/default/greeter"
    # a lone surrogate is no string protobuf takes: invalid params, before any lookup
    hostile = {FORGING_ID: -32001, "run\x00": -32001, "run\r\nx": -32001, "r" * 65: -32001}
    hostile |= {"run/../x": -32001, "run\ud800": -32602}
    with httpx.Client(headers=headers, timeout=30) as http:
        for task_id, code in hostile.items():
            for method in ("GetTask", "CancelTask", "SubscribeToTask"):
                body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {"id": task_id}}
                answer = http.post(base, content=json.dumps(body).encode())
                assert answer.status_code == 200, (method, answer.text)
                assert answer.json()["error"]["code"] == code, (method, task_id, answer.text)
        quoted = urllib.parse.quote(FORGING_ID, safe="")
        for method, path in (
            ("GET", f"/tasks/{quoted}"),
            ("POST", f"/tasks/{quoted}:cancel"),
            ("GET", f"/tasks/{quoted}:subscribe"),
        ):
            answer = http.request(method, base + path)
            assert answer.status_code == 404, (path, answer.text)
        # the store still answers: an id that could be a run's is looked up as before
        body = {"jsonrpc": "2.0", "id": 8, "method": "GetTask", "params": {"id": "run_absent"}}
        assert http.post(base, content=json.dumps(body).encode()).json()["error"]["code"] == -32001
    log = server.log.read_text()
    assert not [line for line in log.splitlines() if line.startswith("2026-01-01")], log
    assert "Traceback" not in log and "store could not" not in log, log


def test_no_value_of_a_request_starts_a_line_of_the_server_log(
    serve_on_postgres: ServeProcess,
) -> None:
    """The A2A SDK logs a JSON-RPC request's id as it came: escaped on its way to the log,
    as every value any log call writes."""
    server = serve_on_postgres
    headers = {"Authorization": f"Bearer {server.admin}", **V1}
    request_id = "1\n2026-01-01 00:00:00,000 ERROR forged-by-the-id\r\x1b[2J"
    body = {"jsonrpc": "2.0", "id": request_id, "method": "NoSuchMethod", "params": {}}
    with httpx.Client(headers=headers, timeout=30) as http:
        answer = http.post(f"{server.url}/a2a/default/greeter", content=json.dumps(body))
    assert answer.json()["error"]["code"] == -32601

    def logged() -> bool:
        return "forged-by-the-id" in server.log.read_text()

    wait_for(logged, timeout=10, message="the refused request in the log")
    lines = server.log.read_text().splitlines()
    [line] = [line for line in lines if "forged-by-the-id" in line]
    assert "(ID: 1\\n2026-01-01 00:00:00,000 ERROR forged-by-the-id\\r\\x1b[2J)" in line, line
    assert not any("\x1b" in line or "\r" in line for line in lines)


# ----------------------------------------------------------------------------- public cards


@pytest.mark.parametrize("public", [True, False], ids=["public", "default"])
def test_a_public_card_is_served_without_a_token_and_the_full_card_needs_one(
    tmp_path: Path, public: bool
) -> None:
    live = LiveServer(tmp_path, workers=0)
    live.settings = dataclasses.replace(live.settings, a2a_public_cards=public)
    with live:
        with live.client(live.mint(NS, Role.ADMIN)) as admin:
            apply(admin, resources("greeter", ["{text: hi}"]))
        card_path = f"/a2a/{NS}/greeter/.well-known/agent-card.json"
        anonymous = httpx.get(live.url + card_path)
        absent = httpx.get(f"{live.url}/a2a/{NS}/nobody/.well-known/agent-card.json")
        forged = httpx.get(live.url + card_path, headers={"Authorization": "Bearer corral_x_y"})
        viewer = {"Authorization": f"Bearer {live.mint(NS, Role.VIEWER)}", **V1}
        with_token = httpx.get(live.url + card_path, headers=viewer)
        rpc_body = {"jsonrpc": "2.0", "id": 1, "method": "GetExtendedAgentCard", "params": {}}
        extended = httpx.post(f"{live.url}/a2a/{NS}/greeter", json=rpc_body, headers=viewer)
        rest = httpx.get(f"{live.url}/a2a/{NS}/greeter/extendedAgentCard", headers=viewer)
        rest_anonymous = httpx.get(f"{live.url}/a2a/{NS}/greeter/extendedAgentCard", headers=V1)

    assert forged.status_code == 401  # a token sent is judged, public or not
    assert rest_anonymous.status_code == 401
    assert with_token.status_code == 200
    if not public:
        assert (anonymous.status_code, absent.status_code) == (401, 401)
        assert extended.json()["error"]["code"] == -32007  # not configured
        assert not with_token.json()["capabilities"].get("extendedAgentCard")
        return
    assert absent.status_code == 404
    assert anonymous.status_code == 200, anonymous.text
    card = anonymous.json()
    assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
    assert card["capabilities"]["extendedAgentCard"] is True
    assert extended.json()["result"]["name"] == "greeter", extended.text
    assert rest.status_code == 200 and rest.json()["name"] == "greeter", rest.text
