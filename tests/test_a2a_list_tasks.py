"""A2A ``ListTasks`` on a real ``corral serve``: the official SDK client lists, pages and
filters an agent's tasks; hostile callers (forged page tokens, bad page sizes and
context ids, other namespaces and agents, the wrong role) get clear JSON-RPC errors,
never a 500 or a traceback.

A task is a run (see :mod:`corral.server.a2a_tasks`): what ``ListTasks`` answers is
checked against what the REST API says of the same runs.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.client.client import Client
from a2a.client.errors import A2AClientError
from a2a.types.a2a_pb2 import (
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError
from google.protobuf.json_format import MessageToDict

from a2a_clients import cancel_and_wait
from corral.core.runs import RunState
from corral.core.tokens import Role as TokenRole
from corral.runtime.agent_tokens import AgentTokenSigner
from corral.server.a2a_tasks import run_states, task_state
from server_harness import LiveServer, apply, echo_turn, resources

NS = "alpha"
V1 = {"A2A-Version": "1.0"}

AGENTS = [
    resources("pager", ["{text: paged}"]),
    resources("greeter", ["{text: hello there}"]),
    resources("sleeper", [echo_turn("zzz", seconds=30), "{text: woke}"]),
]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("home"), workers=4) as server:
        with server.client(server.mint(NS, TokenRole.ADMIN)) as admin:
            for yaml_text in AGENTS:
                apply(admin, yaml_text)
        # the same agent name in another namespace, with a task of its own
        with server.client(server.mint("beta", TokenRole.ADMIN)) as beta:
            apply(beta, resources("greeter", ["{text: beta's}"]))
            beta.post("/v1/tasks", json={"agent": "greeter", "input": "b"}).raise_for_status()
        yield server


@pytest.fixture
async def operator(live: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    token = live.mint(NS, TokenRole.OPERATOR)
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        yield http


def agent_url(live: LiveServer, agent: str, namespace: str = NS) -> str:
    return f"{live.url}/a2a/{namespace}/{agent}"


async def sdk_client(live: LiveServer, http: httpx.AsyncClient, agent: str) -> Client:
    return await ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create_from_url(
        agent_url(live, agent)
    )


def text_message(text: str, context_id: str = "", wait: bool = True) -> SendMessageRequest:
    message = Message(message_id=uuid.uuid4().hex, role=Role.ROLE_USER, context_id=context_id)
    message.parts.append(Part(text=text))
    request = SendMessageRequest(message=message)
    request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=not wait))
    return request


async def send(client: Client, request: SendMessageRequest) -> Task:
    [response] = [event async for event in client.send_message(request)]
    assert response.HasField("task"), response
    return response.task


async def conversation(client: Client, turns: int, wait: bool = True) -> list[Task]:
    """``turns`` tasks in one new context, oldest first."""
    tasks = [await send(client, text_message("turn 0", wait=wait))]
    for turn in range(1, turns):
        tasks.append(await send(client, text_message(f"turn {turn}", tasks[0].context_id, wait)))
    return tasks


async def list_all(client: Client, request: ListTasksRequest) -> list[ListTasksResponse]:
    """Every page of a listing, following ``next_page_token``."""
    pages = [await client.list_tasks(request)]
    while pages[-1].next_page_token:
        assert len(pages) < 50, "the listing does not end"
        follow = ListTasksRequest()
        follow.CopyFrom(request)
        follow.page_token = pages[-1].next_page_token
        pages.append(await client.list_tasks(follow))
    return pages


# ----------------------------------------------------------------------------- listing


async def test_the_sdk_pages_through_a_context_newest_first_each_task_once(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    client = await sdk_client(live, operator, "pager")
    tasks = await conversation(client, 7)
    context = tasks[0].context_id

    first = await client.list_tasks(ListTasksRequest(context_id=context, page_size=3))
    late = await send(client, text_message("late", context))  # arrives mid-listing
    follow = ListTasksRequest(context_id=context, page_size=3, page_token=first.next_page_token)
    pages = [first, *await list_all(client, follow)]

    assert [len(p.tasks) for p in pages] == [3, 3, 1]
    assert [p.total_size for p in pages] == [7, 8, 8]  # counted when each page was read
    assert [p.page_size for p in pages] == [3, 3, 3]
    listed = [t.id for p in pages for t in p.tasks]
    # newest first, none twice, none missed; the late one is before the first page's cursor
    assert listed == [t.id for t in reversed(tasks)]
    assert late.id not in listed
    assert {t.context_id for p in pages for t in p.tasks} == {context}
    # the same runs, in the same order, as the REST API lists them
    rest = (await operator.get(f"{live.url}/v1/tasks", params={"agent": "pager"})).json()
    assert [t["id"] for t in rest["items"] if t["session_id"] == context] == [late.id, *listed]


async def test_a_listing_is_the_agents_tasks_in_its_namespace_only(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    greeter = await sdk_client(live, operator, "greeter")
    mine = await conversation(greeter, 2)
    await conversation(await sdk_client(live, operator, "pager"), 1)

    pages = await list_all(greeter, ListTasksRequest(page_size=100))

    listed = [t for p in pages for t in p.tasks]
    assert {t.id for t in mine} <= {t.id for t in listed}
    assert {MessageToDict(t.metadata)["corral"]["agent"] for t in listed} == {"greeter"}
    rest = (await operator.get(f"{live.url}/v1/tasks", params={"agent": "greeter"})).json()
    assert [t.id for t in listed] == [t["id"] for t in rest["items"]]  # not beta's greeter's
    assert pages[0].total_size == len(listed)
    assert pages[-1].next_page_token == ""


async def test_the_default_page_is_50_and_tasks_come_without_artifacts_unless_asked(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    client = await sdk_client(live, operator, "greeter")
    [task] = await conversation(client, 1)
    context = task.context_id

    plain = await client.list_tasks(ListTasksRequest(context_id=context))
    full = await client.list_tasks(ListTasksRequest(context_id=context, include_artifacts=True))
    short = await client.list_tasks(ListTasksRequest(context_id=context, history_length=0))

    assert plain.page_size == 50
    assert not plain.tasks[0].artifacts
    assert [p.text for p in full.tasks[0].artifacts[0].parts] == ["hello there"]
    assert [m.parts[0].text for m in plain.tasks[0].history] == ["turn 0", "hello there"]
    assert not short.tasks[0].history


async def test_the_status_filter_maps_back_to_run_states(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    greeter = await sdk_client(live, operator, "greeter")
    # greeter's script has one turn: the second task of a conversation fails
    done, failed = await conversation(greeter, 2)
    assert (done.status.state, failed.status.state) == (
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
    )
    sleeper = await sdk_client(live, operator, "sleeper")
    [cancelled] = await conversation(sleeper, 1, wait=False)
    await cancel_and_wait(sleeper, cancelled.id)

    async def ids(client: Client, context: str, state: TaskState) -> list[str]:
        pages = await list_all(client, ListTasksRequest(context_id=context, status=state))
        assert pages[0].total_size == sum(len(p.tasks) for p in pages)
        listed = [t for p in pages for t in p.tasks]
        assert {t.status.state for t in listed} <= {state}
        return [t.id for t in listed]

    context = done.context_id
    assert await ids(greeter, context, TaskState.TASK_STATE_COMPLETED) == [done.id]
    assert await ids(greeter, context, TaskState.TASK_STATE_FAILED) == [failed.id]
    unfiltered = await greeter.list_tasks(ListTasksRequest(context_id=context))
    assert [t.id for t in unfiltered.tasks] == [failed.id, done.id]
    canceled = TaskState.TASK_STATE_CANCELED
    assert await ids(sleeper, cancelled.context_id, canceled) == [cancelled.id]
    assert await ids(sleeper, cancelled.context_id, TaskState.TASK_STATE_WORKING) == []
    # a state no Corral run takes lists nothing
    nothing = await greeter.list_tasks(ListTasksRequest(status=TaskState.TASK_STATE_INPUT_REQUIRED))
    assert (list(nothing.tasks), nothing.total_size, nothing.next_page_token) == ([], 0, "")


async def test_status_timestamp_after_lists_tasks_whose_status_is_that_recent(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    client = await sdk_client(live, operator, "pager")
    tasks = await conversation(client, 3)
    context = tasks[0].context_id

    def after(moment: datetime) -> ListTasksRequest:
        request = ListTasksRequest(context_id=context)
        request.status_timestamp_after.FromDatetime(moment)
        return request

    newest = tasks[-1].status.timestamp.ToDatetime(tzinfo=UTC)
    # a task's own status timestamp lists it ("at or after")
    listed = await client.list_tasks(after(newest))
    assert tasks[-1].id in [t.id for t in listed.tasks]
    assert all(t.status.timestamp.ToDatetime(tzinfo=UTC) >= newest for t in listed.tasks)
    assert listed.total_size == len(listed.tasks)
    oldest = tasks[0].status.timestamp.ToDatetime(tzinfo=UTC)
    assert len((await client.list_tasks(after(oldest))).tasks) == 3
    future = await client.list_tasks(after(datetime.now(UTC) + timedelta(days=1)))
    assert (list(future.tasks), future.total_size) == ([], 0)


async def test_a_viewer_may_list_tasks(live: LiveServer, operator: httpx.AsyncClient) -> None:
    [task] = await conversation(await sdk_client(live, operator, "greeter"), 1)
    headers = {"Authorization": f"Bearer {live.mint(NS, TokenRole.VIEWER)}"}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        viewer = await sdk_client(live, http, "greeter")
        listed = await viewer.list_tasks(ListTasksRequest(context_id=task.context_id))
    assert [t.id for t in listed.tasks] == [task.id]


# ----------------------------------------------------------------------------- hostile


def rpc(params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": params}


def token_of(position: Any) -> str:
    """A page token as the server makes them, around any JSON: a forger's."""
    text = json.dumps(position) if not isinstance(position, str) else position
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.fixture
def clean_log(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.INFO)
    yield
    loud = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not loud, [r.getMessage() for r in loud]


