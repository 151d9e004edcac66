"""The agent loop and the governance layer, driven by the scripted model and in-test tools."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.core.errors import ToolError, ToolErrorCode
from corral.core.events import Event, EventType
from corral.core.messages import Message, ToolSpec
from corral.core.redaction import Redactor
from corral.core.runs import RunState
from corral.engine.loop import AgentDefinition, AgentLoop, RunResult
from corral.models.gateway import PricedModel
from corral.models.scripted import ScriptedModel
from corral.resources.kinds import (
    ApprovalPolicy,
    CircuitBreakerPolicy,
    Limits,
    Pricing,
    RetryPolicy,
    ScriptedToolCall,
    ScriptedTurn,
)
from corral.tools.base import Tool, ToolContext
from corral.tools.governance import GovernedTool, Permissions, ToolPolicy, Toolset

ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}


class FunctionTool(Tool):
    """A tool backed by an in-test async function; records every call it really executes."""

    def __init__(self, name: str, fn: Callable[..., Any], schema: dict[str, Any] | None = None):
        self.ref = name
        self.spec = ToolSpec(name, f"the {name} tool", schema or {"type": "object"})
        self.fn = fn
        self.calls: list[dict[str, Any]] = []

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        self.calls.append(arguments)
        result = self.fn(**arguments)
        if hasattr(result, "__await__"):
            result = await result
        return result


def turn(text: str = "", *calls: tuple[str, dict[str, Any] | str], tokens: int = 0) -> ScriptedTurn:
    return ScriptedTurn(
        text=text,
        tool_calls=[ScriptedToolCall(name=n, arguments=a) for n, a in calls],
        input_tokens=tokens,
        output_tokens=tokens,
    )


class Harness:
    def __init__(
        self,
        turns: list[ScriptedTurn],
        tools: list[Tool],
        tmp_path: Path,
        *,
        policy: ToolPolicy | None = None,
        permissions: Permissions | None = None,
        approval: ApprovalPolicy | None = None,
        secrets: dict[str, str] | None = None,
        limits: Limits | None = None,
        output_schema: dict[str, Any] | None = None,
        pricing: Pricing | None = None,
        stream: bool = True,
    ) -> None:
        self.model = ScriptedModel(turns)
        self.events: list[Event] = []
        toolset = Toolset(
            [GovernedTool(t, policy or ToolPolicy()) for t in tools],
            permissions=permissions,
            approval=approval,
            redactor=Redactor(secrets),
        )
        self.agent = AgentDefinition(
            name="tester",
            model=PricedModel(self.model, pricing) if pricing else self.model,
            toolset=toolset,
            instructions="You are a test agent.",
            limits=limits or Limits(),
            output_schema=output_schema,
            stream=stream,
            workspace=tmp_path,
        )

    async def sink(self, event: Event) -> None:
        self.events.append(event)

    async def run(self, prompt: str = "go") -> RunResult:
        return await AgentLoop(self.agent, "run_test", self.sink).run(prompt)

    def of(self, kind: EventType) -> list[dict[str, Any]]:
        return [e.data.to_dict() for e in self.events if e.type is kind]


def add(a: int, b: int) -> int:
    return a + b


async def test_multi_step_tool_run_emits_ordered_events(tmp_path: Path) -> None:
    tool = FunctionTool("add", add, ADD_SCHEMA)
    h = Harness([turn("", ("add", {"a": 2, "b": 3})), turn("The sum is 5.")], [tool], tmp_path)
    result = await h.run("what is 2+3?")

    assert result.state is RunState.SUCCEEDED
    assert result.output == "The sum is 5."
    assert tool.calls == [{"a": 2, "b": 3}]
    assert [e.seq for e in h.events] == list(range(1, len(h.events) + 1))
    assert [e.type.value for e in h.events] == [
        "run.start",
        "step.start",
        "message.create",
        "tool.call",
        "tool.result",
        "step.finish",
        "step.start",
        "text.delta",
        "message.create",
        "step.finish",
        "run.finish",
    ]
    # The model saw the tool result on its second turn.
    second = h.model.requests[1]
    assert second[-1].role == "tool" and second[-1].content == "5"
    assert h.of(EventType.TOOL_RESULT)[0]["output"] == "5"


async def test_parallel_calls_run_concurrently_and_results_keep_call_order(tmp_path: Path) -> None:
    both_started = anyio.Event()
    started: list[str] = []

    async def slow(tag: str) -> str:
        started.append(tag)
        if len(started) == 2:
            both_started.set()
        with anyio.fail_after(2):  # deadlocks (and fails) if the calls ran one after the other
            await both_started.wait()
        return f"done {tag}"

    tool = FunctionTool("slow", slow)
    h = Harness(
        [turn("", ("slow", {"tag": "first"}), ("slow", {"tag": "second"})), turn("ok")],
        [tool],
        tmp_path,
    )
    result = await h.run()
    assert result.state is RunState.SUCCEEDED
    tool_messages = [m for m in result.messages if m.role == "tool"]
    assert [m.content for m in tool_messages] == ["done first", "done second"]
    assert [m.tool_call_id for m in tool_messages] == ["call_1_1", "call_1_2"]


async def test_invalid_arguments_go_back_to_the_model_which_corrects_them(tmp_path: Path) -> None:
    tool = FunctionTool("add", add, ADD_SCHEMA)
    h = Harness(
        [
            turn("", ("add", {"a": "two", "b": 3})),
            turn("", ("add", "{not json")),
            turn("", ("add", {"a": 2, "b": 3})),
            turn("5"),
        ],
        [tool],
        tmp_path,
    )
    result = await h.run()
    assert result.state is RunState.SUCCEEDED
    assert tool.calls == [{"a": 2, "b": 3}]  # the bad calls never reached the tool
    errors = [r["error"] for r in h.of(EventType.TOOL_RESULT) if r["error"]]
    assert [e["code"] for e in errors] == ["invalid_input", "invalid_input"]
    assert "a: 'two' is not of type 'integer'" in errors[0]["reason"]
    seen_by_model = json.loads(h.model.requests[1][-1].content)
    assert seen_by_model["error"]["code"] == "invalid_input"


async def test_unknown_tool_is_reported_to_the_model(tmp_path: Path) -> None:
    h = Harness([turn("", ("nope", {})), turn("sorry")], [], tmp_path)
    result = await h.run()
    assert result.state is RunState.SUCCEEDED
    assert h.of(EventType.TOOL_RESULT)[0]["error"]["code"] == "unsupported_tool"


async def test_permission_denied_fails_closed(tmp_path: Path) -> None:
    tool = FunctionTool("add", add, ADD_SCHEMA)
    only_other = Permissions([("allow", ["mcp:files/*"])])
    h = Harness(
        [turn("", ("add", {"a": 1, "b": 1})), turn("cannot")],
        [tool],
        tmp_path,
        permissions=only_other,
    )
    await h.run()
    assert tool.calls == []
    assert h.of(EventType.TOOL_RESULT)[0]["error"]["code"] == "permission_denied"


def test_permissions_deny_wins_over_allow() -> None:
    perms = Permissions([("allow", ["*"]), ("deny", ["mcp:shell/*"])])
    perms.check("add")
    with pytest.raises(ToolError) as denied:
        perms.check("mcp:shell/run")
    assert denied.value.code == "permission_denied"


async def test_approval_required_pauses_the_run_after_the_other_calls(tmp_path: Path) -> None:
    safe = FunctionTool("add", add, ADD_SCHEMA)
    risky = FunctionTool("delete_all", lambda: "deleted")
    h = Harness(
        [turn("", ("add", {"a": 1, "b": 2}), ("delete_all", {}))],
        [safe, risky],
        tmp_path,
        approval=ApprovalPolicy(policy="always"),
    )
    # Tool-level "never" lets add through while the agent policy is "always".
    h.agent.toolset.by_name["add"].policy = ToolPolicy(approval="never")
    result = await h.run()
    assert result.state is RunState.WAITING_APPROVAL
    assert risky.calls == [] and safe.calls == [{"a": 1, "b": 2}]
    [pending] = result.pending_approvals
    assert (pending.tool, pending.call_id, pending.arguments) == ("delete_all", "call_1_2", "{}")
    assert h.of(EventType.APPROVAL_REQUESTED)[0]["tool"] == "delete_all"
    assert h.of(EventType.RUN_FINISH) == []  # paused, not finished
    # The completed sibling's result is journaled for the resumed run.
    assert [r["call_id"] for r in h.of(EventType.TOOL_RESULT)] == ["call_1_1"]


async def test_approval_by_risk_level(tmp_path: Path) -> None:
    tool = FunctionTool("add", add, ADD_SCHEMA)
    by_risk = ApprovalPolicy(policy="by_risk", min_risk="medium")
    low = Harness(
        [turn("", ("add", {"a": 1, "b": 2})), turn("3")], [tool], tmp_path, approval=by_risk
    )
    assert (await low.run()).state is RunState.SUCCEEDED
    high = Harness(
        [turn("", ("add", {"a": 1, "b": 2}))],
        [tool],
        tmp_path,
        approval=by_risk,
        policy=ToolPolicy(risk="high"),
    )
    assert (await high.run()).state is RunState.WAITING_APPROVAL


async def test_circuit_opens_after_repeated_failures(tmp_path: Path) -> None:
    def broken() -> str:
        raise ToolError(ToolErrorCode.EXECUTION_FAILED, "backend down")

    tool = FunctionTool("flaky", broken)
    policy = ToolPolicy(breaker=CircuitBreakerPolicy(failure_threshold=2, reset_seconds=60))
    h = Harness(
        [turn("", ("flaky", {})) for _ in range(3)] + [turn("giving up")],
        [tool],
        tmp_path,
        policy=policy,
    )
    await h.run()
    codes = [r["error"]["code"] for r in h.of(EventType.TOOL_RESULT)]
    assert codes == ["execution_failed", "execution_failed", "circuit_open"]
    assert len(tool.calls) == 2  # the third call never reached the tool


async def test_retryable_tool_errors_are_retried(tmp_path: Path) -> None:
    failures = [ToolError(ToolErrorCode.UNAVAILABLE, "try later", retryable=True)]

    def sometimes() -> str:
        if failures:
            raise failures.pop()
        return "ok"

    tool = FunctionTool("sometimes", sometimes)
    policy = ToolPolicy(retry=RetryPolicy(max_attempts=3, initial_backoff_seconds=0.01))
    h = Harness([turn("", ("sometimes", {})), turn("fine")], [tool], tmp_path, policy=policy)
    await h.run()
    [result] = h.of(EventType.TOOL_RESULT)
    assert (result["output"], result["attempts"], result["error"]) == ("ok", 2, None)


async def test_attempts_count_the_tries_of_a_call_that_failed(tmp_path: Path) -> None:
    def down() -> str:
        raise ToolError(ToolErrorCode.UNAVAILABLE, "try later", retryable=True)

    def wrong() -> str:
        raise ToolError(ToolErrorCode.EXECUTION_FAILED, "no")

    policy = ToolPolicy(
        retry=RetryPolicy(max_attempts=3, initial_backoff_seconds=0.0),
        breaker=CircuitBreakerPolicy(failure_threshold=2, reset_seconds=60),
    )
    h = Harness(
        [turn("", ("down", {}), ("wrong", {})), turn("", ("down", {})), turn("gave up")],
        [FunctionTool("down", down), FunctionTool("wrong", wrong)],
        tmp_path,
        policy=policy,
    )
    await h.run()
    results = sorted((r["error"]["code"], r["attempts"]) for r in h.of(EventType.TOOL_RESULT))
    # retried until the breaker opened (2 failures); failed once; never ran (circuit open)
    assert results == [("circuit_open", 0), ("execution_failed", 1), ("unavailable", 2)]


async def test_tool_timeout_is_a_structured_error(tmp_path: Path) -> None:
    async def hang() -> str:
        await anyio.sleep(30)
        return "never"

    h = Harness(
        [turn("", ("hang", {})), turn("timed out")],
        [FunctionTool("hang", hang)],
        tmp_path,
        policy=ToolPolicy(timeout_seconds=0.2),
    )
    with anyio.fail_after(5):
        await h.run()
    error = h.of(EventType.TOOL_RESULT)[0]["error"]
    assert error["code"] == "timeout" and error["retryable"] is True


async def test_output_is_capped(tmp_path: Path) -> None:
    h = Harness(
        [turn("", ("big", {})), turn("ok")],
        [FunctionTool("big", lambda: "x" * 10_000)],
        tmp_path,
        policy=ToolPolicy(max_output_bytes=100),
    )
    await h.run()
    output = h.of(EventType.TOOL_RESULT)[0]["output"]
    assert output.startswith("x" * 100) and "9900 of 10000 bytes cut" in output


async def test_secret_values_are_redacted_from_outputs_and_events(tmp_path: Path) -> None:
    secret = "sk-live-abcdef123456"
    h = Harness(
        [turn("", ("leak", {})), turn(f"the key is {secret}")],
        [FunctionTool("leak", lambda: {"token": secret})],
        tmp_path,
        secrets={"api-token": secret},
    )
    result = await h.run()
    assert all(secret not in json.dumps(e.data.to_dict()) for e in h.events)
    tool_message = next(m for m in result.messages if m.role == "tool")
    assert secret not in tool_message.content
    assert "[REDACTED:api-token]" in tool_message.content


@pytest.mark.parametrize(
    ("limits", "turns", "limit"),
    [
        (Limits(max_steps=2), [turn("", ("add", {"a": 1, "b": 1}))] * 3, "max_steps"),
        (Limits(max_tokens=50), [turn("", ("add", {"a": 1, "b": 1}), tokens=30)], "max_tokens"),
    ],
)
async def test_budgets_stop_the_run(
    tmp_path: Path, limits: Limits, turns: list[ScriptedTurn], limit: str
) -> None:
    tool = FunctionTool("add", add, ADD_SCHEMA)
    h = Harness(turns, [tool], tmp_path, limits=limits)
    result = await h.run()
    assert result.state is RunState.FAILED
    assert result.error is not None
    assert (result.error["code"], result.error["limit"]) == ("budget_exceeded", limit)
    assert h.events[-2].type is EventType.ERROR and h.events[-1].type is EventType.RUN_FINISH


async def test_cost_budget_uses_endpoint_pricing(tmp_path: Path) -> None:
    h = Harness(
        [turn("", ("add", {"a": 1, "b": 1}), tokens=1000)] * 3,
        [FunctionTool("add", add, ADD_SCHEMA)],
        tmp_path,
        limits=Limits(max_cost_usd=0.01),
        pricing=Pricing(input_per_million=3.0, output_per_million=3.0),  # $0.006 a turn
    )
    result = await h.run()
    assert result.error is not None and result.error["limit"] == "max_cost_usd"
    # the second turn ($0.006 at worst, $0.004 left) is refused before it is paid
    assert len(h.model.requests) == 1 and result.cost_usd == pytest.approx(0.006)


@pytest.mark.parametrize(
    ("own", "cap", "inherited"), [(0.01, 0.05, False), (0.05, 0.01, True), (None, 0.01, True)]
)
async def test_a_budget_error_says_whether_the_cap_the_run_was_given_stopped_it(
    tmp_path: Path, own: float | None, cap: float, inherited: bool
) -> None:
    # $0.006 a turn: whichever of the agent's own limit and the run's cap (what its parent
    # or system had left) is lower stops the second turn; an agent_exec parent or a system
    # reads "inherited" as its own budget having run out
    h = Harness(
        [turn("", ("add", {"a": 1, "b": 1}), tokens=1000)] * 3,
        [FunctionTool("add", add, ADD_SCHEMA)],
        tmp_path,
        limits=Limits(max_cost_usd=own),
        pricing=Pricing(input_per_million=3.0, output_per_million=3.0),
    )
    result = await AgentLoop(h.agent, "run_test", h.sink, cost_cap=cap).run("go")
    assert result.error is not None and result.error["limit"] == "max_cost_usd"
    assert result.error.get("inherited", False) is inherited
    assert result.cost_usd == pytest.approx(0.006)


async def test_run_timeout_cancels_a_slow_tool(tmp_path: Path) -> None:
    async def hang() -> str:
        await anyio.sleep(30)
        return "never"

    h = Harness(
        [turn("", ("hang", {}))],
        [FunctionTool("hang", hang)],
        tmp_path,
        limits=Limits(timeout_seconds=0.3),
    )
    with anyio.fail_after(5):
        result = await h.run()
    assert result.error is not None and result.error["limit"] == "timeout"


async def test_structured_output_is_repaired_then_validated(tmp_path: Path) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"],
    }
    h = Harness(
        [turn('{"city": "Oslo"}'), turn('```json\n{"city": "Oslo", "population": 709000}\n```')],
        [],
        tmp_path,
        output_schema=schema,
    )
    result = await h.run("Largest city of Norway?")
    assert result.state is RunState.SUCCEEDED
    assert result.output == {"city": "Oslo", "population": 709000}
    assert "population" in h.model.requests[1][-1].content  # the repair prompt names the problem
    assert "JSON Schema" in h.model.requests[0][0].content


async def test_structured_output_fails_after_bounded_repairs(tmp_path: Path) -> None:
    h = Harness(
        [turn("no json here")] * 3,
        [],
        tmp_path,
        output_schema={"type": "object"},
    )
    h.agent.output_retries = 2
    result = await h.run()
    assert result.state is RunState.FAILED
    assert result.error is not None and result.error["code"] == "invalid_output"
    assert len(h.model.requests) == 3


async def test_non_streaming_mode_emits_no_deltas(tmp_path: Path) -> None:
    h = Harness([turn("hello")], [], tmp_path, stream=False)
    result = await h.run()
    assert result.output == "hello"
    assert h.of(EventType.TEXT_DELTA) == []


async def test_history_is_sent_before_the_new_input(tmp_path: Path) -> None:
    h = Harness([turn("Your name is Ada.")], [], tmp_path)
    history = [Message.user("My name is Ada."), Message.assistant("Nice to meet you, Ada.")]
    await AgentLoop(h.agent, "run_hist", h.sink).run("What is my name?", history)
    sent = h.model.requests[0]
    assert [m.content for m in sent[1:]] == [
        "My name is Ada.",
        "Nice to meet you, Ada.",
        "What is my name?",
    ]
