"""Corral's agents as A2A servers, driven by the official ``a2a-sdk`` client over real HTTP.

A real ``corral serve`` (uvicorn, embedded worker, SQLite) serves each agent at
``/a2a/{namespace}/{agent}``; the SDK resolves the card there and speaks JSON-RPC
(spec 1.0; a raw 0.3 ``message/send`` is served too), or HTTP+JSON at the same base.
Runs are A2A tasks: the tests check the card, ``SendMessage`` (text and data output, a
failed run as a failed task with its stable code), ``SendStreamingMessage``,
``GetTask``, ``CancelTask``, the bearer auth and roles, other namespaces, and the
hostile inputs of both bindings.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.client.client import Client
from a2a.client.errors import A2AClientError, AgentCardResolutionError
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.constants import TransportProtocol
from a2a.utils.errors import (
    ContentTypeNotSupportedError,
    InternalError,
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict

from a2a_clients import cancel_and_wait
from corral.core.tokens import Role as TokenRole
from corral.server.a2a_tasks import internal_errors
from server_harness import LiveServer, apply, echo_turn, resources

NS = "alpha"
MAX_BODY = 64 * 1024

AGENTS = [
    resources("greeter", ["{text: hello there}"]),
    resources("worker", [echo_turn("tool says hi", seconds=0.2), "{text: done working}"]),
    resources("sleeper", [echo_turn("zzz", seconds=30), "{text: woke}"]),
    # one turn only: its second model call fails the run
    resources("broken", [echo_turn("x")]),
    resources("asker", [echo_turn("x"), "{text: done}"], approval="always"),
    resources("chatty", ["{text: one}", "{text: two}"]),
    resources(
        "structured", ["{text: '{\"answer\": 42}'}"], extra="  output_schema: {type: object}"
    ),
]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("home"), workers=4, max_body_bytes=MAX_BODY) as server:
        with server.client(server.mint(NS, TokenRole.ADMIN)) as admin:
            for yaml_text in AGENTS:
                apply(admin, yaml_text)
        yield server


def agent_url(live: LiveServer, agent: str, namespace: str = NS) -> str:
    return f"{live.url}/a2a/{namespace}/{agent}"


@pytest.fixture
async def operator(live: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    token = live.mint(NS, TokenRole.OPERATOR)
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        yield http


async def sdk_client(
    live: LiveServer, http: httpx.AsyncClient, agent: str, *, streaming: bool = False
) -> Client:
    factory = ClientFactory(ClientConfig(httpx_client=http, streaming=streaming))
    return await factory.create_from_url(agent_url(live, agent))


def text_message(text: str, message_id: str = "", **fields: str) -> SendMessageRequest:
    message = Message(message_id=message_id or f"m-{text[:20]}-{id(fields)}", role=Role.ROLE_USER)
    message.parts.append(Part(text=text))
    for name, value in fields.items():
        setattr(message, name, value)
    return SendMessageRequest(message=message)


async def send(client: Client, request: SendMessageRequest) -> list[StreamResponse]:
    return [event async for event in client.send_message(request)]


async def only_task(client: Client, request: SendMessageRequest) -> Task:
    [response] = await send(client, request)
    assert response.HasField("task"), response
    return response.task


# ----------------------------------------------------------------------------- the card


async def test_the_sdk_resolves_the_card_of_an_agent_with_bearer_auth_and_streaming(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    card = await A2ACardResolver(operator, agent_url(live, "greeter")).get_agent_card()

    assert card.name == "greeter"
    interfaces = [
        (i.url, i.protocol_binding, i.protocol_version) for i in card.supported_interfaces
    ]
    url = agent_url(live, "greeter")
    assert interfaces == [
        (url, "JSONRPC", "1.0"),
        (url, "JSONRPC", "0.3"),
        (url, "HTTP+JSON", "1.0"),
    ]
    assert card.capabilities.streaming and not card.capabilities.push_notifications
    assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
    assert list(card.security_requirements[0].schemes) == ["bearer"]
    # 0.3 clients read the legacy fields the SDK adds to the same card
    raw = (await operator.get(f"{agent_url(live, 'greeter')}/.well-known/agent-card.json")).json()
    assert (raw["url"], raw["preferredTransport"]) == (agent_url(live, "greeter"), "JSONRPC")


async def test_a_card_needs_a_token_of_the_agents_namespace(live: LiveServer) -> None:
    path = "/.well-known/agent-card.json"
    async with httpx.AsyncClient(timeout=30) as anonymous:
        response = await anonymous.get(agent_url(live, "greeter") + path)
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
        with pytest.raises(AgentCardResolutionError) as caught:
            await ClientFactory(ClientConfig(httpx_client=anonymous)).create_from_url(
                agent_url(live, "greeter")
            )
        assert caught.value.status_code == 401
    foreign = live.mint("beta", TokenRole.ADMIN)
    headers = {"Authorization": f"Bearer {foreign}"}
    async with httpx.AsyncClient(headers=headers, timeout=30) as other:
        for url in (
            agent_url(live, "greeter"),
            agent_url(live, "nobody"),
            agent_url(live, "greeter", "beta"),
        ):
            response = await other.get(url + path)
            assert (response.status_code, response.json()["code"]) == (404, "not_found"), url
            assert NS not in response.text or url.endswith(f"/{NS}/nobody") is False


# ----------------------------------------------------------------------------- SendMessage


async def test_send_message_runs_the_agent_and_answers_a_completed_task_with_its_output(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    client = await sdk_client(live, operator, "greeter")
    task = await only_task(client, text_message("hi"))

    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    [artifact] = task.artifacts
    assert [p.text for p in artifact.parts] == ["hello there"]
    assert task.context_id  # a session was opened for the conversation
    # the task is the Corral run
    detail = (await operator.get(f"{live.url}/v1/tasks/{task.id}")).json()
    assert (detail["agent"], detail["state"], detail["input"]) == ("greeter", "succeeded", "hi")
    assert detail["session_id"] == task.context_id


async def test_json_output_is_a_data_part(live: LiveServer, operator: httpx.AsyncClient) -> None:
    client = await sdk_client(live, operator, "structured")
    task = await only_task(client, text_message("answer"))

    assert task.status.state == TaskState.TASK_STATE_COMPLETED, task.status
    [part] = task.artifacts[0].parts
    assert (MessageToDict(part)["data"], part.media_type) == ({"answer": 42}, "application/json")


async def test_the_same_message_id_twice_is_one_run(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    client = await sdk_client(live, operator, "greeter")
    first = await only_task(client, text_message("hi", message_id="retry-1"))
    again = await only_task(client, text_message("hi", message_id="retry-1"))

    assert first.id == again.id


async def test_a_failed_run_is_a_failed_task_with_its_stable_error_code(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    client = await sdk_client(live, operator, "broken")
    task = await only_task(client, text_message("go"))

    assert task.status.state == TaskState.TASK_STATE_FAILED
    run = (await operator.get(f"{live.url}/v1/tasks/{task.id}")).json()
    code = run["error"]["code"]
    [part] = task.status.message.parts
    assert part.text.startswith(f"{code}: ")
    assert MessageToDict(task.status.message.metadata)["error"]["code"] == code


async def test_a_run_waiting_for_approval_answers_a_working_task_that_says_so(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    client = await sdk_client(live, operator, "asker")
    task = await only_task(client, text_message("please"))

    assert task.status.state == TaskState.TASK_STATE_WORKING
    assert "waiting for a human to approve echo" in task.status.message.parts[0].text


async def test_file_and_data_parts_are_refused_with_a_clear_error(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    client = await sdk_client(live, operator, "greeter")
    request = text_message("see attached")
    request.message.parts.append(
        Part(url="https://example.com/x.pdf", media_type="application/pdf")
    )

    with pytest.raises(ContentTypeNotSupportedError, match="part 1 is url"):
        await send(client, request)


# ----------------------------------------------------------------------------- streaming


async def test_send_streaming_message_streams_the_runs_events_then_the_outcome(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    client = await sdk_client(live, operator, "worker", streaming=True)
    events = await send(client, text_message("work"))

    assert events[0].HasField("task")
    task_id = events[0].task.id
    updates = [e.status_update for e in events if e.HasField("status_update")]
    corral_events = [MessageToDict(u.metadata).get("corral", {}).get("event") for u in updates]
    assert corral_events[0] == "run.start"
    assert {"tool.call", "tool.result", "run.finish"} <= set(corral_events)
    assert "calling echo" in [
        u.status.message.parts[0].text for u in updates if u.status.message.parts
    ]
    [artifact] = [e.artifact_update for e in events if e.HasField("artifact_update")]
    assert [p.text for p in artifact.artifact.parts] == ["done working"]
    assert updates[-1].status.state == TaskState.TASK_STATE_COMPLETED
    assert {u.task_id for u in updates} == {task_id}


# ----------------------------------------------------------------------------- tasks


async def test_get_task_and_cancel_task_map_to_the_run(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    client = await sdk_client(live, operator, "sleeper")
    request = text_message("sleep")
    request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
    task = await only_task(client, request)
    assert task.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)

    got = await client.get_task(GetTaskRequest(id=task.id))
    assert got.id == task.id and got.history[0].parts[0].text == "sleep"
    await cancel_and_wait(client, task.id)
    with pytest.raises(TaskNotCancelableError, match="already cancelled"):
        await client.cancel_task(CancelTaskRequest(id=task.id))


async def test_cancel_task_of_a_running_task_answers_at_once_that_the_cancel_is_requested(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    client = await sdk_client(live, operator, "sleeper")
    request = text_message("sleep until cancelled")
    request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
    task = await only_task(client, request)
    with anyio.fail_after(30):  # running: its tool sleeps 30 s
        while (await client.get_task(GetTaskRequest(id=task.id))).status.state != (
            TaskState.TASK_STATE_WORKING
        ):
            await anyio.sleep(0.05)

    answer = await client.cancel_task(CancelTaskRequest(id=task.id))

    # not waited for: the run stops at its worker's next heartbeat, seconds later
    assert answer.status.state == TaskState.TASK_STATE_WORKING, answer.status
    assert answer.status.message.parts[0].text == "cancel requested"
    assert (await cancel_and_wait(client, task.id)).status.state == TaskState.TASK_STATE_CANCELED


async def test_tasks_of_another_agent_or_namespace_are_not_found(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    greeter = await sdk_client(live, operator, "greeter")
    task = await only_task(greeter, text_message("hi"))
    worker = await sdk_client(live, operator, "worker")

    with pytest.raises(TaskNotFoundError):
        await worker.get_task(GetTaskRequest(id=task.id))
    with pytest.raises(TaskNotFoundError):
        await greeter.get_task(GetTaskRequest(id="run_nope"))
    with pytest.raises(TaskNotFoundError):
        await worker.cancel_task(CancelTaskRequest(id=task.id))


# ----------------------------------------------------------------------------- auth


async def test_a_viewer_reads_tasks_but_may_not_send_or_cancel(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    task = await only_task(await sdk_client(live, operator, "greeter"), text_message("hi"))
    viewer_token = live.mint(NS, TokenRole.VIEWER)
    headers = {"Authorization": f"Bearer {viewer_token}"}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        viewer = await sdk_client(live, http, "greeter")
        assert (await viewer.get_task(GetTaskRequest(id=task.id))).id == task.id
        with pytest.raises(A2AClientError, match="403"):
            await send(viewer, text_message("hi"))
        with pytest.raises(A2AClientError, match="403"):
            await viewer.cancel_task(CancelTaskRequest(id=task.id))
        raw = await http.post(
            agent_url(live, "greeter"),
            json={"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {}},
        )
        assert (raw.status_code, raw.json()["code"]) == (403, "forbidden")


async def test_no_token_a_bad_token_and_a_foreign_token_are_refused(live: LiveServer) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}
    async with httpx.AsyncClient(timeout=30) as http:
        assert (await http.post(agent_url(live, "greeter"), json=body)).status_code == 401
        bad = {"Authorization": "Bearer corral_nope_nope"}
        assert (
            await http.post(agent_url(live, "greeter"), json=body, headers=bad)
        ).status_code == 401
        foreign = {"Authorization": f"Bearer {live.mint('beta', TokenRole.ADMIN)}"}
        response = await http.post(agent_url(live, "greeter"), json=body, headers=foreign)
        assert (response.status_code, response.json()["code"]) == (404, "not_found")
        assert NS not in response.text.replace(f"/a2a/{NS}/", "")


# ----------------------------------------------------------------------------- hostile


async def test_malformed_json_rpc_answers_json_rpc_errors_and_the_server_serves_on(
    live: LiveServer, operator: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="a2a")
    url = agent_url(live, "greeter")
    headers = {"A2A-Version": "1.0"}

    async def error_of(content: str) -> dict[str, object]:
        response = await operator.post(url, content=content, headers=headers)
        assert response.status_code == 200, response.text
        error: dict[str, object] = response.json()["error"]
        assert "Traceback" not in response.text
        return error

    assert (await error_of("{not json"))["code"] == -32700
    assert (await error_of("[]"))["code"] == -32600
    assert (await error_of('{"jsonrpc": "1.0", "id": 1, "method": "GetTask"}'))["code"] == -32600
    unknown = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "DropTables", "params": {}})
    assert (await error_of(unknown))["code"] == -32601
    bad_params = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": 7}})
    assert (await error_of(bad_params))["code"] == -32602
    nested = '{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": ' + "[" * 50_000
    assert (await error_of(nested))["code"] == -32700
    empty = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {"message": {"messageId": "e", "role": "ROLE_USER", "parts": [{"text": " "}]}},
    }
    assert (await error_of(json.dumps(empty)))["code"] == -32602
    nul = json.loads(json.dumps(empty))
    nul["params"]["message"]["parts"] = [{"text": "a\u0000b"}]
    assert (await error_of(json.dumps(nul)))["code"] == -32602
    long_id = json.loads(json.dumps(empty))
    long_id["params"]["message"] |= {"messageId": "m" * 201, "parts": [{"text": "x"}]}
    assert (await error_of(json.dumps(long_id)))["code"] == -32602
    data_part = json.loads(json.dumps(empty))
    data_part["params"]["message"]["parts"] = [{"data": {"a": 1}}]
    assert (await error_of(json.dumps(data_part)))["code"] == -32005
    # over the API's body limit: the API's 413, before any JSON-RPC is read
    huge = json.dumps({**empty, "params": {"message": {"parts": [{"text": "x" * (MAX_BODY + 1)}]}}})
    response = await operator.post(url, content=huge, headers=headers)
    assert (response.status_code, response.json()["code"]) == (413, "payload_too_large")
    client = await sdk_client(live, operator, "greeter")
    assert (await only_task(client, text_message("still there?"))).status.state == (
        TaskState.TASK_STATE_COMPLETED
    )
    # A client's malformed request is one warning line in the log, never a traceback.
    sdk = [r for r in caplog.records if r.name.startswith("a2a.")]
    assert any("a malformed A2A request" in r.getMessage() for r in sdk), sdk
    assert not [r for r in sdk if r.exc_info or r.levelno >= logging.ERROR], sdk


async def test_a_json_rpc_0_3_message_send_is_served_too(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": "legacy",
        "method": "message/send",
        "params": {
            "message": {
                "kind": "message",
                "messageId": "legacy-1",
                "role": "user",
                "parts": [{"kind": "text", "text": "hi from 0.3"}],
            }
        },
    }
    response = await operator.post(agent_url(live, "greeter"), json=body)

    result = response.json()["result"]
    assert (result["kind"], result["status"]["state"]) == ("task", "completed")
    assert result["artifacts"][0]["parts"][0]["text"] == "hello there"


async def test_a_follow_up_in_the_same_context_continues_the_session(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    client = await sdk_client(live, operator, "chatty")
    first = await only_task(client, text_message("first"))
    second = await only_task(client, text_message("second", context_id=first.context_id))

    assert second.context_id == first.context_id
    assert [a.parts[0].text for a in (*first.artifacts, *second.artifacts)] == ["one", "two"]
    messages = (await operator.get(f"{live.url}/v1/sessions/{first.context_id}/messages")).json()
    assert [m["message"]["content"] for m in messages["items"]] == ["first", "one", "second", "two"]
    # a context of another agent is refused, not mixed into
    worker = await sdk_client(live, operator, "worker")
    with pytest.raises(InvalidParamsError, match="contextId"):
        await send(worker, text_message("intrude", context_id=first.context_id))


async def test_subscribe_to_task_follows_a_running_task_until_it_ends(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    client = await sdk_client(live, operator, "sleeper", streaming=True)
    request = text_message("sleep")
    request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
    sleeper = await sdk_client(live, operator, "sleeper")
    task = await only_task(sleeper, request)

    seen: list[StreamResponse] = []
    async for event in client.subscribe(SubscribeToTaskRequest(id=task.id)):
        seen.append(event)
        if len(seen) == 1:
            await sleeper.cancel_task(CancelTaskRequest(id=task.id))
    assert seen[0].task.id == task.id
    assert seen[-1].status_update.status.state == TaskState.TASK_STATE_CANCELED
    with pytest.raises(UnsupportedOperationError, match="has finished"):
        async for _ in client.subscribe(SubscribeToTaskRequest(id=task.id)):
            pass


async def test_a_protocol_version_it_does_not_speak_is_refused(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}
    response = await operator.post(
        agent_url(live, "greeter"), json=body, headers={"A2A-Version": "2.0"}
    )

    assert (response.status_code, response.json()["error"]["code"]) == (200, -32009)


def test_without_the_a2a_extra_the_routes_answer_501_and_a2a_tools_fail_clearly(
    tmp_path: Path,
) -> None:
    """``corral serve`` where ``import a2a`` fails, as without ``pip install 'corral[a2a]'``."""
    shadow = tmp_path / "shadow" / "a2a"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'a2a'\", name='a2a')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(
        CORRAL_HOME=str(tmp_path / "home"),
        PYTHONPATH=os.pathsep.join([str(shadow.parent), env.get("PYTHONPATH", "")]),
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "corral", "serve", "--port", str(port), "--workers", "1"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "corral serve did not start"
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        card = httpx.get(f"{url}/a2a/default/x/.well-known/agent-card.json")
        assert (card.status_code, card.json()["code"]) == (501, "a2a_unavailable")
        assert "corral[a2a]" in card.json()["detail"]
        token = (tmp_path / "home" / "admin.token").read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
            tool = """
