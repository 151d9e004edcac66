"""Delegation between linked agents: ``agents_exec`` child runs, on real workers.

Every test runs twice (:mod:`backends`): on the embedded SQLite store, and on
PostgreSQL + NATS JetStream, where child runs and woken parents reach the worker
only as NATS deliveries (the store is not swept while the test runs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from backends import Backend, backend_fixture, deployment_fixture
from corral.core.errors import ResourceError
from corral.core.events import EventType
from corral.core.runs import RunState
from corral.resources.kinds import DEFAULT_MAX_DEPTH, AgentLink
from corral.runtime import operations
from corral.runtime.delegation import StoreDelegation
from corral.tools.agents import AgentsExec
from corral.tools.base import ChildRun, ToolContext
from fake_clock import FakeClock
from nats_servers import nats_prefix_fixture, nats_server_url_fixture
from systems_helpers import add_tool, agent, apply, call, get, model, role_denying, tool_results

__all__ = [
    "backend_fixture",
    "deployment_fixture",
    "nats_prefix_fixture",
    "nats_server_url_fixture",
]

TESTS = Path(__file__).parent


async def test_a_parent_gets_its_linked_agents_answer_from_a_child_run(backend: Backend) -> None:
    store = backend.store
    await apply(
        store,
        model(
            "boss-model",
            {**call("agents_exec", agent="adder", input="what is 2 + 2?"), "input_tokens": 10},
            {"text": "the adder says 4", "input_tokens": 5},
        ),
        model("adder-model", {"text": "4", "input_tokens": 100, "output_tokens": 1}),
        agent("adder", "adder-model"),
        agent("boss", "boss-model", links=[{"agent": "adder", "description": "adds numbers"}]),
    )
    run, _ = await backend.submit("boss", "ask the adder")
    await backend.drain()

    parent = await get(store, run)
    assert (parent.state, parent.output) == (RunState.SUCCEEDED, "the adder says 4")
    children = await store.list_children(run.id)
    assert len(children) == 1
    child = children[0]
    assert (child.agent, child.state, child.output) == ("adder", RunState.SUCCEEDED, "4")
    assert (child.parent_run_id, child.depth, child.input) == (run.id, 1, "what is 2 + 2?")
    # the child's spend counts as the parent's
    assert parent.usage.input_tokens == 10 + 5 + 100
    events = await store.list_events(run.id)
    kinds = [e.type for e in events]
    assert kinds.count(EventType.CHILD_START) == 1 and kinds.count(EventType.CHILD_FINISH) == 1
    start = next(e for e in events if e.type is EventType.CHILD_START)
    finish = next(e for e in events if e.type is EventType.CHILD_FINISH)
    assert start.data.run_id == child.id == finish.data.run_id
    assert finish.data.state == "succeeded"
    assert kinds.index(EventType.CHILD_FINISH) < kinds.index(EventType.TOOL_RESULT)
    assert [r["output"] for r in tool_results(events)] == ["4"]
    assert kinds.count(EventType.RUN_FINISH) == 1


async def test_a_child_run_is_capped_by_what_its_parent_has_left(backend: Backend) -> None:
    # boss ($1 a turn, max_cost_usd 2.5) delegates after its first turn; helper would
    # take 5 turns at $1: given the $1.5 boss has left as its own cap, it stops before its
    # second ($1 more would pass it), and boss before its second turn too ($2 spent, $0.5
    # left) - not after them at $2 and $3, as when a turn was checked only once paid.
    store = backend.store
    add = {"name": "add", "arguments": {"a": 2, "b": 3}}

    await apply(
        store,
        add_tool(),
        priced_model(
            "boss-model",
            {**call("agents_exec", agent="helper", input="spend"), "input_tokens": 1000},
            {"text": "done", "input_tokens": 1000},
        ),
        priced_model(
            "helper-model",
            *[{"tool_calls": [add], "input_tokens": 1000}] * 4,
            {"text": "spent", "input_tokens": 1000},
        ),
        agent("helper", "helper-model", tools=["add"]),
        agent("boss", "boss-model", links=["helper"], limits={"max_cost_usd": 2.5}),
    )
    run, _ = await backend.submit("boss", "go")
    await backend.drain()
    parent = await get(store, run)
    [helper] = await store.list_children(run.id)
    assert helper.max_cost_usd == 1.5
    assert helper.state is RunState.FAILED and helper.error is not None
    assert helper.error["limit"] == "max_cost_usd" and helper.cost_usd == 1.0
    assert parent.state is RunState.FAILED and parent.error is not None
    assert parent.error["limit"] == "max_cost_usd" and parent.cost_usd == 2.0


async def test_children_started_at_once_share_what_their_parent_has_left(backend: Backend) -> None:
    # boss ($1 a turn, max_cost_usd 4) fans out to three helpers in its first turn: each
    # may spend a third of the $3 left, so together they cannot spend more than boss has
    # (not $3 each: $9 before boss is charged); each helper spends its $1 and answers,
    # and boss, charged $4, is within its limit
    store = backend.store
    pricing = {"input_per_million": 1_000_000.0, "output_per_million": 0.0}
    fan = [
        {"name": "agents_exec", "arguments": {"agent": "helper", "input": f"part {n}"}}
        for n in range(3)
    ]
    model_docs = [
        {
            "name": "boss-model",
            "script": [{"tool_calls": fan, "input_tokens": 1}, {"text": "done"}],
        },
        {"name": "helper-model", "script": [{"text": "spent", "input_tokens": 1}] * 3},
    ]
    await apply(
        store,
        *[
            json.dumps(
                {
                    "apiVersion": "corral/v1",
                    "kind": "ModelEndpoint",
                    "metadata": {"name": doc["name"]},
                    "spec": {"provider": "scripted", "pricing": pricing, "script": doc["script"]},
                }
            )
            for doc in model_docs
        ],
        agent("helper", "helper-model"),
        agent("boss", "boss-model", links=["helper"], limits={"max_cost_usd": 4.0}),
    )
    run, _ = await backend.submit("boss", "go")
    await backend.drain()
    parent = await get(store, run)
    helpers = await store.list_children(run.id)
    assert [h.max_cost_usd for h in helpers] == [1.0] * 3
    assert all(h.state is RunState.SUCCEEDED for h in helpers)
    assert (parent.state, parent.cost_usd) == (RunState.SUCCEEDED, 4.0)


async def test_a_child_run_is_capped_by_the_tokens_its_parent_has_left(backend: Backend) -> None:
    # boss (10 tokens a turn, max_tokens 25) delegates after its first turn; helper would
    # take 5 turns of 10: given the 15 boss has left as its own cap, it stops before its
    # second (10 more would pass it), and boss before its second turn (20 spent, 5 left) -
    # not after them at 20 and 30, as when a turn was checked only once paid.
    store = backend.store
    add = {"name": "add", "arguments": {"a": 2, "b": 3}}
    ten = {"input_tokens": 7, "output_tokens": 3}
    await apply(
        store,
        add_tool(),
        model(
            "boss-model",
            {**call("agents_exec", agent="helper", input="spend"), **ten},
            {"text": "done", **ten},
        ),
        model("helper-model", *[{"tool_calls": [add], **ten}] * 4, {"text": "spent", **ten}),
        agent("helper", "helper-model", tools=["add"], limits={"max_tokens": 1000}),
        agent("boss", "boss-model", links=["helper"], limits={"max_tokens": 25}),
    )
    run, _ = await backend.submit("boss", "go")
    await backend.drain()
    parent = await get(store, run)
    [helper] = await store.list_children(run.id)
    assert (helper.max_tokens, helper.max_cost_usd) == (15, None)
    assert helper.state is RunState.FAILED and helper.error is not None
    assert helper.error["limit"] == "max_tokens" and helper.usage.total_tokens == 10
    assert parent.state is RunState.FAILED and parent.error is not None
    assert parent.error["limit"] == "max_tokens" and parent.usage.total_tokens == 20


async def test_parallel_children_and_their_parent_never_pass_their_cost_caps(
    backend: Backend,
) -> None:
    # boss ($1 a turn, max_cost_usd 13) starts six helpers in one step: $12 left, $2 each;
    # a helper would take five $1 turns: each stops before its third, at its $2 cap, and
    # boss before its second turn, at its $13 (each child paid a third turn past its cap,
    # and boss ended at $19)
    store = backend.store
    add = {"name": "add", "arguments": {"a": 2, "b": 3}}
    spend = {"name": "agents_exec", "arguments": {"agent": "helper", "input": "spend"}}

    await apply(
        store,
        add_tool(),
        priced_model(
            "boss-model",
            {"tool_calls": [spend] * 6, "input_tokens": 1000},
            {"text": "done", "input_tokens": 1000},
        ),
        priced_model(
            "helper-model",
            *[{"tool_calls": [add], "input_tokens": 1000}] * 4,
            {"text": "spent", "input_tokens": 1000},
        ),
        agent("helper", "helper-model", tools=["add"]),
        agent("boss", "boss-model", links=["helper"], limits={"max_cost_usd": 13.0}),
    )
    run, _ = await backend.submit("boss", "go")
    await backend.drain()
    parent = await get(store, run)
    helpers = await store.list_children(run.id)
    assert [h.max_cost_usd for h in helpers] == [2.0] * 6
    assert all(h.state is RunState.FAILED and h.cost_usd == 2.0 for h in helpers)
    assert all(h.error is not None and h.error["limit"] == "max_cost_usd" for h in helpers)
    assert parent.state is RunState.FAILED and parent.error is not None
    assert parent.error["limit"] == "max_cost_usd" and parent.cost_usd == 13.0


async def test_a_call_whose_share_is_nothing_starts_no_child(backend: Backend) -> None:
    # boss (max_tokens 10) used all 10 in the turn that asks for a child: capped at nothing
    # the child would still take a paid turn, so the call is refused (budget_exceeded) and
    # no child starts; boss answers in a free turn, within its limit
    store = backend.store
    ten = {"input_tokens": 7, "output_tokens": 3}
    await apply(
        store,
        model(
            "boss-model",
            {**call("agents_exec", agent="helper", input="help"), **ten},
            {"text": "no help left"},
        ),
        model("helper-model", {"text": "helped", "input_tokens": 1}),
        agent("helper", "helper-model"),
        agent("boss", "boss-model", links=["helper"], limits={"max_tokens": 10}),
    )
    run, _ = await backend.submit("boss", "go")
    await backend.drain()
    parent = await get(store, run)
    assert (parent.state, parent.output) == (RunState.SUCCEEDED, "no help left")
    assert await store.list_children(run.id) == []
    (result,) = tool_results(await store.list_events(run.id))
    assert result["error"]["code"] == "budget_exceeded"
    assert result["error"]["details"]["limit"] == "max_tokens"


async def test_a_failed_child_is_a_structured_tool_error_of_its_parent(backend: Backend) -> None:
    store = backend.store
    await apply(
        store,
        model(
            "boss-model",
            call("agents_exec", agent="broken", input="try"),
            {"text": "the child failed"},
        ),
        model("broken-model"),  # no turns: the child's first model call fails
        agent("broken", "broken-model", max_attempts=1),
        agent("boss", "boss-model", links=["broken"]),
    )
    run, _ = await backend.submit("boss", "go")
    await backend.drain()
    parent = await get(store, run)
    assert (parent.state, parent.output) == (RunState.SUCCEEDED, "the child failed")
    (result,) = tool_results(await store.list_events(run.id))
    child = (await store.list_children(run.id))[0]
    assert result["error"]["code"] == "child_failed"
    assert result["error"]["details"]["run_id"] == child.id
    assert result["error"]["details"]["state"] == child.state.value != "succeeded"


async def test_calling_an_agent_that_is_not_linked_is_permission_denied(backend: Backend) -> None:
    store = backend.store
    await apply(
        store,
        model(
            "boss-model",
            call("agents_exec", agent="stranger", input="hi"),
            {"text": "refused"},
        ),
        model("other-model", {"text": "never"}),
        agent("friend", "other-model"),
        agent("stranger", "other-model"),
        agent("boss", "boss-model", links=["friend"]),
    )
    run, _ = await backend.submit("boss", "go")
    await backend.drain()
    assert (await get(store, run)).state is RunState.SUCCEEDED
    (result,) = tool_results(await store.list_events(run.id))
    assert result["error"]["code"] == "permission_denied"
    assert "not linked" in result["error"]["reason"]
    assert await store.list_children(run.id) == []


async def test_a_tool_permission_glob_on_agent_names_denies_delegation(backend: Backend) -> None:
    store = backend.store
    await apply(
        store,
        model(
            "boss-model",
            call("agents_exec", agent="helper", input="hi"),
            call("agents_list"),
            {"text": "done"},
        ),
        model("other-model", {"text": "never"}),
        agent("helper", "other-model"),
        *role_denying("solo", "no-agents", "agent:*"),
        agent("boss", "boss-model", links=["helper"], roles=["solo"]),
    )
    run, _ = await backend.submit("boss", "go")
    await backend.drain()
    assert (await get(store, run)).state is RunState.SUCCEEDED
    denied, listed = tool_results(await store.list_events(run.id))
    assert denied["error"]["code"] == "permission_denied"
    assert "agent:helper" in denied["error"]["reason"]
    assert json.loads(listed["output"]) == []  # agents_list shows only permitted agents
    assert await store.list_children(run.id) == []


async def test_a_ping_pong_between_two_linked_agents_stops_at_max_depth(backend: Backend) -> None:
    store = backend.store
    # Each agent asks the other, until a call is refused; then each answers with what it got.
    await apply(
        store,
        model("ping-model", call("agents_exec", agent="pong", input="ping"), {"text": "ping done"}),
        model("pong-model", call("agents_exec", agent="ping", input="pong"), {"text": "pong done"}),
        agent("ping", "ping-model", links=["pong"], limits={"max_depth": 3}),
        agent("pong", "pong-model", links=["ping"], limits={"max_depth": 3}),
    )
    run, _ = await backend.submit("ping", "start")
    await backend.drain()
    assert (await get(store, run)).state is RunState.SUCCEEDED
    chain = [run]
    while children := await store.list_children(chain[-1].id):
        assert len(children) == 1
        chain.append(children[0])
    assert [r.depth for r in chain] == [0, 1, 2, 3]
    assert [(await get(store, r)).state for r in chain] == [RunState.SUCCEEDED] * 4
    (refused,) = tool_results(await store.list_events(chain[-1].id))
    assert refused["error"]["code"] == "budget_exceeded"
    assert refused["error"]["details"]["limit"] == "max_depth"
    assert "max_depth" in refused["error"]["reason"]


def priced_model(name: str, *turns: dict[str, Any]) -> str:
    """A scripted ModelEndpoint whose every 1000 input tokens cost one dollar."""
    document = json.loads(model(name, *turns))
    document["spec"]["pricing"] = {"input_per_million": 1000.0}
    return json.dumps(document)


@pytest.mark.parametrize(
    ("limits", "limit"),
    [({"max_cost_usd": 5.0}, "max_cost_usd"), ({"max_steps": 1}, "max_steps")],
)
async def test_a_ping_pong_is_stopped_by_the_top_runs_budget_naming_the_limit(
    backend: Backend, limits: dict[str, Any], limit: str
) -> None:
    store = backend.store
    # Each turn costs $1 (1000 input tokens). The chain ping > pong > ping > pong is cut
    # at depth 3; each child is capped at what its parent had left ($4, $3, $2), and
    # unwinding, each run is charged its child's whole spend: the top ping ($1 + its
    # child's $4, its $5: its next turn would pass it), or a ping past its one step,
    # fails with the limit.
    await apply(
        store,
        priced_model(
            "ping-model",
            {**call("agents_exec", agent="pong", input="ping"), "input_tokens": 1000},
            {"text": "ping done", "input_tokens": 1000},
        ),
        priced_model(
            "pong-model",
            {**call("agents_exec", agent="ping", input="pong"), "input_tokens": 1000},
            {"text": "pong done", "input_tokens": 1000},
        ),
        agent("ping", "ping-model", links=["pong"], limits={"max_depth": 3, **limits}),
        agent("pong", "pong-model", links=["ping"], limits={"max_depth": 3}),
    )
    run, _ = await backend.submit("ping", "start")
    await backend.drain()
    top = await get(store, run)
    assert top.state is RunState.FAILED
    assert top.error is not None
    assert (top.error["code"], top.error["limit"]) == ("budget_exceeded", limit)
    assert "limit" in top.error["message"]
    chain = [top]
    while children := await store.list_children(chain[-1].id):
        (child,) = children
        chain.append(child)
    assert [r.depth for r in chain] == [0, 1, 2, 3]  # max_depth cut the chain
    assert all(r.state.finished for r in chain)
    if limit == "max_cost_usd":
        assert [r.max_cost_usd for r in chain] == [None, 4.0, 3.0, 2.0]
        # the last pong ends at its cap; each run above it, charged its child's whole
        # spend, is at its cap too, and its last turn is refused before it is paid
        assert [r.state for r in chain] == [RunState.FAILED] * 3 + [RunState.SUCCEEDED]
        assert [round(r.cost_usd, 6) for r in chain] == [5.0, 4.0, 3.0, 2.0]
    else:  # every ping stops at its second step; a pong answers its failed child
        assert [r.state for r in chain] == [
            RunState.FAILED,
            RunState.SUCCEEDED,
            RunState.FAILED,
            RunState.SUCCEEDED,
        ]
        (answer,) = tool_results(await store.list_events(chain[1].id))
        assert answer["error"]["code"] == "child_failed"
    assert [e.type for e in await store.list_events(run.id)].count(EventType.RUN_FINISH) == 1


async def test_cancelling_a_parent_cancels_its_waiting_child(backend: Backend) -> None:
    store = backend.store
    await apply(
        store,
        model("boss-model", call("agents_exec", agent="slow", input="x"), {"text": "never"}),
        model("slow-model", call("agents_exec", agent="slow2", input="y"), {"text": "never"}),
        agent("slow", "slow-model", links=["slow2"], approval={"policy": "always"}),
        agent("slow2", "slow-model"),
        agent("boss", "boss-model", links=["slow"]),
    )
    run, _ = await backend.submit("boss", "go")
    await backend.drain()  # the child waits for a human to approve its own call
    (child,) = await store.list_children(run.id)
    assert (await get(store, run)).state is RunState.WAITING_CHILDREN
    assert (await get(store, child)).state is RunState.WAITING_APPROVAL
    cancelled = await store.request_cancel(run.id)
    assert cancelled.state is RunState.CANCELLED
    assert (await get(store, child)).state is RunState.CANCELLED
    (approval,) = await store.list_approvals(run_id=child.id)
    assert approval.state == "expired"
    await backend.drain()
    assert (await get(store, run)).state is RunState.CANCELLED


async def test_a_cancelled_child_wakes_its_parent_with_a_tool_error(backend: Backend) -> None:
    store = backend.store
    await apply(
        store,
        model("boss-model", call("agents_exec", agent="asks", input="x"), {"text": "gave up"}),
        model("asks-model", call("agents_list"), {"text": "never"}),
        agent("asks", "asks-model", links=["boss"], approval={"policy": "always"}),
        agent("boss", "boss-model", links=["asks"]),
    )
    run, _ = await backend.submit("boss", "go")
    await backend.drain()
    (child,) = await store.list_children(run.id)
    assert (await get(store, child)).state is RunState.WAITING_APPROVAL
    await operations.cancel(store, child.id, bus=backend.bus)  # announces the parent
    await backend.drain()
    parent = await get(store, run)
    assert (parent.state, parent.output) == (RunState.SUCCEEDED, "gave up")
    (result,) = tool_results(await store.list_events(run.id))
    assert result["error"]["code"] == "child_failed"
    assert result["error"]["details"]["state"] == "cancelled"


async def test_links_are_checked_when_applied(backend: Backend) -> None:
    store = backend.store
    base = [model("m", {"text": "x"}), agent("a", "m")]
    with pytest.raises(ResourceError) as missing:
        await apply(store, *base, agent("b", "m", links=["nobody"]))
    assert "Agent 'nobody' not found" in str(missing.value)
    assert "spec.links[0]" in str(missing.value)
    with pytest.raises(ResourceError) as itself:
        await apply(store, *base, agent("b", "m", links=["a", "b"]))
    assert "cannot link to itself" in str(itself.value)
    with pytest.raises(ResourceError) as twice:
        await apply(store, *base, agent("b", "m", links=["a", {"agent": "a"}]))
    assert "linked twice" in str(twice.value)
    assert await store.get_resource("default", "Agent", "b") is None


async def test_the_parent_holds_no_worker_slot_while_its_child_runs(backend: Backend) -> None:
    """With one slot, the parent parks and the child takes the slot."""
    backend.options["concurrency"] = 1
    store = backend.store
    await apply(
        store,
        model("boss-model", call("agents_exec", agent="adder", input="1+1"), {"text": "2"}),
        model("adder-model", {"text": "2"}),
        agent("adder", "adder-model"),
        agent("boss", "boss-model", links=["adder"]),
    )
    run, _ = await backend.submit("boss", "go")
    with anyio.fail_after(30):
        await backend.drain()
    assert (await get(store, run)).state is RunState.SUCCEEDED


async def test_two_children_of_one_step_both_answer_and_the_parent_resumes_once(
    backend: Backend,
) -> None:
    store = backend.store
    both = {
        "tool_calls": [
            {"name": "agents_exec", "arguments": {"agent": "left", "input": "l"}},
            {"name": "agents_exec", "arguments": {"agent": "right", "input": "r"}},
        ]
    }
    await apply(
        store,
        model("boss-model", both, {"text": "both answered"}),
        model("left-model", {"text": "from the left"}),
        model("right-model", {"text": "from the right"}),
        agent("left", "left-model"),
        agent("right", "right-model"),
        agent("boss", "boss-model", links=["left", "right"]),
    )
    runs = [(await backend.submit("boss", f"go {i}"))[0] for i in range(3)]
    await backend.drain()
    for run in runs:
        parent = await get(store, run)
        assert (parent.state, parent.output) == (RunState.SUCCEEDED, "both answered")
        children = await store.list_children(run.id)
        assert sorted(c.agent for c in children) == ["left", "right"]
        events = await store.list_events(run.id)
        outputs = [r["output"] for r in tool_results(events)]
        assert sorted(outputs) == ["from the left", "from the right"]
        kinds = [e.type for e in events]
        assert kinds.count(EventType.RUN_FINISH) == 1
        assert kinds.count(EventType.CHILD_FINISH) == 2


async def test_a_childs_tokens_count_against_its_parents_limit(backend: Backend) -> None:
    store = backend.store
    await apply(
        store,
        model(
            "boss-model",
            {**call("agents_exec", agent="verbose", input="x"), "input_tokens": 10},
            {"text": "over", "input_tokens": 60},
        ),
        # (within the 90 tokens boss has left, its own cap; boss's next turn would pass
        # 100 only with them counted, and is not made)
        model("verbose-model", {"text": "a lot", "input_tokens": 50}),
        agent("verbose", "verbose-model"),
        agent("boss", "boss-model", links=["verbose"], limits={"max_tokens": 100}),
    )
    run, _ = await backend.submit("boss", "go")
    await backend.drain()
    parent = await get(store, run)
    assert parent.state is RunState.FAILED
    assert parent.error is not None
    assert (parent.error["code"], parent.error["limit"]) == ("budget_exceeded", "max_tokens")
    assert parent.usage.input_tokens == 10 + 50
    # the child's answer is journaled before the limit stops the parent
    assert [r["output"] for r in tool_results(await store.list_events(run.id))] == ["a lot"]


async def test_a_replayed_agents_exec_call_finds_its_child_instead_of_starting_another(
    backend: Backend,
) -> None:
    store = backend.store
    await apply(
        store,
        model("m", {"text": "x"}),
        agent("helper", "m"),
        agent("boss", "m", links=["helper"]),
    )
    # (not due for an hour: an unfinished parent, as a run calling agents_exec is; no
    # child starts under a parent that has ended)
    parent, _ = await backend.submit("boss", "go", delay=3600)
    delegation = StoreDelegation(store, backend.bus)
    tool = AgentsExec([AgentLink(agent="helper")], delegation, lambda ref: True, DEFAULT_MAX_DEPTH)
    ctx = ToolContext(parent.id, "boss", "default", "call_1_1", f"{parent.id}:1:0", Path("."))
    first = await tool.call({"agent": "helper", "input": "hi"}, ctx)
    again = await tool.call({"agent": "helper", "input": "hi"}, ctx)
    other = await tool.call({"agent": "helper", "input": "something else"}, ctx)
    assert isinstance(first, ChildRun) and isinstance(again, ChildRun)
    assert isinstance(other, ChildRun)
    assert first.run_id == again.run_id != other.run_id
    assert len(await store.list_children(parent.id)) == 2


async def test_cancelling_a_running_parent_cancels_the_child_it_started(
    backend: Backend, clock: FakeClock
) -> None:
    store = backend.store
    slow = json.dumps(
        {
            "apiVersion": "corral/v1",
            "kind": "Tool",
            "metadata": {"name": "slow"},
            "spec": {
                "type": "exec",
                "exec": {"command": ["sleep", "30"]},
                "parameters": {"type": "object"},
                "timeout_seconds": 60,
            },
        }
    )
    step = {
        "tool_calls": [
            {"name": "agents_exec", "arguments": {"agent": "asks", "input": "x"}},
            {"name": "slow", "arguments": {}},
        ]
    }
    await apply(
        store,
        slow,
        model("boss-model", step, {"text": "never"}),
        model("asks-model", call("agents_list"), {"text": "never"}),
        agent("asks", "asks-model", links=["boss"], approval={"policy": "always"}),
        agent("boss", "boss-model", links=["asks"], tools=["slow"]),
    )
    run, _ = await backend.submit("boss", "go")
    async with backend.serving():
        # (the child exists once its submit committed; the parent journals its child.start
        # a moment later on its clock, which this test holds still)
        with anyio.fail_after(10):
            while not await store.list_children(run.id):
                await anyio.sleep(0.05)
        (child,) = await store.list_children(run.id)
        await store.request_cancel(run.id)  # the parent is running: its worker stops it
        clock.advance(30.0 / 3)  # the next lease renewal tells the run it is cancelled
        with anyio.fail_after(10):
            while (await get(store, run)).state is not RunState.CANCELLED:
                await anyio.sleep(0.05)
        with anyio.fail_after(10):
            while (await get(store, child)).state is not RunState.CANCELLED:
                await anyio.sleep(0.05)


async def test_agents_exec_waits_for_approval_by_risk_then_starts_its_child(
    backend: Backend,
) -> None:
    store = backend.store
    await apply(
        store,
        model(
            "boss-model",
            call("agents_list"),
            call("agents_exec", agent="adder", input="1+1"),
            {"text": "approved and answered"},
        ),
        model("adder-model", {"text": "2"}),
        agent("adder", "adder-model"),
        agent(
            "boss",
            "boss-model",
            links=[{"agent": "adder", "description": "adds"}],
            approval={"policy": "by_risk", "min_risk": "medium"},
        ),
    )
    run, _ = await backend.submit("boss", "go")
    await backend.drain()
    assert (await get(store, run)).state is RunState.WAITING_APPROVAL
    assert await store.list_children(run.id) == []  # nothing started before the decision
    (approval,) = await store.list_approvals(run_id=run.id)
    assert approval.tool == "agents_exec"
    await backend.decide(approval.id, True, by="tester")
    await backend.drain()
    parent = await get(store, run)
    assert (parent.state, parent.output) == (RunState.SUCCEEDED, "approved and answered")
    listed, answered = tool_results(await store.list_events(run.id))
    assert json.loads(listed["output"]) == [{"agent": "adder", "description": "adds"}]
    assert answered["output"] == "2"


async def test_hostile_agents_exec_calls_get_stable_tool_errors(backend: Backend) -> None:
    store = backend.store
    hostile = {
        "tool_calls": [
            {"name": "agents_exec", "arguments": {"agent": "adder", "input": "x" * 40_000}},
            {"name": "agents_exec", "arguments": {"agent": "ädder\u202e", "input": "hi"}},
            {"name": "agents_exec", "arguments": {"agent": ["adder"], "input": "hi"}},
            {"name": "agents_exec", "arguments": {"agent": "adder", "input": "hi", "x": 1}},
            {"name": "agents_exec", "arguments": {"agent": "adder", "input": "hi", "session": "?"}},
            {"name": "agents_info", "arguments": {"agent": "adder"}},
        ]
    }
    await apply(
        store,
        model("boss-model", hostile, {"text": "survived"}),
        model("adder-model", {"text": "never"}),
        agent("adder", "adder-model", tools=[]),
        agent("boss", "boss-model", links=["adder"]),
    )
    run, _ = await backend.submit("boss", "go")
    await backend.drain()
    assert (await get(store, run)).output == "survived"
    # the calls of one step run in parallel: their results in call order
    results = sorted(tool_results(await store.list_events(run.id)), key=lambda r: r["call_id"])
    codes = [r["error"]["code"] if r["error"] else None for r in results]
    assert codes == [
        "invalid_input",  # longer than an input may be
        "permission_denied",  # not a linked agent
        "invalid_input",  # not a name
        "invalid_input",  # an argument the tool does not take
        "invalid_input",  # a session id that breaks the rule
        None,
    ]
    assert json.loads(results[-1]["output"]) == {"agent": "adder", "description": "", "tools": []}
    assert await store.list_children(run.id) == []


async def test_agents_exec_naming_another_trees_session_is_permission_denied(
    backend: Backend,
) -> None:
    """A model (steered by what it read) names a session of the linked agent that another
    user's run opened: a permission_denied tool error, nothing started, nothing of that
    conversation shown; a session it opens itself goes on."""
    store = backend.store
    calls = {
        "tool_calls": [
            {"name": "agents_exec", "arguments": {"agent": "adder", "input": "hi", "session": s}}
            for s in ("their-talk", "our-talk")
        ]
    }
    await apply(
        store,
        model("boss-model", calls, {"text": "done"}),
        model("adder-model", {"text": "their answer"}, {"text": "2"}),
        agent("adder", "adder-model", tools=[]),
        agent("boss", "boss-model", links=["adder"]),
    )
    theirs, _ = await backend.submit("adder", "my secret plan", session="their-talk")
    await backend.drain()
    assert (await get(store, theirs)).state is RunState.SUCCEEDED
    run, _ = await backend.submit("boss", "go")
    await backend.drain()
    assert (await get(store, run)).output == "done"
    refused, answered = sorted(
        tool_results(await store.list_events(run.id)), key=lambda r: r["call_id"]
    )
    assert refused["error"]["code"] == "permission_denied"
    assert refused["error"]["details"] == {
        "refused": "session_not_allowed",
        "session": "their-talk",
    }
    assert "my secret plan" not in json.dumps(refused)
    assert answered["error"] is None
    [child] = await store.list_children(run.id)
    assert child.session_id == "our-talk"
    assert len(await store.session_messages("default", "their-talk")) == 2


async def test_malformed_links_are_refused_with_their_field(backend: Backend) -> None:
    store = backend.store
    base = [model("m", {"text": "x"}), agent("a", "m")]
    for links, field in (
        ([123], "spec.links[0]"),
        ([{"agent": "Not A Name"}], "spec.links[0].agent"),
        ([{"agent": "a", "extra": 1}], "spec.links[0].extra"),
        ("a", "spec.links"),
    ):
        with pytest.raises(ResourceError) as refused:
            await apply(store, *base, agent("b", "m", links=links))
        assert field in str(refused.value), str(refused.value)
    assert await store.get_resource("default", "Agent", "b") is None