@pytest.mark.usefixtures("clean_log")
@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"pageToken": "!!not base64!!"}, "pageToken"),
        ({"pageToken": "abc"}, "pageToken"),
        ({"pageToken": token_of(["run_x", 1.0])}, "pageToken"),
        ({"pageToken": token_of({"ts": 1, "id": "run_x"})}, "pageToken"),
        ({"pageToken": token_of('[1e999, "run_x"]')}, "pageToken"),
        ({"pageToken": token_of([-1.0, "run_x"])}, "pageToken"),
        ({"pageToken": token_of([1.0, "run\u0000x"])}, "pageToken"),
        ({"pageToken": token_of([1.0, "run \u00e9"])}, "pageToken"),
        ({"pageToken": token_of([1.0, "r" * 65])}, "pageToken"),
        ({"pageToken": token_of("[" * 5000)}, "pageToken"),
        ({"pageToken": "A" * 100_000}, "pageToken"),
        ({"pageToken": "\u00e9t\u00e9-\U0001f600"}, "pageToken"),
        ({"pageToken": "\ud800"}, ""),
        ({"pageSize": 0}, "minimum page size is 1"),
        ({"pageSize": -5}, "minimum page size is 1"),
        ({"pageSize": 101}, "maximum page size is 100"),
        ({"pageSize": 2**40}, ""),
        ({"pageSize": "many"}, ""),
        ({"historyLength": -1}, "history length"),
        ({"status": 99}, "not a task state"),
        # the SDK's parser would drop an unknown name and list unfiltered
        ({"status": "TASK_STATE_NOPE"}, "not a task state"),
        ({"status": "completed"}, "not a task state"),
        ({"status": ["TASK_STATE_WORKING"]}, ""),
        ({"contextId": "ctx-\u00e9t\u00e9"}, "contextId"),
        ({"contextId": "ctx\u0000"}, "contextId"),
        ({"contextId": "c" * 10_000}, "contextId"),
        ({"contextId": "\ud800"}, ""),
        ({"statusTimestampAfter": "yesterday"}, ""),
    ],
)
async def test_hostile_list_params_answer_invalid_params(
    live: LiveServer, operator: httpx.AsyncClient, params: dict[str, Any], says: str
) -> None:
    body = json.dumps(rpc(params))
    response = await operator.post(agent_url(live, "greeter"), content=body, headers=V1)

    assert response.status_code == 200, response.text
    error = response.json()["error"]
    assert error["code"] == -32602, error
    assert says in error["message"]
    assert "Traceback" not in response.text and len(response.text) < 2000


