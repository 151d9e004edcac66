"""Agent systems: graphs of agents run by the system run's coordinator, on real workers.

Every test runs twice (:mod:`backends`): on the embedded SQLite store, and on
PostgreSQL + NATS JetStream, where system runs, node runs and woken system runs
reach the worker only as NATS deliveries.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from backends import Backend, backend_fixture, deployment_fixture
from corral.core.agent_messages import MessageState
from corral.core.errors import ConflictError, NotFoundError, ResourceError
from corral.core.events import EventType
from corral.core.runs import RunState
from corral.core.settings import Settings
from corral.runtime import operations, system_runs
from corral.runtime.worker import Worker
from corral.store import Store
from durable_tools import GATES, Gate
from nats_servers import nats_prefix_fixture, nats_server_url_fixture
from systems_helpers import agent, answering, apply, call, desk, gated, get, model, system

__all__ = [
    "backend_fixture",
    "deployment_fixture",
    "nats_prefix_fixture",
    "nats_server_url_fixture",
]


TESTS = Path(__file__).parent

DIAMOND = dict(
    entry="planner",
    graph={
        "planner": {"next": ["researcher", "critic"]},
        "researcher": {"next": ["writer"]},
        "critic": {"next": ["writer"]},
        "writer": {"join": "all"},
    },
)


async def diamond(store: Store, **limits: Any) -> None:
    await apply(
        store,
        *answering("planner", "the plan"),
        *answering("researcher", "the facts"),
        *answering("critic", "the doubts"),
        *answering("writer", "the report"),
        system("team", **DIAMOND, **({"limits": limits} if limits else {})),
    )


async def test_a_fan_out_joined_by_all_gives_the_writer_both_outputs_once(
    backend: Backend,
) -> None:
    store = backend.store
    await diamond(store)
    run, created = await system_runs.submit_system(
        store, "team", "write about otters", bus=backend.bus
    )
    assert created and run.system == "team" and run.branch_id is None
    await backend.drain()

    done = await get(store, run)
    assert (done.state, done.output) == (RunState.SUCCEEDED, "the report"), done.error
    children = await store.list_children(run.id)
    by_agent = Counter(c.agent for c in children)
    assert by_agent == {"planner": 1, "researcher": 1, "critic": 1, "writer": 1}
    assert all(c.state is RunState.SUCCEEDED and c.system == "team" for c in children)
    branches = {c.agent: (c.branch_id, c.parent_branch_id) for c in children}
    assert branches == {
        "planner": ("1", None),
        "researcher": ("1.1", "1"),
        "critic": ("1.2", "1"),
        "writer": ("1", None),
    }
    (writer,) = [c for c in children if c.agent == "writer"]
    assert json.loads(writer.input) == {
        "inputs": [
            {"from": "critic", "branch_id": "1.2", "output": "the doubts"},
            {"from": "researcher", "branch_id": "1.1", "output": "the facts"},
        ]
    }
    # the node runs' spend is the system run's
    assert done.usage.input_tokens == 40 and done.usage.output_tokens == 8
    assert done.steps == 4

    messages = await store.list_agent_messages(run.id)
    kinds = Counter((m.type, m.to_agent) for m in messages)
    assert kinds == {
        ("input", "planner"): 1,
        ("output", "researcher"): 1,
        ("output", "critic"): 1,
        ("output", "writer"): 2,
        ("join", "writer"): 1,
    }
    assert all(m.state is MessageState.DONE for m in messages)
    assert max(m.hop for m in messages) == 2
    if backend.serving_worker is not None:  # NATS: the node runs came from inbox deliveries
        assert backend.serving_worker.inbox.delivered == 4
        assert all(m.attempt == 1 for m in messages if m.child_run_id is not None)

    events = await store.list_events(run.id)
    counts = Counter(e.type for e in events)
    assert counts[EventType.RUN_START] == counts[EventType.RUN_FINISH] == 1
    assert counts[EventType.MESSAGE_SEND] == 6
    assert counts[EventType.MESSAGE_DELIVER] == 4
    assert counts[EventType.CHILD_START] == counts[EventType.CHILD_FINISH] == 4
    assert counts[EventType.BRANCH_JOIN] == 1
    (join,) = [e.data.to_dict() for e in events if e.type is EventType.BRANCH_JOIN]
    assert (join["agent"], join["join"], len(join["inputs"]), join["dropped"]) == (
        "writer",
        "all",
        2,
        [],
    )
    assert events[-1].data.to_dict() == {"state": "succeeded", "output": "the report"}


async def test_route_by_output_sends_the_output_only_where_it_names(backend: Backend) -> None:
    store = backend.store
    await apply(
        store,
        *desk('{"next": "billing", "topic": "refund"}'),
    )
    run, _ = await system_runs.submit_system(store, "desk", "I want my money", bus=backend.bus)
    await backend.drain()
    done = await get(store, run)
    assert (done.state, done.output) == (RunState.SUCCEEDED, "refunded"), done.error
    agents = sorted(c.agent for c in await store.list_children(run.id))
    assert agents == ["billing", "router"]
    (billing,) = [c for c in await store.list_children(run.id) if c.agent == "billing"]
    assert json.loads(billing.input) == {"next": "billing", "topic": "refund"}
    assert billing.branch_id == "1"  # one target: the branch goes on


async def test_route_by_output_to_an_agent_not_in_next_fails_the_system(
    backend: Backend,
) -> None:
    store = backend.store
    await apply(
        store,
        *desk('{"next": "sales", "topic": "x"}'),
    )
    run, _ = await system_runs.submit_system(store, "desk", "hello", bus=backend.bus)
    await backend.drain()
    done = await get(store, run)
    assert done.state is RunState.FAILED
    assert done.error is not None and done.error["code"] == "system_failed"
    assert "'sales'" in done.error["message"] and "router" in done.error["message"]


async def test_join_first_runs_once_with_the_first_arrival_and_drops_the_other(
    backend: Backend,
) -> None:
    store = backend.store
    await apply(
        store,
        *answering("planner", "the plan"),
        *answering("researcher", "the facts"),
        *answering("critic", "the doubts"),
        *answering("writer", "the report"),
        system("team", **{**DIAMOND, "graph": {**DIAMOND["graph"], "writer": {"join": "first"}}}),
    )
    run, _ = await system_runs.submit_system(store, "team", "go", bus=backend.bus)
    await backend.drain()
    done = await get(store, run)
    assert (done.state, done.output) == (RunState.SUCCEEDED, "the report"), done.error
    writers = [c for c in await store.list_children(run.id) if c.agent == "writer"]
    assert len(writers) == 1
    (taken,) = json.loads(writers[0].input)["inputs"]
    assert taken["from"] in ("researcher", "critic")
    arrivals = [
        m
        for m in await store.list_agent_messages(run.id)
        if m.type == "output" and m.to_agent == "writer"
    ]
    dropped = [m for m in arrivals if m.error is not None]
    assert len(arrivals) == 2 and len(dropped) == 1
    assert dropped[0].error is not None and dropped[0].error["code"] == "dropped"
    assert dropped[0].from_agent != taken["from"]


async def test_join_any_runs_the_node_once_per_arrival(backend: Backend) -> None:
    store = backend.store
    await apply(
        store,
        *answering("planner", "the plan"),
        *answering("researcher", "the facts"),
        *answering("critic", "the doubts"),
        *answering("writer", "report one", "report two"),
        system(
            "team",
            **{**DIAMOND, "graph": {**DIAMOND["graph"], "writer": {"join": "any"}}},
        ),
    )
    run, _ = await system_runs.submit_system(store, "team", "go", bus=backend.bus)
    await backend.drain()
    done = await get(store, run)
    assert done.state is RunState.SUCCEEDED, done.error
    writers = [c for c in await store.list_children(run.id) if c.agent == "writer"]
    assert sorted(w.input for w in writers) == ["the doubts", "the facts"]
    assert done.output in ("report one", "report two")


PING_PONG = [
    *answering("ping", *["ping"] * 20),
    *answering("pong", *["pong"] * 20),
]


async def test_a_ping_pong_loop_is_stopped_by_max_hops(backend: Backend) -> None:
    store = backend.store
    await apply(
        store,
        *PING_PONG,
        system(
            "loop",
            entry="ping",
            graph={"ping": {"next": ["pong"]}, "pong": {"next": ["ping"]}},
            output="pong",
            limits={"max_hops": 5},
        ),
    )
    run, _ = await system_runs.submit_system(store, "loop", "serve", bus=backend.bus)
    await backend.drain()
    done = await get(store, run)
    assert done.state is RunState.FAILED
    assert done.error is not None
    assert (done.error["code"], done.error["limit"]) == ("budget_exceeded", "max_hops")
    assert "max_hops" in done.error["message"]
    assert len(await store.list_children(run.id)) == 6  # hops 0..5


async def test_a_200_hop_system_runs_each_hop_once_and_counts_every_node_runs_spend(
    env: tuple[Store, Settings],
) -> None:
    # Each pass reads what changed since the last (its position); 200 passes in a row
    # take every node run once, journal each step once and add up the spend of all.
    # (Embedded only: through NATS each hop waits for an inbox delivery, and 200 of them
    # in a row outlast a test; the passes are the same code on every store.)
    store, settings = env
    await apply(
        store,
        *PING_PONG,
        system(
            "rally",
            entry="ping",
            graph={"ping": {"next": ["pong"]}, "pong": {"next": ["ping"]}},
            output="pong",
            limits={"max_hops": 200, "max_messages": 300},
        ),
    )
    run, _ = await system_runs.submit_system(store, "rally", "serve")
    with anyio.fail_after(120):
        await Worker(store, settings, poll_seconds=0.05).serve(anyio.Event(), until_idle=True)
    done = await get(store, run)
    assert done.state is RunState.FAILED and done.error is not None
    assert (done.error["code"], done.error["limit"]) == ("budget_exceeded", "max_hops")
    children = await store.list_children(run.id)
    messages = await store.list_agent_messages(run.id)
    assert len(children) == len(messages) == 201  # hops 0..200
    assert sorted(m.hop for m in messages) == list(range(201))
    assert {m.child_run_id for m in messages} == {c.id for c in children}
    events = await store.list_events(run.id)
    for kind in (EventType.MESSAGE_SEND, EventType.MESSAGE_DELIVER, EventType.CHILD_FINISH):
        keyed = [
            e.data.to_dict().get("message_id") or e.data.run_id for e in events if e.type is kind
        ]
        assert len(keyed) == len(set(keyed)) == 201, kind
    assert done.steps == 201
    assert done.usage.input_tokens == sum(c.usage.input_tokens for c in children) == 201 * 10
    assert done.position is not None and done.position["messages"] == 201


async def test_a_ping_pong_loop_is_stopped_by_max_messages(backend: Backend) -> None:
    store = backend.store
    await apply(
        store,
        *PING_PONG,
        system(
            "loop",
            entry="ping",
            graph={"ping": {"next": ["pong"]}, "pong": {"next": ["ping"]}},
            output="pong",
            limits={"max_hops": 100, "max_messages": 3},
        ),
    )
    run, _ = await system_runs.submit_system(store, "loop", "serve", bus=backend.bus)
    await backend.drain()
    done = await get(store, run)
    assert done.state is RunState.FAILED and done.error is not None
    assert (done.error["code"], done.error.get("limit")) == (
        "budget_exceeded",
        "max_messages",
    ), done.error
    assert len(await store.list_agent_messages(run.id)) == 3


async def test_the_cost_of_the_node_runs_is_held_to_max_cost_usd(backend: Backend) -> None:
    store = backend.store
    priced = {"input_per_million": 1_000_000.0, "output_per_million": 0.0}
    await apply(
        store,
        json.dumps(
            {
                "apiVersion": "corral/v1",
                "kind": "ModelEndpoint",
                "metadata": {"name": "dear"},
                "spec": {
                    "provider": "scripted",
                    "pricing": priced,
                    "script": [{"text": "pricey", "input_tokens": 1}] * 10,
                },
            }
        ),
        agent("ping", "dear"),
        agent("pong", "dear"),
        system(
            "loop",
            entry="ping",
            graph={"ping": {"next": ["pong"]}, "pong": {"next": ["ping"]}},
            output="pong",
            limits={"max_hops": 100, "max_cost_usd": 2.5},
        ),
    )
    run, _ = await system_runs.submit_system(store, "loop", "serve", bus=backend.bus)
    await backend.drain()
    done = await get(store, run)
    assert done.state is RunState.FAILED and done.error is not None
    assert (done.error["code"], done.error["limit"]) == ("budget_exceeded", "max_cost_usd")
    # ping and pong at $1 each; the third node run's $1 turn would pass the $0.5 left
    assert done.cost_usd == 2.0


def priced(name: str, *turns: dict[str, Any]) -> str:
    """A scripted ModelEndpoint whose every input token costs $1."""
    pricing = {"input_per_million": 1_000_000.0, "output_per_million": 0.0}
    return json.dumps(
        {
            "apiVersion": "corral/v1",
            "kind": "ModelEndpoint",
            "metadata": {"name": name},
            "spec": {"provider": "scripted", "pricing": pricing, "script": list(turns)},
        }
    )


async def test_a_node_run_is_capped_by_what_the_system_has_left(backend: Backend) -> None:
    # cheap ($1) hands on to spender, whose run would take 5 turns at $1 each: given the
    # $1.5 the system has left as its own cap, it stops before its second turn (at $1),
    # and the system fails on its max_cost_usd at $2 - never past its $2.5.
    store = backend.store
    add = {"name": "add", "arguments": {"a": 2, "b": 3}}
    tool = {
        "apiVersion": "corral/v1",
        "kind": "Tool",
        "metadata": {"name": "add"},
        "spec": {"type": "python", "python": {"function": "agent_tools:add", "path": str(TESTS)}},
    }
    await apply(
        store,
        json.dumps(tool),
        priced("cheap-model", {"text": "go on", "input_tokens": 1}),
        agent("cheap", "cheap-model"),
        priced(
            "spender-model",
            *[{"tool_calls": [add], "input_tokens": 1}] * 4,
            {"text": "spent", "input_tokens": 1},
        ),
        agent("spender", "spender-model", tools=["add"], limits={"max_cost_usd": 100}),
        system(
            "budget",
            entry="cheap",
            graph={"cheap": {"next": ["spender"]}},
            limits={"max_cost_usd": 2.5},
        ),
    )
    run, _ = await system_runs.submit_system(store, "budget", "go", bus=backend.bus)
    await backend.drain()
    done = await get(store, run)
    assert done.state is RunState.FAILED and done.error is not None
    assert (done.error["code"], done.error.get("limit")) == ("budget_exceeded", "max_cost_usd")
    nodes = {c.agent: c for c in await store.list_children(run.id)}
    assert nodes["cheap"].max_cost_usd == 2.5 and nodes["cheap"].cost_usd == 1.0
    spender = nodes["spender"]
    assert spender.max_cost_usd == 1.5  # (the lower of its agent's 100 and what was left)
    assert spender.state is RunState.FAILED and spender.error is not None
    assert spender.error["limit"] == "max_cost_usd" and spender.cost_usd == 1.0
    assert spender.error["inherited"] is True  # the system's cap stopped it, not its own
    assert done.cost_usd == 2.0


async def test_node_runs_started_at_once_split_what_the_system_has_left(
    backend: Backend,
) -> None:
    # cheap ($1) fans out to left and right: each is capped at half of the $2 left, not at
    # all of it ($4 before their ends count); each spends its $1 and the system, at $3,
    # is within its limit
    store = backend.store
    await apply(
        store,
        priced("cheap-model", {"text": "go on", "input_tokens": 1}),
        priced("side-model", *[{"text": "half", "input_tokens": 1}] * 2),
        agent("cheap", "cheap-model"),
        agent("left", "side-model"),
        agent("right", "side-model"),
        system(
            "split",
            entry="cheap",
            graph={"cheap": {"next": ["left", "right"]}},
            output="left",
            limits={"max_cost_usd": 3.0},
        ),
    )
    run, _ = await system_runs.submit_system(store, "split", "go", bus=backend.bus)
    await backend.drain()
    done = await get(store, run)
    assert done.state is RunState.SUCCEEDED, done.error
    nodes = {c.agent: c for c in await store.list_children(run.id)}
    assert (nodes["left"].max_cost_usd, nodes["right"].max_cost_usd) == (1.0, 1.0)
    assert done.cost_usd == 3.0


async def test_a_failed_node_fails_the_system_naming_it(backend: Backend) -> None:
    store = backend.store
    await apply(
        store,
        *answering("planner", "the plan"),
        model("broken-model"),  # no turns: its first model call fails
        agent("researcher", "broken-model", max_attempts=1),
        *answering("critic", "the doubts"),
        *answering("writer", "the report"),
        system("team", **DIAMOND),
    )
    run, _ = await system_runs.submit_system(store, "team", "go", bus=backend.bus)
    await backend.drain()
    done = await get(store, run)
    assert done.state is RunState.FAILED and done.error is not None
    assert "'researcher'" in done.error["message"] and "1.1" in done.error["message"]
    assert not [c for c in await store.list_children(run.id) if c.agent == "writer"]


async def test_cancelling_a_system_run_cancels_its_node_runs(backend: Backend) -> None:
    store = backend.store
    await diamond(store)
    run, _ = await system_runs.submit_system(store, "team", "go", bus=backend.bus)
    await operations.cancel(store, run.id, bus=backend.bus)
    await backend.drain()
    assert (await get(store, run)).state is RunState.CANCELLED
    assert all(c.state.finished for c in await store.list_children(run.id))


async def test_submitting_a_system_that_does_not_exist_is_not_found(backend: Backend) -> None:
    with pytest.raises(NotFoundError, match="AgentSystem 'nope'"):
        await system_runs.submit_system(backend.store, "nope", "x", bus=backend.bus)
    await diamond(backend.store)
    with pytest.raises(NotFoundError):  # in another namespace
        await system_runs.submit_system(backend.store, "team", "x", namespace="other")


async def test_an_agent_of_a_system_cannot_be_deleted(backend: Backend) -> None:
    await diamond(backend.store)
    with pytest.raises(ConflictError, match="AgentSystem 'team'"):
        await backend.store.delete_resource("default", "Agent", "critic")


async def test_an_unknown_agent_in_a_graph_is_refused_naming_the_field(
    backend: Backend,
) -> None:
    await apply(backend.store, *answering("planner", "x"))
    with pytest.raises(ResourceError) as caught:
        await apply(
            backend.store,
            system("team", entry="planner", graph={"planner": {"next": ["ghost"]}}),
        )
    assert "spec.graph.planner.next[0]" in str(caught.value)
    assert "Agent 'ghost' not found" in str(caught.value)


async def test_a_system_run_past_its_timeout_fails_naming_the_limit(backend: Backend) -> None:
    store = backend.store
    await apply(
        store,
        *PING_PONG,
        system(
            "loop",
            entry="ping",
            graph={"ping": {"next": ["pong"]}, "pong": {"next": ["ping"]}},
            output="pong",
            limits={"max_hops": 1000, "timeout_seconds": 0.001},
        ),
    )
    run, _ = await system_runs.submit_system(store, "loop", "serve", bus=backend.bus)
    await backend.drain()
    done = await get(store, run)
    assert done.state is RunState.FAILED and done.error is not None
    assert (done.error["code"], done.error.get("limit")) == ("budget_exceeded", "timeout_seconds")
    assert all(c.state.finished for c in await store.list_children(run.id))


@pytest.mark.worker(poll_seconds=0.1, lease_seconds=1.5)
async def test_a_node_that_hangs_is_stopped_at_the_systems_timeout(backend: Backend) -> None:
    # No node run ends to wake the parked system run: a worker's upkeep queues it at its
    # deadline, and its coordinator fails it and cancels the hanging node run.
    store = backend.store
    GATES["never"] = gate = Gate()
    tool = {
        "apiVersion": "corral/v1",
        "kind": "Tool",
        "metadata": {"name": "wait_at_gate"},
        "spec": {
            "type": "python",
            "python": {"function": "durable_tools:wait_at_gate", "path": str(TESTS)},
        },
    }
    try:
        await apply(
            store,
            json.dumps(tool),
            model("stuck-model", call("wait_at_gate", gate="never"), {"text": "never"}),
            agent("stuck", "stuck-model", tools=["wait_at_gate"]),
            system("hung", entry="stuck", limits={"timeout_seconds": 1}),
        )
        run, _ = await system_runs.submit_system(store, "hung", "go", bus=backend.bus)
        await backend.drain()
    finally:
        del GATES["never"]
    done = await get(store, run)
    assert done.state is RunState.FAILED and done.error is not None
    assert (done.error["code"], done.error.get("limit")) == ("budget_exceeded", "timeout_seconds")
    assert done.deadline_at is not None and done.finished_at is not None
    assert done.finished_at >= done.deadline_at
    [node] = await store.list_children(run.id)
    assert gate.calls == 1 and node.state is RunState.CANCELLED


async def test_a_system_run_memory_is_shared_by_its_agents_and_no_other_run(
    backend: Backend,
) -> None:
    store = backend.store
    write = {"name": "memory_write", "arguments": {"text": "otters hold hands", "key": "fact"}}
    read = {"name": "memory_read", "arguments": {"key": "fact"}}
    await apply(
        store,
        json.dumps(
            {
                "apiVersion": "corral/v1",
                "kind": "Memory",
                "metadata": {"name": "scratch"},
                "spec": {"scope": "system_run"},
            }
        ),
        model("noter-model", {"tool_calls": [write]}, {"text": "noted"}),
        model(
            "reader-model",
            *[t for _ in range(2) for t in ({"tool_calls": [read]}, {"text": "read"})],
        ),
        agent("noter", "noter-model", memory=[{"ref": "scratch", "access": "write"}]),
        agent("reader", "reader-model", memory=[{"ref": "scratch"}]),
        system("pair", entry="noter", graph={"noter": {"next": ["reader"]}}),
        system("alone", entry="reader", graph={}),
    )
    run, _ = await system_runs.submit_system(store, "pair", "go", bus=backend.bus)
    await backend.drain()
    assert (await get(store, run)).state is RunState.SUCCEEDED
    (reader,) = [c for c in await store.list_children(run.id) if c.agent == "reader"]
    (found,) = [
        _json(e.data.output)
        for e in await store.list_events(reader.id)
        if e.type is EventType.TOOL_RESULT
    ]
    assert found["found"] and found["text"] == "otters hold hands"
    # another system run has entries of its own: none yet
    other, _ = await system_runs.submit_system(store, "alone", "go", bus=backend.bus)
    await backend.drain()
    (lonely,) = await store.list_children(other.id)
    (missing,) = [
        _json(e.data.output)
        for e in await store.list_events(lonely.id)
        if e.type is EventType.TOOL_RESULT
    ]
    assert missing["found"] is False


def _json(output: Any) -> Any:
    return json.loads(output) if isinstance(output, str) else output


async def test_a_branch_moves_on_while_its_sibling_waits(backend: Backend) -> None:
    """Not in waves: the quick branch's next node runs while the other branch's node is
    parked for a human's approval."""
    store = backend.store
    await apply(
        store,
        *answering("planner", "the plan"),
        *gated(),
        *answering("quick", "quick"),
        *answering("after", "after"),
        *answering("end", "the end"),
        system(
            "split",
            entry="planner",
            graph={
                "planner": {"next": ["gated", "quick"]},
                "quick": {"next": ["after"]},
                "after": {"next": ["end"]},
                "gated": {"next": ["end"]},
                "end": {"join": "all"},
            },
        ),
    )
    run, _ = await system_runs.submit_system(store, "split", "go", bus=backend.bus)
    await backend.drain()
    assert (await get(store, run)).state is RunState.WAITING_CHILDREN
    states = {c.agent: c.state for c in await store.list_children(run.id)}
    assert states == {
        "planner": RunState.SUCCEEDED,
        "gated": RunState.WAITING_APPROVAL,
        "quick": RunState.SUCCEEDED,
        "after": RunState.SUCCEEDED,  # ran while gated waits
    }
    (approval,) = await store.list_approvals(states=["pending"])
    await backend.decide(approval.id, True)
    await backend.drain()
    done = await get(store, run)
    assert (done.state, done.output) == (RunState.SUCCEEDED, "the end"), done.error
