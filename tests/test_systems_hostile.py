"""Agent systems under attack: forged and late inbox deliveries, colliding idempotency
keys, outputs that lie, graphs that are too big or point at the wrong kind. Each test
names what must hold; the runs execute on real workers and real stores (``backend``:
SQLite, and PostgreSQL + NATS JetStream)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest

from backends import Backend, backend_fixture, deployment_fixture
from corral.bus.local import LocalBus
from corral.core.agent_messages import MessageState
from corral.core.errors import ConflictError, ResourceError
from corral.core.events import EventType
from corral.core.runs import RunState
from corral.core.settings import Settings
from corral.runtime import operations, system_runs
from corral.runtime.inbox import InboxConsumer
from corral.runtime.system_messages import deliver, message_id
from corral.runtime.worker import Worker
from corral.store import Store
from nats_servers import nats_prefix_fixture, nats_server_url_fixture
from server_harness import apply as http_apply
from systems_helpers import (
    agent,
    answering,
    apply,
    deliver_all,
    desk,
    gated,
    get,
    input_message,
    system,
)

__all__ = [
    "backend_fixture",
    "deployment_fixture",
    "nats_prefix_fixture",
    "nats_server_url_fixture",
]


async def drain(store: Store, settings: Settings, seconds: float = 30) -> None:
    worker = Worker(store, settings, bus=LocalBus(), poll_seconds=0.05)
    with anyio.fail_after(seconds):
        await worker.serve(anyio.Event(), until_idle=True)


async def test_a_late_inbox_delivery_for_a_cancelled_system_run_starts_no_node_run(
    env: tuple[Store, Settings],
) -> None:
    # a publish the coordinator made before the cancel, consumed after it (or a forged
    # publish of a message id that is still pending): the system run has ended
    store, _ = env
    await apply(store, *answering("solo", "an answer"), system("team", entry="solo"))
    run, _ = await system_runs.submit_system(store, "team", "hello")
    message = input_message(run.id, "solo")
    await store.add_agent_messages([message])
    await operations.cancel(store, run.id)
    bus = LocalBus()
    await bus.send_agent_message("default", "solo", message.id)
    await deliver_all(bus, InboxConsumer(store, bus))
    assert await store.list_children(run.id) == []
    stored = await store.get_agent_message(message.id)
    assert stored is not None and stored.state is MessageState.DEAD_LETTER
    assert stored.error is not None and "cancelled" in stored.error["message"]


async def test_a_task_holding_a_node_message_id_as_its_key_fails_the_system_not_parks_it(
    backend: Backend,
) -> None:
    # message ids are derived from the system run's id: an operator can submit a task of
    # the entry agent under the id of the system's first message before the system runs
    store = backend.store
    await apply(store, *answering("solo", "an answer", "another"), system("team", entry="solo"))
    run, _ = await system_runs.submit_system(store, "team", "hello", bus=backend.bus)
    squatter, _ = await operations.submit(
        store,
        "solo",
        "not the system's",
        idempotency_key=message_id(run.id, "input", "solo"),
        bus=backend.bus,
    )
    await backend.drain()
    done = await get(store, run)
    assert done.state is RunState.FAILED, done.state
    assert done.error is not None and done.error["code"] == "system_failed"
    assert squatter.id in done.error["message"]
    assert await store.list_children(run.id) == []


async def test_an_idempotency_key_of_an_agent_task_is_not_a_system_run_of_that_name(
    env: tuple[Store, Settings],
) -> None:
    # an Agent and an AgentSystem may share a name: their runs share the agent column
    store, _ = env
    await apply(store, *answering("team", "an answer"), system("team", entry="team"))
    task, _ = await operations.submit(store, "team", "an agent task", idempotency_key="k1")
    with pytest.raises(ConflictError) as raised:
        await system_runs.submit_system(store, "team", "a system run", idempotency_key="k1")
    assert task.id in raised.value.message
    # and the other way round: a system run's key (or a node run's) is no agent task's
    run, _ = await system_runs.submit_system(store, "team", "a system run", idempotency_key="k2")
    assert run.system == "team"
    with pytest.raises(ConflictError) as raised:
        await operations.submit(store, "team", "an agent task", idempotency_key="k2")
    assert run.id in raised.value.message
    again, created = await system_runs.submit_system(
        store, "team", "a system run", idempotency_key="k2"
    )
    assert (again.id, created) == (run.id, False)


async def test_a_by_output_route_naming_a_huge_agent_name_fails_with_a_bounded_error(
    env: tuple[Store, Settings],
) -> None:
    store, settings = env
    huge = "x" * 200_000
    await apply(
        store,
        *desk(f'{{"next": "{huge}", "topic": "t"}}'),
    )
    run, _ = await system_runs.submit_system(store, "desk", "hello")
    await drain(store, settings)
    done = await get(store, run)
    assert done.state is RunState.FAILED and done.error is not None
    assert done.error["code"] == "system_failed"
    assert "router" in done.error["message"] and len(done.error["message"]) < 1000


async def test_a_graph_naming_an_agent_system_as_a_node_is_refused(
    env: tuple[Store, Settings],
) -> None:
    store, _ = env
    await apply(store, *answering("solo", "an answer"), system("inner", entry="solo"))
    with pytest.raises(ResourceError) as raised:
        await apply(store, system("outer", entry="solo", graph={"solo": {"next": ["inner"]}}))
    assert "inner" in str(raised.value)


async def test_an_agent_removed_and_deleted_while_the_system_is_parked_fails_it_clearly(
    backend: Backend,
) -> None:
    # the run follows the graph its run.start recorded; the Agent it still needs is gone
    store = backend.store
    await apply(
        store,
        *gated(),
        *answering("end", "the end"),
        system("chain", entry="gated", graph={"gated": {"next": ["end"]}}),
    )
    run, _ = await system_runs.submit_system(store, "chain", "go", bus=backend.bus)
    await backend.drain()
    assert (await get(store, run)).state is RunState.WAITING_CHILDREN
    await apply(store, system("chain", entry="gated"))
    await store.delete_resource("default", "Agent", "end")
    (approval,) = await store.list_approvals(states=["pending"])
    await backend.decide(approval.id, True)
    await backend.drain()
    done = await get(store, run)
    assert done.state is RunState.FAILED and done.error is not None
    assert done.error["code"] == "system_failed" and "'end'" in done.error["message"]
    assert [c.agent for c in await store.list_children(run.id)] == ["gated"]


async def test_a_join_on_a_cycle_is_refused_it_would_run_once_and_drop_every_later_round(
    env: tuple[Store, Settings],
) -> None:
    store, _ = env
    await apply(store, *[d for n in "abcd" for d in answering(n, n)])
    graph = {
        "a": {"next": ["b", "c"]},
        "b": {"next": ["d"]},
        "c": {"next": ["d"]},
        "d": {"join": "all", "next": ["a"]},
    }
    for join in ("all", "first"):
        graph["d"]["join"] = join
        with pytest.raises(ResourceError) as raised:
            await apply(
                store,
                system("ring", entry="a", graph=graph, output="d", limits={"max_hops": 20}),
            )
        assert "spec.graph.d.join" in str(raised.value), str(raised.value)
    graph["d"]["join"] = "any"  # once per arrival: a cycle goes round
    await apply(store, system("ring", entry="a", graph=graph, output="d", limits={"max_hops": 20}))


async def test_a_forged_inbox_delivery_of_an_id_no_store_can_hold_is_settled_not_raised(
    backend: Backend,
) -> None:
    # a raw client publishing well-formed JSON on an inbox subject: the id is whatever it
    # likes (NUL, a lone surrogate, 100 kB); the consumer must settle it and keep serving
    bus = LocalBus()
    consumer = InboxConsumer(backend.store, bus)
    for forged in ("msg_\x00x", "msg_\ud800", "m" * 100_000, ""):
        await bus.send_agent_message("default", "solo", forged)
    await deliver_all(bus, consumer)
    assert await bus.take_agent_messages(10, 0.1) == []  # settled: never delivered again
    assert consumer.delivered == 0


SHARED_NAME = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: m}
spec: {provider: scripted, script: [{text: "an answer"}]}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: twin}
spec: {model: m}
---
apiVersion: corral/v1
kind: AgentSystem
metadata: {name: twin}
spec: {entry: twin}
"""