async def test_http_json_lists_pages_and_refuses_what_json_rpc_refuses(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    # GET tasks under the agent's base: the same listing, and the same refusals, as A2A's
    # REST errors (an unknown status name would otherwise list unfiltered)
    client = await sdk_client(live, operator, "pager")
    context = (await conversation(client, 3))[0].context_id
    url = f"{agent_url(live, 'pager')}/tasks"
    page = await operator.get(url, params={"contextId": context, "pageSize": 2}, headers=V1)
    assert page.status_code == 200, page.text
    first = page.json()
    assert (len(first["tasks"]), first["totalSize"]) == (2, 3)
    after = {"contextId": context, "pageSize": 2, "pageToken": first["nextPageToken"]}
    rest = (await operator.get(url, params=after, headers=V1)).json()
    assert len(rest["tasks"]) == 1 and not rest.get("nextPageToken")
    for params, says in (
        ({"status": "TASK_STATE_NOPE"}, "not a task state"),
        ({"status": "99"}, "not a task state"),
        ({"pageToken": "zzz"}, "pageToken"),
        ({"pageSize": "0"}, "minimum page size"),
        ({"contextId": "c" * 10_000}, "contextId"),
    ):
        response = await operator.get(url, params=params, headers=V1)
        assert response.status_code == 400, (params, response.text)
        assert says in response.json()["error"]["message"], response.text


async def test_a_well_formed_forged_token_is_only_a_position_in_the_callers_own_tasks(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    client = await sdk_client(live, operator, "greeter")
    await conversation(client, 1)
    ours = (await operator.get(f"{live.url}/v1/tasks")).json()

    forged = token_of([4_000_000_000.0, "zzz"])  # after every run there is
    listed = await client.list_tasks(ListTasksRequest(page_token=forged, page_size=100))

    agents = {MessageToDict(t.metadata)["corral"]["agent"] for t in listed.tasks}
    assert agents == {"greeter"}
    ids = {t["id"] for t in ours["items"] if t["agent"] == "greeter"}
    assert {t.id for t in listed.tasks} <= ids


async def test_the_sdk_client_raises_invalid_params_for_a_garbage_token(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    client = await sdk_client(live, operator, "greeter")

    with pytest.raises(InvalidParamsError, match="pageToken is not one this server issued"):
        await client.list_tasks(ListTasksRequest(page_token="garbage"))


async def test_another_namespace_lists_nothing_of_ours_and_no_token_is_refused(
    live: LiveServer,
) -> None:
    body = rpc({})
    foreign = {"Authorization": f"Bearer {live.mint('beta', TokenRole.VIEWER)}", **V1}
    async with httpx.AsyncClient(timeout=30) as http:
        assert (await http.post(agent_url(live, "greeter"), json=body)).status_code == 401
        # beta's token on alpha's agent: 404, as for every A2A method
        response = await http.post(agent_url(live, "greeter"), json=body, headers=foreign)
        assert (response.status_code, response.json()["code"]) == (404, "not_found")
        # beta's own greeter lists beta's task only, none of alpha's greeter's
        answer = await http.post(agent_url(live, "greeter", "beta"), json=body, headers=foreign)
    tasks = answer.json()["result"]["tasks"]
    assert [t["history"][0]["parts"][0]["text"] for t in tasks] == ["b"]
    assert answer.json()["result"]["totalSize"] == 1


async def test_an_unauthorised_role_cannot_send_but_the_listing_stays_read_only(
    live: LiveServer,
) -> None:
    headers = {"Authorization": f"Bearer {live.mint(NS, TokenRole.VIEWER)}", **V1}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        listed = await http.post(agent_url(live, "greeter"), json=rpc({"pageSize": 1}))
        assert listed.status_code == 200 and "result" in listed.json(), listed.text
        viewer = await sdk_client(live, http, "greeter")
        with pytest.raises(A2AClientError, match="403"):
            await send(viewer, text_message("hi"))


def test_each_task_state_filter_selects_the_run_states_shown_as_it() -> None:
    for state in TaskState.values():
        selected = run_states(state)
        if state == TaskState.TASK_STATE_UNSPECIFIED:
            assert selected is None
            continue
        assert selected is not None
        assert set(selected) == {run for run in RunState if task_state(run) == state}
    working = {RunState.RUNNING, RunState.WAITING_CHILDREN, RunState.WAITING_APPROVAL}
    assert set(run_states(TaskState.TASK_STATE_WORKING) or []) == working
    failed = {RunState.FAILED, RunState.DEAD_LETTER}
    assert set(run_states(TaskState.TASK_STATE_FAILED) or []) == failed
    assert run_states(TaskState.TASK_STATE_AUTH_REQUIRED) == []
    with pytest.raises(InvalidParamsError, match="not a task state"):
        run_states(TaskState.ValueType(99))


async def test_an_agent_token_may_not_list_tasks(live: LiveServer) -> None:
    """A run's agent token reaches ``/v1/links`` only, not the A2A routes of its agent."""
    token = AgentTokenSigner.from_settings(live.settings).mint(
        namespace=NS, agent="greeter", run_id="run_x", links=["pager"]
    )
    headers = {"Authorization": f"Bearer {token}", **V1}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        response = await http.post(agent_url(live, "greeter"), json=rpc({}))
    assert (response.status_code, response.json()["code"]) == (403, "agent_token_not_allowed")


@pytest.mark.usefixtures("clean_log")
async def test_a_method_or_id_of_another_json_type_is_a_json_rpc_error(
    live: LiveServer, operator: httpx.AsyncClient
) -> None:
    for body in (
        {"jsonrpc": "2.0", "id": 1, "method": ["ListTasks"], "params": {}},
        {"jsonrpc": "2.0", "id": 1, "method": {"ListTasks": 1}, "params": {}},
        {"jsonrpc": "2.0", "id": [1], "method": "ListTasks", "params": {"status": "NOPE"}},
        {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": ["status"]},
    ):
        response = await operator.post(agent_url(live, "greeter"), json=body, headers=V1)
        assert response.status_code == 200, response.text
        assert response.json()["error"]["code"] in (-32600, -32602), response.text
