"""``handoff`` between linked agents on real workers: the run goes on under the target,
keeps its history, parks and resumes under it, and is governed like every tool.

Every test runs twice (:mod:`backends`): on the embedded SQLite store, and on
PostgreSQL + NATS JetStream.
"""

from __future__ import annotations

import json

import pytest

from backends import Backend, backend_fixture, deployment_fixture
from corral.core.events import EventType
from corral.core.runs import RunState
from nats_servers import nats_prefix_fixture, nats_server_url_fixture
from systems_helpers import agent, apply, call, get, model, role_denying, tool_results

__all__ = [
    "backend_fixture",
    "deployment_fixture",
    "nats_prefix_fixture",
    "nats_server_url_fixture",
]


def handoff(to: str, reason: str = "") -> dict[str, object]:
    return call("handoff", agent=to, reason=reason)


async def test_a_handoff_keeps_the_history_and_the_run_names_its_active_agent(
    backend: Backend,
) -> None:
    store = backend.store
    await apply(
        store,
        model("triage-model", handoff("billing", "a billing question")),
        # a scripted model answers turn N+1 of a conversation with N assistant messages
        model("billing-model", {"text": "(triage's turn)"}, {"text": "you owe 5"}),
        agent("billing", "billing-model", instructions="You are billing."),
        agent("triage", "triage-model", instructions="You are triage.", links=["billing"]),
    )
    run, _ = await backend.submit("triage", "how much do I owe?")
    await backend.drain()

    done = await get(store, run)
    assert (done.state, done.output) == (RunState.SUCCEEDED, "you owe 5")
    # the run keeps its submitted agent; active_agent says whose conversation it became
    assert (done.agent, done.active_agent) == ("triage", "billing")
    assert [m.role for m in done.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert done.messages[0].content == "You are billing."
    assert done.messages[1].content == "how much do I owe?"
    assert await store.list_children(run.id) == []  # no child run: the same run goes on
    events = await store.list_events(run.id)
    [switch] = [e.data.to_dict() for e in events if e.type is EventType.HANDOFF]
    assert (switch["from"], switch["to"], switch["reason"]) == (
        "triage",
        "billing",
        "a billing question",
    )
    assert [e.type for e in events].count(EventType.RUN_FINISH) == 1


async def test_a_run_parked_after_a_handoff_resumes_under_the_target(backend: Backend) -> None:
    store = backend.store
    await apply(
        store,
        model("triage-model", handoff("billing")),  # one turn: asked again, it would fail
        model(
            "billing-model",
            {"text": "-"},
            call("agents_list"),  # waits for a human (billing's approval policy)
            {"text": "billing, after the approval"},
        ),
        agent("billing", "billing-model", links=["triage"], approval={"policy": "always"}),
        agent("triage", "triage-model", links=["billing"]),
    )
    run, _ = await backend.submit("triage", "go")
    await backend.drain()
    parked = await get(store, run)
    assert parked.state is RunState.WAITING_APPROVAL
    assert parked.active_agent == "billing"
    (approval,) = await store.list_approvals(run_id=run.id)
    assert (approval.tool, approval.agent) == ("agents_list", "billing")

    await backend.decide(approval.id, True, by="tester")
    await backend.drain()
    done = await get(store, run)
    assert (done.state, done.output) == (RunState.SUCCEEDED, "billing, after the approval")
    assert done.active_agent == "billing"
    events = await store.list_events(run.id)
    assert [e.type for e in events].count(EventType.HANDOFF) == 1
    listed = tool_results(events)[-1]
    assert json.loads(listed["output"]) == [{"agent": "triage", "description": ""}]


@pytest.mark.parametrize(
    "approval", [{"policy": "always"}, {"policy": "by_risk", "min_risk": "medium"}]
)
async def test_a_handoff_waits_for_approval_like_every_tool(
    backend: Backend, approval: dict[str, str]
) -> None:
    store = backend.store
    await apply(
        store,
        model("triage-model", handoff("billing")),
        model("billing-model", {"text": "-"}, {"text": "billing answers"}),
        agent("billing", "billing-model"),
        agent("triage", "triage-model", links=["billing"], approval=approval),
    )
    run, _ = await backend.submit("triage", "go")
    await backend.drain()
    assert (await get(store, run)).state is RunState.WAITING_APPROVAL
    assert not [e for e in await store.list_events(run.id) if e.type is EventType.HANDOFF]
    (approval,) = await store.list_approvals(run_id=run.id)
    assert (approval.tool, approval.agent) == ("handoff", "triage")
    await backend.decide(approval.id, True)
    await backend.drain()
    done = await get(store, run)
    assert (done.state, done.output, done.active_agent) == (
        RunState.SUCCEEDED,
        "billing answers",
        "billing",
    )


async def test_a_denied_or_unlinked_handoff_is_refused_and_the_run_stays(backend: Backend) -> None:
    store = backend.store
    await apply(
        store,
        model(
            "triage-model",
            handoff("billing"),  # linked, but its roles deny agent:billing
            handoff("stranger"),  # not linked
            {"text": "still triage"},
        ),
        model("other-model", {"text": "never"}),
        agent("billing", "other-model"),
        agent("stranger", "other-model"),
        *role_denying("triage-role", "no-billing", "agent:billing"),
        agent("triage", "triage-model", links=["billing"], roles=["triage-role"]),
    )
    run, _ = await backend.submit("triage", "go")
    await backend.drain()
    done = await get(store, run)
    assert (done.state, done.output, done.active_agent) == (
        RunState.SUCCEEDED,
        "still triage",
        None,
    )
    denied, unlinked = tool_results(await store.list_events(run.id))
    assert denied["error"]["code"] == "permission_denied"
    assert "agent:billing" in denied["error"]["reason"]
    assert unlinked["error"]["code"] == "permission_denied"
    assert "not linked" in unlinked["error"]["reason"]
    assert not [e for e in await store.list_events(run.id) if e.type is EventType.HANDOFF]


async def test_a_handoff_ping_pong_stops_at_max_handoffs(backend: Backend) -> None:
    store = backend.store
    turns = [handoff("pong")] * 4 + [{"text": "ping is done"}] * 2
    back = [handoff("ping")] * 4 + [{"text": "pong is done"}] * 2
    await apply(
        store,
        model("ping-model", *turns),
        model("pong-model", *back),
        agent("ping", "ping-model", links=["pong"], limits={"max_handoffs": 2}),
        agent("pong", "pong-model", links=["ping"], limits={"max_handoffs": 2}),
    )
    run, _ = await backend.submit("ping", "go")
    await backend.drain()
    done = await get(store, run)
    assert (done.state, done.output, done.active_agent) == (
        RunState.SUCCEEDED,
        "ping is done",
        None,
    )
    events = await store.list_events(run.id)
    assert [(e.data.from_agent, e.data.to) for e in events if e.type is EventType.HANDOFF] == [
        ("ping", "pong"),
        ("pong", "ping"),
    ]
    refused = tool_results(events)[-1]
    assert refused["error"]["code"] == "budget_exceeded"
    assert refused["error"]["details"] == {"limit": "max_handoffs", "max_handoffs": 2}


async def test_a_sessions_next_run_sees_the_handed_off_conversation(backend: Backend) -> None:
    store = backend.store
    await apply(
        store,
        # triage has no instructions: billing's system prompt is put first, not replaced
        model("triage-model", handoff("billing"), {"text": "-"}, {"text": "triage again"}),
        model("billing-model", {"text": "-"}, {"text": "you owe 5"}),
        agent("billing", "billing-model", instructions="You are billing."),
        agent("triage", "triage-model", links=["billing"]),
    )
    first, _ = await backend.submit("triage", "what do I owe?", session="s-handoff")
    await backend.drain()
    assert (await get(store, first)).output == "you owe 5"
    stored = [m.message for m in await store.session_messages("default", "s-handoff")]
    # the session keeps the conversation, never a system prompt
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[-1].content == "you owe 5"

    second, _ = await backend.submit("triage", "thanks", session="s-handoff")
    await backend.drain()
    again = await get(store, second)
    # a session's run starts under the submitted agent, with the whole history
    assert (again.state, again.output, again.active_agent) == (
        RunState.SUCCEEDED,
        "triage again",
        None,
    )
    assert [m.role for m in again.messages] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