def test_an_agent_and_a_system_of_one_name_never_swap_tasks_over_http(
    client: httpx.Client,
) -> None:
    http_apply(client, SHARED_NAME)
    task = client.post(
        "/v1/tasks", json={"agent": "twin", "input": "x", "idempotency_key": "shared-1"}
    )
    assert task.status_code == 201, task.text
    refused = client.post(
        "/v1/systems/twin/tasks", json={"input": "x", "idempotency_key": "shared-1"}
    )
    assert refused.status_code == 409 and refused.json()["code"] == "conflict", refused.text
    assert task.json()["id"] in refused.json()["detail"]
    run = client.post("/v1/systems/twin/tasks", json={"input": "x", "idempotency_key": "shared-2"})
    assert run.status_code == 201 and run.json()["system"] == "twin", run.text
    refused = client.post(
        "/v1/tasks", json={"agent": "twin", "input": "x", "idempotency_key": "shared-2"}
    )
    assert refused.status_code == 409 and refused.json()["code"] == "conflict", refused.text
    # a task of one agent has no messages; a forged cursor of the right alphabet is a 422
    none = client.get(f"/v1/tasks/{task.json()['id']}/messages")
    assert none.status_code == 200 and none.json()["items"] == []
    for forged in ("WyJ4IiwxXQ", "WzEsMiwzXQ", "bnVsbA", "WzFlOTk5LCJ4Il0"):
        bad = client.get(f"/v1/tasks/{run.json()['id']}/messages", params={"cursor": forged})
        assert bad.status_code == 422 and bad.json()["code"] == "invalid_request", bad.text
    assert client.get("/v1/tasks").status_code == 200