apiVersion: corral/v1
kind: Tool
metadata: {name: remote}
spec: {type: a2a, a2a: {url: "https://agents.example/x"}}
"""
            apply(client, resources("needs-remote", ["{text: x}"]) + "---" + tool)
            client.post(
                "/v1/resources",
                content=resources("needs-remote", ["{text: x}"]).replace(
                    "tools: [echo]", "tools: [echo, remote]"
                ),
                headers={"Content-Type": "application/yaml"},
            ).raise_for_status()
            answer = client.post("/v1/agents/needs-remote/prompt", json={"input": "x"}).json()
        assert answer["state"] in ("failed", "dead_letter"), answer
        assert "corral[a2a]" in answer["error"]["message"], answer["error"]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


async def test_an_open_stream_ends_when_the_server_shuts_down(tmp_path: Path) -> None:
    live = LiveServer(tmp_path / "home", workers=1).start()
    stopped = False
    try:
        token = live.mint("default", TokenRole.OPERATOR)
        with live.client(live.admin) as admin:
            apply(admin, resources("sleeper", [echo_turn("zzz", seconds=30), "{text: woke}"]))
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(headers=headers, timeout=60) as http:
            factory = ClientFactory(ClientConfig(httpx_client=http, streaming=True))
            client = await factory.create_from_url(f"{live.url}/a2a/default/sleeper")
            seen: list[StreamResponse] = []
            with anyio.fail_after(30):
                try:
                    async for event in client.send_message(text_message("sleep")):
                        seen.append(event)
                        if len(seen) == 2:  # the task, then run.start: the run is going
                            await anyio.to_thread.run_sync(live.stop)
                            stopped = True
                except A2AClientError:
                    pass  # the connection closed under the stream: the client may resubscribe
        assert stopped and seen[0].HasField("task")
        assert TaskState.TASK_STATE_COMPLETED not in [
            e.status_update.status.state for e in seen if e.HasField("status_update")
        ]
    finally:
        if not stopped:
            live.stop()


def test_an_unexpected_failure_answers_a_plain_internal_error_and_keeps_details_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the SDK would answer str(exc) to the client: a driver's message, a path
    with pytest.raises(InternalError) as caught, internal_errors():
        raise RuntimeError("database at /srv/secret/corral.db is locked")

    assert caught.value.message == "internal error; see the server log"
    assert "/srv/secret" in caplog.text
    with pytest.raises(TaskNotFoundError), internal_errors():
        raise TaskNotFoundError("task 'x' not found")  # A2A errors pass as they are


# ----------------------------------------------------------------------------- HTTP+JSON

REST = TransportProtocol.HTTP_JSON.value


async def rest_client(
    live: LiveServer, http: httpx.AsyncClient, agent: str, *, streaming: bool = False
) -> Client:
    """An SDK client that speaks HTTP+JSON only."""
    config = ClientConfig(
        httpx_client=http, streaming=streaming, supported_protocol_bindings=[REST]
    )
    return await ClientFactory(config).create_from_url(agent_url(live, agent))


async def test_the_card_names_the_base_url_as_an_http_json_interface_too(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    raw = (await operator.get(f"{agent_url(live, 'greeter')}/.well-known/agent-card.json")).json()
    interfaces = [(i["url"], i["protocolBinding"]) for i in raw["supportedInterfaces"]]
    assert (agent_url(live, "greeter"), REST) in interfaces


async def test_send_stream_get_and_cancel_over_http_json(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    client = await rest_client(live, operator, "greeter")
    task = await only_task(client, text_message("hi over rest"))
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert [p.text for p in task.artifacts[0].parts] == ["hello there"]
    detail = (await operator.get(f"{live.url}/v1/tasks/{task.id}")).json()
    assert (detail["agent"], detail["input"]) == ("greeter", "hi over rest")

    streaming = await rest_client(live, operator, "worker", streaming=True)
    events = await send(streaming, text_message("work over rest"))
    assert events[0].HasField("task")
    updates = [e.status_update for e in events if e.HasField("status_update")]
    assert updates[-1].status.state == TaskState.TASK_STATE_COMPLETED

    sleeper = await rest_client(live, operator, "sleeper")
    request = text_message("sleep over rest")
    request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
    asleep = await only_task(sleeper, request)
    got = await sleeper.get_task(GetTaskRequest(id=asleep.id))
    assert got.id == asleep.id and got.history[0].parts[0].text == "sleep over rest"
    await cancel_and_wait(sleeper, asleep.id)
    with pytest.raises(TaskNotCancelableError):
        await sleeper.cancel_task(CancelTaskRequest(id=asleep.id))
    # another agent's task, or none at all: not found
    with pytest.raises(TaskNotFoundError):
        await sleeper.get_task(GetTaskRequest(id=task.id))
    with pytest.raises(TaskNotFoundError):
        await sleeper.get_task(GetTaskRequest(id="run_nope"))


async def test_a_viewer_reads_over_http_json_but_may_not_send_or_cancel(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    task = await only_task(await rest_client(live, operator, "greeter"), text_message("hi"))
    headers = {"Authorization": f"Bearer {live.mint(NS, TokenRole.VIEWER)}"}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        viewer = await rest_client(live, http, "greeter")
        assert (await viewer.get_task(GetTaskRequest(id=task.id))).id == task.id
        with pytest.raises(A2AClientError, match="403"):
            await send(viewer, text_message("hi"))
        with pytest.raises(A2AClientError, match="403"):
            await viewer.cancel_task(CancelTaskRequest(id=task.id))
        raw = await http.post(f"{agent_url(live, 'greeter')}/message:send", json={})
        assert (raw.status_code, raw.json()["code"]) == (403, "forbidden")


async def test_hostile_http_json_requests_get_clear_errors_and_the_server_serves_on(
    live: LiveServer, operator: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="a2a")
    base = agent_url(live, "greeter")
    headers = {"A2A-Version": "1.0", "Content-Type": "application/json"}

    async def refused(status: int, method: str, path: str, content: str | None = None) -> None:
        response = await operator.request(method, base + path, content=content, headers=headers)
        assert response.status_code == status, (path, response.text)
        assert "Traceback" not in response.text and response.json()["error"]["message"]

    await refused(400, "POST", "/message:send", "{not json")
    await refused(400, "POST", "/message:send", "[]")
    await refused(400, "POST", "/message:send", '{"message": ' + "[" * 50_000)
    await refused(400, "POST", "/message:send", '{"message": {"messageId": "e", "parts": []}}')
    data_part = '{"message": {"messageId": "d", "role": "ROLE_USER", "parts": [{"data": {}}]}}'
    await refused(400, "POST", "/message:send", data_part)
    await refused(404, "GET", "/tasks/run_nope")
    await refused(404, "GET", "/tasks/%F0%9F%90%8D%00x")
    await refused(404, "GET", "/tasks/" + "r" * 5000)
    await refused(404, "POST", "/tasks/run_nope:cancel")
    # what Corral does not offer: an A2A error saying so
    await refused(400, "POST", "/tasks/run_nope/pushNotificationConfigs", '{"url": "http://x"}')
    await refused(400, "GET", "/extendedAgentCard")
    # another namespace's agent, or an agent that does not exist: the API's 404
    for url in (f"{live.url}/a2a/beta/greeter/tasks/x", f"{live.url}/a2a/{NS}/nobody/tasks/x"):
        response = await operator.get(url)
        assert (response.status_code, response.json()["code"]) == (404, "not_found")
    client = await rest_client(live, operator, "greeter")
    assert (await only_task(client, text_message("still there?"))).status.state == (
        TaskState.TASK_STATE_COMPLETED
    )
    sdk = [r for r in caplog.records if r.name.startswith("a2a.")]
    assert not [r for r in sdk if r.exc_info or r.levelno >= logging.ERROR], sdk
