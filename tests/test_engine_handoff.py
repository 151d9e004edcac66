"""``handoff`` in the agent loop: the conversation goes on under another agent, journaled
(a ``handoff`` event) and replayed after a crash under the right agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.core.errors import CorralError, ToolError, ToolErrorCode
from corral.core.events import Event, EventType
from corral.core.runs import RunState
from corral.engine.loop import AgentDefinition, AgentLoop, RunResult
from corral.engine.replay import replay
from corral.models.scripted import ScriptedModel
from corral.resources.kinds import AgentLink, Limits, ScriptedTurn
from corral.tools.agents import linked_agent_tools
from corral.tools.base import ChildRun
from corral.tools.governance import GovernedTool, ToolPolicy, Toolset
from test_engine import ADD_SCHEMA, FunctionTool, add, turn
from test_engine_resume import cut_after


class Agents:
    """The live agents of a test by name (what the runtime's AgentCache is to a worker),
    and the Delegation their linked-agent tools call (``handoff`` asks ``describe``)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.models: dict[str, ScriptedModel] = {}
        self.definitions: dict[str, AgentDefinition] = {}
        self.adds: dict[str, FunctionTool] = {}
        self.events: list[Event] = []
        self.switched: list[str] = []

    def add_agent(
        self,
        name: str,
        turns: list[ScriptedTurn],
        *,
        links: tuple[str, ...] = (),
        limits: Limits | None = None,
    ) -> None:
        self.models[name] = ScriptedModel(turns, name=f"{name}-model")
        add_tool = FunctionTool("add", add, ADD_SCHEMA)
        add_tool.idempotent = True
        self.adds[name] = add_tool
        tools = [add_tool, *linked_agent_tools([AgentLink(agent=a) for a in links], self, _all)]
        self.definitions[name] = AgentDefinition(
            name=name,
            model=self.models[name],
            toolset=Toolset([GovernedTool(t, ToolPolicy()) for t in tools]),
            instructions=f"You are {name}.",
            limits=limits or Limits(),
            workspace=self.tmp_path,
        )

    # -- Delegation
    async def start_child(self, *args: Any, **kwargs: Any) -> ChildRun:
        raise ToolError(ToolErrorCode.UNAVAILABLE, "no child runs in this test")

    async def describe(self, namespace: str, agent: str) -> dict[str, Any]:
        if agent not in self.definitions:
            raise ToolError(ToolErrorCode.UNAVAILABLE, f"agent {agent!r} is gone")
        return {"tools": ["add"]}

    # -- the loop's switch
    async def switch(self, name: str) -> AgentDefinition:
        self.switched.append(name)
        if name not in self.definitions:
            raise CorralError(f"agent {name!r} cannot be built")
        return self.definitions[name]

    async def sink(self, event: Event) -> None:
        self.events.append(event)

    def loop(self, agent: str) -> AgentLoop:
        return AgentLoop(self.definitions[agent], "run_test", self.sink, switch=self.switch)

    async def run(self, agent: str, prompt: str = "help me") -> RunResult:
        return await self.loop(agent).run(prompt)

    def of(self, kind: EventType) -> list[dict[str, Any]]:
        return [e.data.to_dict() for e in self.events if e.type is kind]


def _all(ref: str) -> bool:
    return True


def handoff(agent: str, reason: str = "") -> tuple[str, dict[str, Any]]:
    return ("handoff", {"agent": agent, "reason": reason} if reason else {"agent": agent})


def triage_and_billing(tmp_path: Path) -> Agents:
    """triage hands off to billing, which adds once and answers (the scripted model's turn
    is the number of assistant messages so far: billing's script starts at its second)."""
    agents = Agents(tmp_path)
    agents.add_agent(
        "triage", [turn("", handoff("billing", "a billing question"))], links=("billing",)
    )
    agents.add_agent(
        "billing",
        [turn("(triage's turn)"), turn("", ("add", {"a": 2, "b": 3})), turn("you owe 5")],
    )
    return agents


async def test_a_handoff_goes_on_under_the_target_with_the_whole_conversation(
    tmp_path: Path,
) -> None:
    agents = triage_and_billing(tmp_path)
    result = await agents.run("triage", "how much do I owe?")

    assert (result.state, result.output, result.agent) == (
        RunState.SUCCEEDED,
        "you owe 5",
        "billing",
    )
    assert len(agents.models["triage"].requests) == 1
    assert len(agents.models["billing"].requests) == 2
    first = agents.models["billing"].requests[0]
    # the target sees the conversation so far, under its own instructions
    assert [m.role for m in first] == ["system", "user", "assistant", "tool"]
    assert first[0].content == "You are billing."
    assert first[1].content == "how much do I owe?"
    assert first[2].tool_calls[0].name == "handoff"
    assert "billing" in first[3].content
    assert agents.adds["billing"].calls == [{"a": 2, "b": 3}]
    [switch] = agents.of(EventType.HANDOFF)
    assert switch == {
        "step": 1,
        "call_id": "call_1_1",
        "from": "triage",
        "to": "billing",
        "reason": "a billing question",
        "system": "You are billing.",
    }
    kinds = [e.type for e in agents.events]
    # the handoff call's result, then the switch, then the step ends
    assert kinds.index(EventType.TOOL_RESULT) < kinds.index(EventType.HANDOFF)
    assert kinds.index(EventType.HANDOFF) < kinds.index(EventType.STEP_FINISH)
    checkpoint = replay(agents.events)
    assert (checkpoint.agent, checkpoint.handoffs) == ("billing", 1)
    assert next(m.content for m in checkpoint.messages) == "You are billing."


@pytest.mark.parametrize(
    ("crash_after", "nth", "triage_calls", "billing_calls"),
    [
        (EventType.TOOL_RESULT, 1, 0, 2),  # the handoff call's result, not the switch
        (EventType.HANDOFF, 1, 0, 2),  # the switch, not the step's end
        (EventType.STEP_FINISH, 1, 0, 2),
        (EventType.MESSAGE_CREATE, 2, 0, 1),  # the target's first turn
        (EventType.TOOL_RESULT, 2, 0, 1),  # the target's tool call
    ],
)
async def test_a_run_resumed_after_a_crash_past_a_handoff_goes_on_under_the_target(
    tmp_path: Path, crash_after: EventType, nth: int, triage_calls: int, billing_calls: int
) -> None:
    full = triage_and_billing(tmp_path)
    await full.run("triage", "how much do I owe?")
    journal = cut_after(full.events, lambda e: e.type is crash_after, nth)

    # another process: fresh models; it builds the agent the journal says the run is under
    again = triage_and_billing(tmp_path)
    again.events = list(journal)
    active = replay(journal).agent or "triage"
    if crash_after is EventType.TOOL_RESULT and nth == 1:
        assert active == "triage"  # the switch is not journaled: the resumed loop makes it
    else:
        assert active == "billing"
    result = await again.loop(active).resume(journal)

    assert (result.state, result.output, result.agent) == (
        RunState.SUCCEEDED,
        "you owe 5",
        "billing",
    )
    assert len(again.models["triage"].requests) == triage_calls
    assert len(again.models["billing"].requests) == billing_calls
    adds_before = sum(
        1 for e in journal if e.type is EventType.TOOL_RESULT and e.data.tool == "add"
    )
    assert len(again.adds["billing"].calls) == 1 - adds_before
    # exactly one switch across both processes, and the conversation the first one built
    assert [e.type for e in again.events].count(EventType.HANDOFF) == 1
    assert [e.seq for e in again.events] == list(range(1, len(again.events) + 1))
    assert [m.role for m in result.messages] == [
        "system", "user", "assistant", "tool", "assistant", "tool", "assistant",
    ]  # fmt: skip
    assert result.messages[0].content == "You are billing."
    # the journal of both processes replays to that conversation
    assert replay(again.events).messages == result.messages


async def test_a_handoff_loop_is_stopped_by_max_handoffs(tmp_path: Path) -> None:
    agents = Agents(tmp_path)
    # each hands the conversation back, forever, until a handoff is refused
    ping = [turn("", handoff("pong"))] * 6 + [turn("ping gives up")] * 2
    pong = [turn("", handoff("ping"))] * 6 + [turn("pong gives up")] * 2
    agents.add_agent("ping", ping, links=("pong",), limits=Limits(max_handoffs=3))
    agents.add_agent("pong", pong, links=("ping",), limits=Limits(max_handoffs=3))
    result = await agents.run("ping")

    assert [(h["from"], h["to"]) for h in agents.of(EventType.HANDOFF)] == [
        ("ping", "pong"),
        ("pong", "ping"),
        ("ping", "pong"),
    ]
    refused = agents.of(EventType.TOOL_RESULT)[-1]
    assert refused["error"]["code"] == "budget_exceeded"
    assert refused["error"]["details"]["limit"] == "max_handoffs"
    assert "limits.max_handoffs" in refused["error"]["reason"]
    # the refused agent keeps the conversation and answers
    assert (result.state, result.output, result.agent) == (
        RunState.SUCCEEDED,
        "pong gives up",
        "pong",
    )


async def test_only_the_first_handoff_of_a_turn_hands_off_after_the_other_calls(
    tmp_path: Path,
) -> None:
    agents = Agents(tmp_path)
    agents.add_agent(
        "triage",
        [turn("", handoff("billing"), ("add", {"a": 1, "b": 1}), handoff("support"))],
        links=("billing", "support"),
    )
    agents.add_agent("billing", [turn("-"), turn("billing here")])
    agents.add_agent("support", [turn("-"), turn("support here")])
    result = await agents.run("triage")

    assert (result.output, result.agent) == ("billing here", "billing")
    assert agents.adds["triage"].calls == [{"a": 1, "b": 1}]
    results = {r["call_id"]: r for r in agents.of(EventType.TOOL_RESULT)}
    assert results["call_1_1"]["handoff"] == {"agent": "billing", "reason": ""}
    assert results["call_1_2"]["output"] == "2"
    assert results["call_1_3"]["error"]["code"] == "invalid_input"
    assert "one handoff per turn" in results["call_1_3"]["error"]["reason"]
    assert agents.switched == ["billing"]
    kinds = [e.type for e in agents.events]
    # the switch waits for every result of its turn
    last_result = max(i for i, k in enumerate(kinds) if k is EventType.TOOL_RESULT)
    assert kinds.index(EventType.HANDOFF) > last_result
    # the target answers all three calls' turn: it saw every result
    assert [m.role for m in agents.models["billing"].requests[0]][-3:] == ["tool"] * 3


async def test_a_handoff_to_an_agent_not_linked_or_gone_is_a_tool_error(tmp_path: Path) -> None:
    agents = Agents(tmp_path)
    agents.add_agent(
        "triage",
        [
            turn("", handoff("stranger")),
            turn("", handoff("ghost")),
            turn("", handoff("x" * 64)),
            turn("still triage"),
        ],
        links=("ghost",),
    )
    agents.add_agent("stranger", [turn("never")])
    result = await agents.run("triage")

    assert (result.state, result.output, result.agent) == (
        RunState.SUCCEEDED,
        "still triage",
        "triage",
    )
    errors = [r["error"] for r in agents.of(EventType.TOOL_RESULT)]
    assert [e["code"] for e in errors] == ["permission_denied", "unavailable", "invalid_input"]
    assert "not linked" in errors[0]["reason"]
    assert agents.of(EventType.HANDOFF) == [] and agents.switched == []
    assert agents.models["stranger"].requests == []


async def test_without_a_switch_a_handoff_is_refused(tmp_path: Path) -> None:
    agents = triage_and_billing(tmp_path)
    agents.models["triage"].turns.append(turn("no switch here"))
    loop = AgentLoop(agents.definitions["triage"], "run_test", agents.sink)
    result = await loop.run("go")
    assert result.output == "no switch here"
    [refused] = agents.of(EventType.TOOL_RESULT)
    assert refused["error"]["code"] == "unavailable"


async def test_the_targets_limits_apply_with_the_spend_so_far(tmp_path: Path) -> None:
    agents = Agents(tmp_path)
    agents.add_agent(
        "triage", [turn("", handoff("tight"), tokens=40)], links=("tight",), limits=Limits()
    )
    agents.add_agent(
        "tight",
        [turn("-"), turn("", ("add", {"a": 1, "b": 2}), tokens=40)],
        limits=Limits(max_tokens=100),
    )
    result = await agents.run("triage")
    assert result.state is RunState.FAILED
    assert result.error is not None
    assert (result.error["code"], result.error["limit"]) == ("budget_exceeded", "max_tokens")
    # tight's first turn (80 tokens) would pass its 100 after triage's 80: never made
    assert result.usage.total_tokens == 80


async def test_hostile_handoff_calls_get_stable_tool_errors_and_hand_off_nothing(
    tmp_path: Path,
) -> None:
    agents = Agents(tmp_path)
    hostile: list[dict[str, Any] | str] = [
        {"agent": ""},
        {"agent": "billing", "reason": "x" * 3000},
        {"agent": "bílling\u0000"},
        {"agent": "billing", "force": True},
        {"agent": {"name": "billing"}},
        {},
        '{"agent": "billing"',  # not JSON
        {"agent": "billing" * 20},
    ]
    agents.add_agent(
        "triage",
        [turn("", ("handoff", arguments)) for arguments in hostile] + [turn("still triage")],
        links=("billing",),
    )
    agents.add_agent("billing", [turn("never")])
    result = await agents.run("triage")

    assert (result.state, result.output, result.agent) == (
        RunState.SUCCEEDED,
        "still triage",
        "triage",
    )
    codes = [r["error"]["code"] for r in agents.of(EventType.TOOL_RESULT)]
    assert codes == [
        "invalid_input",
        "invalid_input",
        "permission_denied",
        "invalid_input",
        "invalid_input",
        "invalid_input",
        "invalid_input",
        "invalid_input",
    ]
    assert agents.switched == [] and agents.of(EventType.HANDOFF) == []