async def test_a_fork_on_a_cycle_fails_clearly_before_its_branch_id_outgrows_the_store(
    env: tuple[Store, Settings],
) -> None:
    # each round forks (".2" more): past 255 characters PostgreSQL refused the message,
    # and the system run was retried until it ended a dead letter
    store, settings = env
    await apply(
        store,
        *answering("a", *["a"] * 200),
        *answering("b", *["b"] * 200),
        system(
            "grow",
            entry="a",
            graph={"a": {"next": ["b", "a"]}},
            output="b",
            limits={"max_hops": 1000, "max_messages": 10_000},
        ),
    )
    run, _ = await system_runs.submit_system(store, "grow", "go")
    await drain(store, settings, seconds=120)
    done = await get(store, run)
    assert done.state is RunState.FAILED and done.error is not None
    assert done.error["code"] == "system_failed", done.error
    assert "255" in done.error["message"] and "max_hops" in done.error["message"]
    messages = await store.list_agent_messages(run.id)
    assert max(len(m.branch_id) for m in messages) <= 255


async def test_a_by_output_route_naming_its_agent_a_thousand_times_sends_one_message(
    env: tuple[Store, Settings],
) -> None:
    store, settings = env
    schema = {"type": "object", "properties": {"next": {"type": "array"}}, "required": ["next"]}
    names = ", ".join(['"billing"'] * 1000)
    await apply(
        store,
        *desk(f'{{"next": [{names}]}}', schema),
    )
    run, _ = await system_runs.submit_system(store, "desk", "hello")
    await drain(store, settings)
    done = await get(store, run)
    assert (done.state, done.output) == (RunState.SUCCEEDED, "refunded"), done.error
    assert sorted(c.agent for c in await store.list_children(run.id)) == ["billing", "router"]
    assert len(await store.list_agent_messages(run.id)) == 2


async def test_a_delivery_that_read_its_system_run_before_a_cancel_starts_no_node_run(
    backend: Backend,
) -> None:
    # The interleaving of a delivery in flight: the system run was read (running, as its
    # coordinator holds it) before the cancel came, the node run is created after it.
    store = backend.store
    await apply(store, *answering("solo", "an answer"), system("team", entry="solo"))
    run, _ = await system_runs.submit_system(store, "team", "hello")
    [(read_before, _)] = await store.claim_runs("coordinator", 30.0, run_ids=[run.id])
    message = input_message(run.id, "solo")
    await store.add_agent_messages([message])
    await operations.cancel(store, run.id)
    with pytest.raises(ConflictError, match="being cancelled"):
        await deliver(store, backend.bus, message, parent=read_before)
    assert await store.list_children(run.id) == []
    stored = await store.get_agent_message(message.id)
    assert stored is not None and stored.state is MessageState.PENDING


async def test_a_system_run_cancelled_during_its_pass_ends_cancelled_with_no_node_run(
    env: tuple[Store, Settings],
) -> None:
    # The cancel lands between the worker's claim and the pass's delivery (before the
    # lease keeper's next renewal could see it): the store refuses the node run, and
    # the coordinator ends the run as a cancel does, not as a failure.
    store, settings = env
    await apply(store, *answering("solo", "an answer"), system("team", entry="solo"))
    run, _ = await system_runs.submit_system(store, "team", "hello")
    [(record, lease)] = await store.claim_runs("w", 30.0, run_ids=[run.id])
    await operations.cancel(store, run.id)
    executor = Worker(store, settings, bus=LocalBus()).executor
    async with executor:
        assert await executor.execute(record, lease, anyio.Event()) == "done"
    done = await get(store, run)
    assert done.state is RunState.CANCELLED, done.error
    assert await store.list_children(run.id) == []


