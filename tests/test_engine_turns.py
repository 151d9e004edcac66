"""What each model turn of a run is sent and may spend, against the real ``openai`` provider
and a fake OpenAI-compatible server over HTTP: a forced ``tool_choice`` goes back to
``auto`` once the run called a tool; a turn is made only when its worst case fits in
what the run has left; a server that reports no usage gets it estimated."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from corral.core.errors import ResourceError
from corral.core.events import Event, EventType
from corral.core.messages import Message, ModelResponse, ToolSpec
from corral.core.runs import RunState
from corral.engine.loop import AgentDefinition, AgentLoop, RunResult
from corral.models.base import DEFAULT_OUTPUT_TOKENS, Model, ModelSettings, NamedTool, ToolChoice
from corral.models.registry import build_model
from corral.models.scripted import ScriptedModel
from corral.resources.kinds import ApprovalPolicy, Limits, Pricing, ScriptedToolCall, ScriptedTurn
from corral.resources.loader import load_text
from corral.testing.fake_openai import FakeOpenAIServer, FakeReply, FakeToolCall, ToolLoop
from corral.tools.base import Tool, ToolContext
from corral.tools.governance import GovernedTool, ToolPolicy, Toolset
from fixtures_models import endpoint, fake_openai_fixture, openai_server_fixture

__all__ = ["fake_openai_fixture", "openai_server_fixture"]

ADD = ToolSpec(
    "add",
    "Add two integers.",
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)


class AddTool(Tool):
    ref = "add"
    spec = ADD

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        return int(arguments["a"]) + int(arguments["b"])


class Run:
    """One agent on the ``openai`` provider against ``server``, its events collected."""

    def __init__(
        self,
        server: FakeOpenAIServer,
        tmp_path: Path,
        *,
        settings: ModelSettings | None = None,
        limits: Limits | None = None,
        pricing: Pricing | None = None,
        stream: bool = True,
    ) -> None:
        spec = endpoint("openai", server.base_url, pricing=pricing)
        self.agent = AgentDefinition(
            name="adder",
            model=build_model("fake", spec, None),
            toolset=Toolset([GovernedTool(AddTool(), ToolPolicy())]),
            limits=limits or Limits(),
            model_settings=settings or ModelSettings(),
            stream=stream,
            workspace=tmp_path,
        )
        self.events: list[Event] = []

    async def sink(self, event: Event) -> None:
        self.events.append(event)

    async def __call__(self, prompt: str = "what is 17 + 25?") -> RunResult:
        try:
            return await AgentLoop(self.agent, "run_turns", self.sink).run(prompt)
        finally:
            await self.agent.model.aclose()

    def of(self, kind: EventType) -> list[dict[str, Any]]:
        return [e.data.to_dict() for e in self.events if e.type is kind]


ADD_CALL = FakeReply(tool_calls=[FakeToolCall("add", {"a": 17, "b": 25})])


# --------------------------------------------------------------------------- tool_choice


@pytest.mark.parametrize(
    ("forced", "wire"),
    [
        ("required", "required"),
        (NamedTool("add"), {"type": "function", "function": {"name": "add"}}),
    ],
)
@pytest.mark.parametrize("stream", [True, False])
async def test_a_forced_tool_choice_goes_back_to_auto_on_the_turn_with_the_result(
    fake_openai: FakeOpenAIServer, tmp_path: Path, forced: ToolChoice, wire: Any, stream: bool
) -> None:
    fake_openai.add_reply(ADD_CALL, FakeReply(text="42"))
    run = Run(fake_openai, tmp_path, settings=ModelSettings(tool_choice=forced), stream=stream)
    result = await run()
    assert (result.state, result.output) == (RunState.SUCCEEDED, "42")
    first, second = (r.json for r in fake_openai.requests)
    assert first["tool_choice"] == wire
    assert second["tool_choice"] == "auto"
    assert second["messages"][-1]["role"] == "tool"


async def test_every_turn_after_a_tool_call_is_auto_not_only_the_next(
    fake_openai: FakeOpenAIServer, tmp_path: Path
) -> None:
    fake_openai.add_reply(ADD_CALL, ADD_CALL, FakeReply(text="59"))
    run = Run(fake_openai, tmp_path, settings=ModelSettings(tool_choice="required"))
    assert (await run()).state is RunState.SUCCEEDED
    assert [r.json["tool_choice"] for r in fake_openai.requests] == ["required", "auto", "auto"]


async def test_reset_tool_choice_false_keeps_forcing_every_turn(
    fake_openai: FakeOpenAIServer, tmp_path: Path
) -> None:
    # a server that honours the forced choice: the model can only call the tool, until
    # the run's max_steps (what every forced run did before the reset)
    fake_openai.tool_loop = ToolLoop("add", calls=100, arguments={"a": 1, "b": 2})
    settings = ModelSettings(tool_choice="required", reset_tool_choice=False)
    run = Run(fake_openai, tmp_path, settings=settings, limits=Limits(max_steps=3))
    result = await run()
    assert result.state is RunState.FAILED and result.error is not None
    assert (result.error["code"], result.error["limit"]) == ("budget_exceeded", "max_steps")
    assert [r.json["tool_choice"] for r in fake_openai.requests] == ["required"] * 3


@pytest.mark.parametrize("choice", [None, "auto", "none"])
async def test_a_choice_that_forces_nothing_is_sent_as_it_is_on_every_turn(
    fake_openai: FakeOpenAIServer, tmp_path: Path, choice: ToolChoice
) -> None:
    fake_openai.add_reply(ADD_CALL, FakeReply(text="42"))
    run = Run(fake_openai, tmp_path, settings=ModelSettings(tool_choice=choice))
    assert (await run()).state is RunState.SUCCEEDED
    sent = [r.json.get("tool_choice", "(unset)") for r in fake_openai.requests]
    assert sent == [choice or "(unset)"] * 2


# --------------------------------------------------------------------------- usage estimated


async def test_a_stream_without_usage_is_estimated_and_the_token_limit_holds(
    tmp_path: Path,
) -> None:
    # llama.cpp's server ignores stream_options.include_usage: every turn reported 0 + 0
    # and the run went on until max_steps whatever its max_tokens
    with FakeOpenAIServer(stream_usage=False) as server:
        server.tool_loop = ToolLoop("add", calls=100, arguments={"a": 17, "b": 25})
        settings = ModelSettings(max_output_tokens=16)
        run = Run(server, tmp_path, settings=settings, limits=Limits(max_steps=60, max_tokens=1500))
        result = await run()
        requests = server.calls
    assert result.state is RunState.FAILED and result.error is not None
    assert (result.error["code"], result.error["limit"]) == ("budget_exceeded", "max_tokens")
    assert result.usage.source == "estimated" and 0 < result.usage.total_tokens <= 1500
    turns = run.of(EventType.MESSAGE_CREATE)
    assert len(turns) == requests < 60
    assert all(
        t["usage"]["source"] == "estimated" and t["usage"]["input_tokens"] > 0 for t in turns
    )
    assert run.of(EventType.WARNING) == [
        {"code": "usage_estimated", "message": run.of(EventType.WARNING)[0]["message"]}
    ]
    assert "'fake' reported no token usage" in run.of(EventType.WARNING)[0]["message"]
    assert run.of(EventType.RUN_FINISH)[0]["usage"]["source"] == "estimated"


async def test_an_estimated_usage_is_priced_and_the_cost_limit_holds(tmp_path: Path) -> None:
    with FakeOpenAIServer(stream_usage=False) as server:
        server.tool_loop = ToolLoop("add", calls=100, arguments={"a": 1, "b": 2})
        run = Run(
            server,
            tmp_path,
            settings=ModelSettings(max_output_tokens=16),
            limits=Limits(max_steps=60, max_cost_usd=0.5),
            pricing=Pricing(input_per_million=1000.0, output_per_million=1000.0),
        )
        result = await run()
    assert result.error is not None
    assert (result.error["code"], result.error["limit"]) == ("budget_exceeded", "max_cost_usd")
    assert 0 < result.cost_usd <= 0.5
    assert len(run.of(EventType.WARNING)) == 1


async def test_a_reported_usage_is_used_as_it_is_without_a_warning(
    fake_openai: FakeOpenAIServer, tmp_path: Path
) -> None:
    fake_openai.add_reply(ADD_CALL, FakeReply(text="42", input_tokens=30, output_tokens=2))
    result = await Run(fake_openai, tmp_path)()
    assert result.usage.source == "reported"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (10 + 30, 5 + 2)


# --------------------------------------------------------------------------- worst case


async def test_a_turn_whose_worst_case_cost_does_not_fit_is_not_made(
    fake_openai: FakeOpenAIServer, tmp_path: Path
) -> None:
    # $1 an output token, 5 at most a turn: $5 a turn at worst (and here, spent); with $12
    # the third turn is refused before it is paid ($2 left), not paid and then refused ($15)
    fake_openai.tool_loop = ToolLoop("add", calls=100, arguments={"a": 1, "b": 2})
    run = Run(
        fake_openai,
        tmp_path,
        settings=ModelSettings(max_output_tokens=5),
        limits=Limits(max_cost_usd=12.0),
        pricing=Pricing(input_per_million=0.0, output_per_million=1_000_000.0),
    )
    result = await run()
    assert result.error is not None
    assert (result.error["code"], result.error["limit"]) == ("budget_exceeded", "max_cost_usd")
    assert "the next model turn may cost $5.000000" in result.error["message"]
    assert fake_openai.calls == 2 and result.cost_usd == 10.0


async def test_a_limited_run_sends_an_output_cap_and_an_unlimited_one_none(
    fake_openai: FakeOpenAIServer, tmp_path: Path
) -> None:
    fake_openai.add_reply(FakeReply(text="a"), FakeReply(text="b"), FakeReply(text="c"))
    await Run(fake_openai, tmp_path, limits=Limits(max_tokens=100_000))()
    await Run(fake_openai, tmp_path)()
    settings = ModelSettings(max_output_tokens=300)
    await Run(fake_openai, tmp_path, limits=Limits(max_tokens=100_000), settings=settings)()
    sent = [r.json.get("max_tokens") for r in fake_openai.requests]
    assert sent == [DEFAULT_OUTPUT_TOKENS, None, 300]


async def test_a_limit_below_one_turns_worst_case_fails_before_any_request(
    fake_openai: FakeOpenAIServer, tmp_path: Path
) -> None:
    # a careless limit: max_tokens under the default output cap, no max_output_tokens
    fake_openai.add_reply(FakeReply(text="never asked"))
    run = Run(fake_openai, tmp_path, limits=Limits(max_tokens=1000))
    result = await run()
    assert result.state is RunState.FAILED and result.error is not None
    assert (result.error["code"], result.error["limit"]) == ("budget_exceeded", "max_tokens")
    assert f"up to {DEFAULT_OUTPUT_TOKENS} output" in result.error["message"]
    assert "model_settings.max_output_tokens" in result.error["message"]
    assert fake_openai.calls == 0 and result.usage.total_tokens == 0
    assert [e.type for e in run.events][-2:] == [EventType.ERROR, EventType.RUN_FINISH]


class Unreported(Model):
    """The scripted model, as a provider that reports no usage: every turn estimated."""

    def __init__(self, turns: list[ScriptedTurn]) -> None:
        self.inner = ScriptedModel(turns)
        self.name = "unreported"

    async def request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> ModelResponse:
        response = await self.inner.request(messages, tools, settings)
        return replace(response, usage=replace(response.usage, source="estimated"))


async def test_the_usage_warning_is_said_once_per_run_across_a_resume(tmp_path: Path) -> None:
    add = ScriptedToolCall(name="add", arguments={"a": 1, "b": 2})
    turns = [ScriptedTurn(tool_calls=[add]), ScriptedTurn(text="3")]
    agent = AgentDefinition(
        name="adder",
        model=Unreported(turns),
        toolset=Toolset(
            [GovernedTool(AddTool(), ToolPolicy())], approval=ApprovalPolicy(policy="always")
        ),
        workspace=tmp_path,
    )
    events: list[Event] = []

    async def sink(event: Event) -> None:
        events.append(event)

    parked = await AgentLoop(agent, "run_warn", sink).run("1 + 2?")
    assert parked.state is RunState.WAITING_APPROVAL
    (pending,) = parked.pending_approvals
    done = await AgentLoop(agent, "run_warn", sink).resume(
        list(events), {pending.call_id: (True, None)}
    )
    assert (done.state, done.output) == (RunState.SUCCEEDED, "3")
    assert [e.data.code for e in events if e.type is EventType.WARNING] == ["usage_estimated"]
    assert sum(e.type is EventType.MESSAGE_CREATE for e in events) == 2


# --------------------------------------------------------------------------- careless input


async def test_a_negative_usage_from_the_server_is_estimated_not_given_back(
    fake_openai: FakeOpenAIServer, tmp_path: Path
) -> None:
    # a broken or hostile server's -1000 input tokens would hand the run back its spend
    fake_openai.add_reply(ADD_CALL, FakeReply(text="42", input_tokens=-1000, output_tokens=5))
    run = Run(fake_openai, tmp_path, settings=ModelSettings(max_output_tokens=16))
    result = await run()
    second = run.of(EventType.MESSAGE_CREATE)[1]["usage"]
    assert second["source"] == "estimated" and second["input_tokens"] > 0
    assert result.usage.input_tokens > 10 and len(run.of(EventType.WARNING)) == 1


@pytest.mark.parametrize("value", ['"sometimes"', "[true]", "null"])
def test_a_reset_tool_choice_that_is_no_boolean_is_refused_at_apply(value: str) -> None:
    text = (
        "apiVersion: corral/v1\nkind: Agent\nmetadata: {name: a}\nspec:\n  model: m\n"
        f"  model_settings:\n    tool_choice: required\n    reset_tool_choice: {value}\n"
    )
    with pytest.raises(ResourceError) as exc:
        load_text(text, "a.yaml")
    [(where, reason)] = exc.value.problems
    assert (where.line, where.field) == (8, "spec.model_settings.reset_tool_choice")
    assert "boolean" in reason
