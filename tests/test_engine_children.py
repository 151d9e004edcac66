"""The engine's side of child runs: a tool answering with a ChildRun parks the run in
``waiting_children``; resuming with the child records its outcome as the call's result."""

from __future__ import annotations

from pathlib import Path

from corral.core.events import EventType
from corral.core.messages import Usage
from corral.core.runs import RunRecord, RunState
from corral.engine.loop import AgentLoop
from corral.engine.replay import replay
from corral.resources.kinds import Limits
from corral.tools.base import ChildRun, ToolContext
from test_engine import FunctionTool, Harness, turn

SCRIPT = [turn("", ("delegate", {})), turn("the child said so")]


def delegate() -> ChildRun:
    return ChildRun("run_child", "helper")


def child(state: RunState, output: object = None, **fields: object) -> RunRecord:
    record = RunRecord("run_child", "default", "helper", "x", state=state, output=output)
    for name, value in fields.items():
        setattr(record, name, value)
    return record


async def parked(tmp_path: Path, limits: Limits | None = None) -> Harness:
    h = Harness(list(SCRIPT), [FunctionTool("delegate", delegate)], tmp_path, limits=limits)
    result = await h.run()
    assert result.state is RunState.WAITING_CHILDREN
    kinds = [e.type for e in h.events]
    assert EventType.RUN_FINISH not in kinds  # parked, not ended
    assert kinds[-3:] == [EventType.TOOL_CALL, EventType.CHILD_START, EventType.STEP_FINISH]
    assert replay(h.events).open_step is not None
    return h


async def resume(h: Harness, children: dict[str, RunRecord]) -> tuple[RunState, list[dict]]:
    journal = list(h.events)
    h.model.requests = []
    result = await AgentLoop(h.agent, "run_test", h.sink).resume(journal, {}, children)
    new = h.events[len(journal) :]
    return result.state, [e.data.to_dict() for e in new if e.type is EventType.TOOL_RESULT]


async def test_a_child_still_running_leaves_the_run_parked(tmp_path: Path) -> None:
    h = await parked(tmp_path)
    state, results = await resume(h, {"run_child": child(RunState.RUNNING)})
    assert (state, results, h.model.requests) == (RunState.WAITING_CHILDREN, [], [])


async def test_a_finished_child_answers_the_call_and_its_spend_is_the_runs(
    tmp_path: Path,
) -> None:
    h = await parked(tmp_path)
    spent = Usage(input_tokens=40, output_tokens=2, requests=1)
    done = child(RunState.SUCCEEDED, "42", usage=spent, cost_usd=0.5)
    state, results = await resume(h, {"run_child": done})
    assert state is RunState.SUCCEEDED
    assert [r["output"] for r in results] == ["42"]
    finish = next(e for e in h.events if e.type is EventType.CHILD_FINISH)
    assert (finish.data.run_id, finish.data.state) == ("run_child", "succeeded")
    checkpoint = replay(h.events)
    assert checkpoint.usage.input_tokens == 40 and checkpoint.cost_usd == 0.5
    assert h.events[-1].data.cost_usd == 0.5  # run.finish counts the child's cost


async def test_a_failed_or_missing_child_is_a_child_failed_tool_error(tmp_path: Path) -> None:
    h = await parked(tmp_path)
    failed = child(RunState.DEAD_LETTER, error={"code": "model_error", "message": "down"})
    state, results = await resume(h, {"run_child": failed})
    assert state is RunState.SUCCEEDED
    (error,) = [r["error"] for r in results]
    assert error["code"] == "child_failed" and "model_error: down" in error["reason"]
    assert error["details"]["state"] == "dead_letter"

    h = await parked(tmp_path)
    state, results = await resume(h, {})  # the child run was deleted
    assert state is RunState.SUCCEEDED
    assert results[0]["error"]["code"] == "child_failed"
    assert "gone" in results[0]["error"]["reason"]


async def test_a_childs_cost_past_the_runs_limit_fails_it_after_the_result(
    tmp_path: Path,
) -> None:
    h = await parked(tmp_path, Limits(max_cost_usd=0.1))
    state, results = await resume(h, {"run_child": child(RunState.SUCCEEDED, "ok", cost_usd=1.0)})
    assert state is RunState.FAILED
    assert [r["output"] for r in results] == ["ok"]
    error = next(e for e in h.events if e.type is EventType.ERROR)
    assert (error.data.code, error.data.limit) == ("budget_exceeded", "max_cost_usd")


class Spender(FunctionTool):
    """A tool starting a child run per call (as ``agents_exec``), recording what each call
    was given to spend."""

    starts_children = True

    def __init__(self) -> None:
        super().__init__("delegate", delegate)
        self.given: list[tuple[float | None, int | None]] = []

    async def call(self, arguments: dict[str, object], ctx: ToolContext) -> ChildRun:
        self.given.append((ctx.cost_left, ctx.tokens_left))
        return ChildRun(f"run_child_{len(self.given)}", "helper")