@pytest.mark.parametrize(
    "position",
    [
        {"token": "one", "seq": 1, "messages": 0, "open": {}},
        {"token": 1, "seq": 1, "messages": 0, "open": 5},
        {"seq": 1},
        ["not", "a", "position"],
    ],
)
async def test_a_position_that_cannot_be_read_makes_the_pass_rebuild_from_the_store(
    env: tuple[Store, Settings], position: Any
) -> None:
    # (what the row holds is the coordinator's own, but a pass never trusts one it cannot
    # read, nor one saved under another claim: it reads the whole run, as after a crash)
    store, settings = env
    await apply(
        store,
        *answering("first", "one"),
        *answering("second", "two"),
        system("pair", entry="first", graph={"first": {"next": ["second"]}}),
    )
    run, _ = await system_runs.submit_system(store, "pair", "hello")
    [(record, lease)] = await store.claim_runs("w", 30.0, run_ids=[run.id])
    executor = Worker(store, settings, bus=LocalBus()).executor
    async with executor:
        assert await executor.execute(record, lease, anyio.Event()) == "done"  # (parked)
    parked = await get(store, run)
    assert parked.position is not None and parked.position["token"] == lease.token
    [(node, node_lease)] = await store.claim_runs("w", 30.0, 5)  # (the system run waits)
    assert node.agent == "first"
    async with executor:
        assert await executor.execute(node, node_lease, anyio.Event()) == "done"
    [(system_record, system_lease)] = await store.claim_runs("w", 30.0, run_ids=[run.id])
    system_record.position = position  # as if the row held it
    async with executor:
        assert await executor.execute(system_record, system_lease, anyio.Event()) == "done"
    await drain(store, settings)
    done = await get(store, run)
    assert done.state is RunState.SUCCEEDED and done.output == "two"
    events = await store.list_events(run.id)
    sent = [e.data.message_id for e in events if e.type is EventType.MESSAGE_SEND]
    finished = [e.data.run_id for e in events if e.type is EventType.CHILD_FINISH]
    assert len(sent) == len(set(sent)) == 2 and len(finished) == len(set(finished)) == 2


#: the scripted ModelEndpoint ``priced``: one turn that costs a dollar
PRICED_ONE_DOLLAR_TURN = json.dumps(
    {
        "apiVersion": "corral/v1",
        "kind": "ModelEndpoint",
        "metadata": {"name": "priced"},
        "spec": {
            "provider": "scripted",
            "pricing": {"input_per_million": 1_000_000.0},
            "script": [{"text": "costly", "input_tokens": 1}],
        },
    }
)


async def test_a_system_with_no_budget_stops_its_first_node_at_its_first_turn(
    env: tuple[Store, Settings],
) -> None:
    # max_cost_usd: 0 (allowed): the entry node is capped at $0 and its first priced turn
    # would pass it (so it is not made); the system fails on its budget, and nothing runs
    # after that node
    store, settings = env
    await apply(
        store,
        PRICED_ONE_DOLLAR_TURN,
        agent("first", "priced"),
        agent("second", "priced"),
        system(
            "broke",
            entry="first",
            graph={"first": {"next": ["second"]}},
            limits={"max_cost_usd": 0},
        ),
    )
    run, _ = await system_runs.submit_system(store, "broke", "hello")
    await drain(store, settings)
    done = await get(store, run)
    assert done.state is RunState.FAILED and done.error is not None
    assert done.error["limit"] == "max_cost_usd"
    [node] = await store.list_children(run.id)
    assert node.agent == "first" and node.max_cost_usd == 0.0
    assert node.error is not None and node.error["limit"] == "max_cost_usd"


async def test_a_node_stopped_by_its_agents_own_limit_fails_the_system_as_a_node_failure(
    env: tuple[Store, Settings],
) -> None:
    store, settings = env
    # the system has $100; first's own limit ($0.5) stops its only turn ($1): that is the
    # node's failure (system_failed), not the system's budget running out
    await apply(
        store,
        PRICED_ONE_DOLLAR_TURN,
        agent("first", "priced", limits={"max_cost_usd": 0.5}),
        agent("second", "priced"),
        system(
            "rich",
            entry="first",
            graph={"first": {"next": ["second"]}},
            limits={"max_cost_usd": 100},
        ),
    )
    run, _ = await system_runs.submit_system(store, "rich", "hello")
    await drain(store, settings)
    done = await get(store, run)
    assert done.state is RunState.FAILED and done.error is not None
    assert done.error["code"] == "system_failed" and done.cost_usd == 0.0
    [node] = await store.list_children(run.id)
    assert node.error is not None and node.error["limit"] == "max_cost_usd"
    assert "inherited" not in node.error
