"""Resuming a run from its journal (the stored events): nothing recorded happens twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from corral.core.errors import CorralError
from corral.core.events import Event, EventType, MessageCreateData, RunStartData
from corral.core.runs import Decision, RunState
from corral.engine.loop import AgentLoop
from corral.engine.replay import replay
from corral.resources.kinds import ApprovalPolicy, ScriptedTurn
from test_engine import ADD_SCHEMA, FunctionTool, Harness, add, turn

THREE_STEPS = [
    turn("", ("add", {"a": 1, "b": 2})),
    turn("", ("add", {"a": 3, "b": 4}), ("add", {"a": 5, "b": 6})),
    turn("The sums are 3, 7 and 11."),
]


def cut_after(events: list[Event], predicate: Any, nth: int = 1) -> list[Event]:
    """The journal as it stood when the process died right after the nth matching event."""
    seen = 0
    for index, event in enumerate(events):
        if predicate(event):
            seen += 1
            if seen == nth:
                return events[: index + 1]
    raise AssertionError("no such event")


async def resume(h: Harness, journal: list[Event], script: list[ScriptedTurn]) -> Any:
    """Resume with a fresh model (another process): it has made no request yet."""
    h.model.turns, h.model.requests = list(script), []
    h.events = list(journal)
    return await AgentLoop(h.agent, "run_test", h.sink).resume(journal)


@pytest.mark.parametrize(
    ("crash_point", "nth", "model_calls_left"),
    [
        (EventType.MESSAGE_CREATE, 1, 2),  # the first model response was journaled
        (EventType.TOOL_RESULT, 1, 2),  # the first tool result was journaled
        (EventType.TOOL_RESULT, 2, 1),  # one of two parallel results was journaled
        (EventType.STEP_FINISH, 2, 1),
    ],
)
async def test_resumed_run_calls_each_model_turn_and_tool_exactly_once(
    tmp_path: Path, crash_point: EventType, nth: int, model_calls_left: int
) -> None:
    full = Harness(list(THREE_STEPS), [FunctionTool("add", add, ADD_SCHEMA)], tmp_path)
    await full.run("sum things")
    journal = cut_after(full.events, lambda e: e.type is crash_point, nth)

    tool = FunctionTool("add", add, ADD_SCHEMA)
    tool.idempotent = True
    h = Harness([], [tool], tmp_path)
    result = await resume(h, journal, THREE_STEPS)

    assert result.state is RunState.SUCCEEDED
    assert result.output == "The sums are 3, 7 and 11."
    assert len(h.model.requests) == model_calls_left
    executed_before = sum(1 for e in journal if e.type is EventType.TOOL_RESULT)
    assert len(tool.calls) == 3 - executed_before  # every call ran once, across both processes
    # The resumed model saw exactly the conversation the first process built.
    assert [m.role for m in result.messages] == [
        "system", "user", "assistant", "tool", "assistant", "tool", "tool", "assistant",
    ]  # fmt: skip
    assert [e.seq for e in h.events] == list(range(1, len(h.events) + 1))
    assert replay(h.events).finished


async def test_interrupted_non_idempotent_call_waits_for_a_human(tmp_path: Path) -> None:
    full = Harness(list(THREE_STEPS), [FunctionTool("add", add, ADD_SCHEMA)], tmp_path)
    await full.run("sum things")
    journal = cut_after(full.events, lambda e: e.type is EventType.TOOL_CALL)

    tool = FunctionTool("add", add, ADD_SCHEMA)  # not idempotent
    h = Harness([], [tool], tmp_path)
    result = await resume(h, journal, THREE_STEPS)

    assert result.state is RunState.WAITING_APPROVAL
    assert tool.calls == []  # never silently run twice
    [pending] = result.pending_approvals
    assert pending.call_id == "call_1_1"
    assert pending.reason == (
        "the call to 'add' was interrupted (its worker stopped) and its outcome is unknown; "
        "the tool is not idempotent, so running it again needs a human's approval"
    )

    # A human approves: it runs exactly once and the run completes.
    approved = await AgentLoop(h.agent, "run_test", h.sink).resume(
        list(h.events), {"call_1_1": (True, None)}
    )
    assert approved.state is RunState.SUCCEEDED
    assert len(tool.calls) == 3
    resolved = [e.data.to_dict() for e in h.events if e.type is EventType.APPROVAL_RESOLVED]
    assert resolved == [
        {"step": 1, "call_id": "call_1_1", "tool": "add", "approved": True, "reason": None}
    ]


async def test_interrupted_idempotent_call_is_simply_run_again(tmp_path: Path) -> None:
    full = Harness(list(THREE_STEPS), [FunctionTool("add", add, ADD_SCHEMA)], tmp_path)
    await full.run("sum things")
    journal = cut_after(full.events, lambda e: e.type is EventType.TOOL_CALL)
    tool = FunctionTool("add", add, ADD_SCHEMA)
    tool.idempotent = True
    h = Harness([], [tool], tmp_path)
    result = await resume(h, journal, THREE_STEPS)
    assert result.state is RunState.SUCCEEDED and len(tool.calls) == 3


async def test_agent_may_fail_runs_with_interrupted_calls(tmp_path: Path) -> None:
    full = Harness(list(THREE_STEPS), [FunctionTool("add", add, ADD_SCHEMA)], tmp_path)
    await full.run("sum things")
    journal = cut_after(full.events, lambda e: e.type is EventType.TOOL_CALL)
    h = Harness([], [FunctionTool("add", add, ADD_SCHEMA)], tmp_path)
    h.agent.interrupted_calls = "fail"
    result = await resume(h, journal, THREE_STEPS)
    assert result.state is RunState.FAILED
    assert result.error == {
        "code": "error",
        "message": "the call to 'add' was interrupted (its worker stopped) and its outcome is "
        "unknown; the agent fails such runs",
    }


def approval_harness(tmp_path: Path) -> tuple[Harness, FunctionTool, FunctionTool]:
    safe = FunctionTool("add", add, ADD_SCHEMA)
    risky = FunctionTool("wire_money", lambda amount: f"sent {amount}")
    h = Harness(
        [
            turn("", ("add", {"a": 1, "b": 2}), ("wire_money", {"amount": 5})),
            turn("finished"),
        ],
        [safe, risky],
        tmp_path,
        approval=ApprovalPolicy(policy="by_risk", min_risk="high"),
    )
    from corral.tools.governance import ToolPolicy

    h.agent.toolset.by_name["wire_money"].policy = ToolPolicy(risk="high")
    return h, safe, risky


async def test_approved_call_runs_once_and_siblings_are_not_repeated(tmp_path: Path) -> None:
    h, safe, risky = approval_harness(tmp_path)
    paused = await h.run()
    assert paused.state is RunState.WAITING_APPROVAL and risky.calls == []

    h.model.requests = []
    result = await AgentLoop(h.agent, "run_test", h.sink).resume(
        list(h.events), {"call_1_2": (True, "looks fine")}
    )
    assert result.state is RunState.SUCCEEDED and result.output == "finished"
    assert safe.calls == [{"a": 1, "b": 2}] and risky.calls == [{"amount": 5}]
    # Each result went to its own call, in call order.
    tool_messages = [m for m in h.model.requests[0] if m.role == "tool"]
    assert [(m.tool_call_id, m.content) for m in tool_messages] == [
        ("call_1_1", "3"),
        ("call_1_2", "sent 5"),
    ]


async def test_rejected_call_is_reported_to_the_model(tmp_path: Path) -> None:
    h, _, risky = approval_harness(tmp_path)
    await h.run()
    h.model.requests = []
    decision = Decision(False, "too much", by="alice", decided_at=1767225600.5, approval_id="apr_1")
    result = await AgentLoop(h.agent, "run_test", h.sink).resume(
        list(h.events), {"call_1_2": decision}
    )
    assert result.state is RunState.SUCCEEDED and risky.calls == []
    rejected = next(m for m in h.model.requests[0] if m.tool_call_id == "call_1_2")
    error = json.loads(rejected.content)["error"]
    assert error["code"] == "approval_rejected" and "too much" in error["message"]
    # who decided, when, and which approval it was, are journaled with the decision
    [resolved] = [e.data.to_dict() for e in h.events if e.type is EventType.APPROVAL_RESOLVED]
    assert resolved["approved"] is False and resolved["reason"] == "too much"
    assert (resolved["by"], resolved["decided_at"], resolved["approval_id"]) == (
        "alice",
        1767225600.5,
        "apr_1",
    )


async def test_resume_without_a_decision_stays_waiting(tmp_path: Path) -> None:
    h, _, risky = approval_harness(tmp_path)
    await h.run()
    before = len(h.events)
    result = await AgentLoop(h.agent, "run_test", h.sink).resume(list(h.events))
    assert result.state is RunState.WAITING_APPROVAL and risky.calls == []
    assert len(h.events) == before + 1  # only the step's finish; nothing ran


async def test_finished_runs_cannot_be_resumed(tmp_path: Path) -> None:
    h = Harness([turn("hi")], [], tmp_path)
    await h.run()
    with pytest.raises(CorralError, match="already finished"):
        await AgentLoop(h.agent, "run_test", h.sink).resume(list(h.events))


def test_replay_rebuilds_usage_and_steps(tmp_path: Path) -> None:
    events = [
        Event("r", 1, RunStartData(agent=None, input="x", messages=[])),
        Event(
            "r",
            2,
            MessageCreateData(
                step=1,
                message={"role": "assistant", "content": "ok"},
                usage={"input_tokens": 7, "output_tokens": 3, "requests": 1},
                cost_usd=0.5,
            ),
        ),
    ]
    checkpoint = replay(events)
    assert (checkpoint.steps, checkpoint.usage.total_tokens, checkpoint.cost_usd) == (1, 10, 0.5)
    assert checkpoint.final is not None and checkpoint.final.content == "ok"
    assert not checkpoint.finished