class Looker(FunctionTool):
    """A tool starting nothing, recording what its call was given."""

    def __init__(self) -> None:
        super().__init__("look", lambda: "seen")
        self.given: list[tuple[float | None, int | None]] = []

    async def call(self, arguments: dict[str, object], ctx: ToolContext) -> str:
        self.given.append((ctx.cost_left, ctx.tokens_left))
        return "seen"


FAN_OUT = [turn("", ("delegate", {}), ("look", {}), ("delegate", {}), ("delegate", {}), tokens=3)]


async def test_the_calls_of_a_step_that_start_children_share_what_the_run_has_left(
    tmp_path: Path,
) -> None:
    # max $3 and 30 tokens; the first turn used 6 tokens: three children at once may
    # spend $1 and 8 tokens each (all three spending all of it: what the run had left),
    # not $3 and 24 each; the call that starts nothing is told the whole remainder
    spender, looker = Spender(), Looker()
    limits = Limits(max_cost_usd=3.0, max_tokens=30)
    h = Harness(list(FAN_OUT), [spender, looker], tmp_path, limits=limits)
    assert (await h.run()).state is RunState.WAITING_CHILDREN
    assert spender.given == [(1.0, 8)] * 3
    assert looker.given == [(3.0, 24)]


async def test_a_resumed_step_gives_its_other_calls_what_its_running_children_do_not_hold(
    tmp_path: Path,
) -> None:
    # the worker died after the step's first two children started: the third call, run
    # again, may spend what the run has left less the two children's caps
    spender, looker = Spender(), Looker()
    limits = Limits(max_cost_usd=3.0, max_tokens=30)
    h = Harness(list(FAN_OUT), [spender, looker], tmp_path, limits=limits)
    await h.run()
    # the journal as if the worker died before the step's last call started its child
    last_call = next(e.data.call_id for e in reversed(h.events) if e.type is EventType.CHILD_START)
    journal = [
        e
        for e in h.events
        if e.data.to_dict().get("call_id") != last_call and e.type is not EventType.STEP_FINISH
    ]
    running = {
        f"run_child_{n}": child(RunState.RUNNING, max_cost_usd=1.0, max_tokens=8) for n in (1, 2)
    }
    for run_id, record in running.items():
        record.id = run_id
    spender.given = []
    result = await AgentLoop(h.agent, "run_test", h.sink).resume(journal, {}, running)
    assert result.state is RunState.WAITING_CHILDREN
    assert spender.given == [(1.0, 8)]


async def test_children_tool_programs_started_hold_their_part_of_the_shares(
    tmp_path: Path,
) -> None:
    # two children tool programs started over the API, not yet charged: one running
    # ($0.50 and 5 tokens its caps), one ended (it spent $0.25 and 3 tokens). The three
    # calls share what the run has left less those: $2.25 and 16 tokens, not $3 and 24
    running = child(RunState.RUNNING, max_cost_usd=0.5, max_tokens=5)
    ended = child(RunState.SUCCEEDED, cost_usd=0.25, usage=Usage(input_tokens=3))
    asked: list[set[str]] = []

    async def outside(known: set[str]) -> list[RunRecord]:
        asked.append(set(known))
        return [running, ended]

    spender, looker = Spender(), Looker()
    limits = Limits(max_cost_usd=3.0, max_tokens=30)
    h = Harness(list(FAN_OUT), [spender, looker], tmp_path, limits=limits)
    loop = AgentLoop(h.agent, "run_test", h.sink, outside_children=outside)
    assert (await loop.run("go")).state is RunState.WAITING_CHILDREN
    assert asked == [set(), set()]  # for the model turn's worst case, then for the calls
    assert spender.given == [(0.75, 5)] * 3
    assert looker.given == [(3.0, 24)]


class Program(FunctionTool):
    """A tool whose process gets the planted variables (an exec tool): its call is handed
    an agent token carrying what the call may spend."""

    plants_environment = True

    def __init__(self) -> None:
        super().__init__("program", lambda: "ran")


async def test_a_step_mixing_programs_and_agents_exec_splits_the_remainder_between_them(
    tmp_path: Path,
) -> None:
    # one agents_exec call and two program calls (each handed a token) in one step: three
    # ways, each minted for its own call (STEP:INDEX); the call starting nothing is told
    # all of it
    minted: list[tuple[str, float | None, int | None]] = []

    def environment(
        call: str, cost: float | None, tokens: int | None
    ) -> tuple[dict[str, str], dict[str, str]]:
        minted.append((call, cost, tokens))
        return {}, {}

    spender, looker = Spender(), Looker()
    script = [turn("", ("program", {}), ("delegate", {}), ("look", {}), ("program", {}), tokens=3)]
    limits = Limits(max_cost_usd=3.0, max_tokens=30)
    h = Harness(script, [spender, looker, Program()], tmp_path, limits=limits)
    loop = AgentLoop(h.agent, "run_test", h.sink, call_environment=environment)
    assert (await loop.run("go")).state is RunState.WAITING_CHILDREN
    assert sorted(minted) == [("1:0", 1.0, 8), ("1:3", 1.0, 8)]
    assert spender.given == [(1.0, 8)]
    assert looker.given == [(3.0, 24)]
