"""Rebuild a run's state from its stored events, so another process can carry it on.

The events are the journal: ``run.start`` holds the initial conversation,
``message.create`` each model response (with its usage and cost) and each
message the loop added, ``tool.call`` marks a call whose execution began and
``tool.result`` its outcome, ``approval.requested``/``approval.resolved`` the
human decisions, ``child.start``/``child.finish`` a call answered by a child run
(and the child's spend, which counts as the run's; one with no ``call_id``: a child a
tool program started over the API, charged when its step's calls were done),
``handoff`` a switch to another agent (its system prompt replaces the first),
``memory.write``/``memory.search`` what a memory tool's call did, with what its
embeddings cost (``usage``, ``cost_usd``: the run's spend, like a model turn's).
Replaying them never calls a model or a tool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.core.events import Event, EventType
from corral.core.messages import Message, ToolCall, Usage, load
from corral.tools.base import Handoff
from corral.tools.governance import tool_message_text

#: the events a tool call journals (before its result) whose ``usage`` and ``cost_usd``
#: are charged to the run: what a memory tool paid its embedding model
CHARGED_CALL_EVENTS = frozenset({EventType.MEMORY_WRITE, EventType.MEMORY_SEARCH})


def charge_of(data: dict[str, Any]) -> tuple[Usage, float]:
    """The tokens and cost an event charges to its run (none when it carries none)."""
    return load(Usage, data.get("usage") or {}), float(data.get("cost_usd") or 0.0)


@dataclass
class OpenStep:
    """The last step, when some of its tool calls have no result yet."""

    step: int
    calls: tuple[ToolCall, ...]
    #: tool messages of the calls that finished, by call id
    results: dict[str, Message] = field(default_factory=dict[str, Message])
    #: calls whose execution began (a ``tool.call`` event) and never reported back
    started: set[str] = field(default_factory=set[str])
    #: calls waiting for a human decision, by call id: the reason asked
    awaiting: dict[str, str] = field(default_factory=dict[str, str])
    #: decisions already recorded in the events, by call id: (approved, reason)
    decided: dict[str, tuple[bool, str | None]] = field(
        default_factory=dict[str, tuple[bool, str | None]]
    )
    #: calls whose answer is a child run's (a ``child.start`` event), by call id: its run id
    children: dict[str, str] = field(default_factory=dict[str, str])
    #: the step's handoff call (its result journaled, the switch maybe not): id, target
    handoff: tuple[str, Handoff] | None = None

    def unresolved(self) -> list[ToolCall]:
        return [c for c in self.calls if c.id not in self.results]


@dataclass
class Checkpoint:
    """Everything a resumed loop needs: conversation, spend, and where it stopped."""

    input: str
    messages: list[Message]
    #: how many of ``messages`` the run started with (system prompt, history, input)
    initial_count: int = 0
    steps: int = 0
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    last_seq: int = 0
    repairs: int = 0
    open_step: OpenStep | None = None
    #: a final model message whose handling (structured output) did not finish
    final: Message | None = None
    finished: bool = False
    #: the agent the run went on under after its last ``handoff`` (``None``: none)
    agent: str | None = None
    handoffs: int = 0
    #: a handoff whose call's result was journaled and whose switch was not: (step, call
    #: id, target), done first on resume
    handoff_due: tuple[int, str, Handoff] | None = None
    #: the child runs whose spend is journaled (``child.finish``), by run id
    charged: set[str] = field(default_factory=set[str])
    #: the codes of the ``warning`` events the run emitted (each is said once per run)
    warned: set[str] = field(default_factory=set[str])


def replay(events: Sequence[Event]) -> Checkpoint:
    """The checkpoint the events describe; raises ``ValueError`` when they do not start a run."""
    if not events or events[0].type is not EventType.RUN_START:
        raise ValueError("a run's events must begin with run.start")
    start = events[0].data
    checkpoint = Checkpoint(
        input=str(start.get("input", "")),
        messages=[load(Message, m) for m in start.get("messages", [])],
    )
    checkpoint.initial_count = len(checkpoint.messages)
    open_step: OpenStep | None = None
    for event in events:
        checkpoint.last_seq = event.seq
        data = event.data
        if event.type is EventType.MESSAGE_CREATE:
            message = load(Message, data["message"])
            if open_step is not None and not open_step.unresolved():
                # a step whose step.finish was never journaled (a run resumed with all its
                # results in): its tool messages come before what followed it
                _append_results(checkpoint, open_step)
                open_step = None
            checkpoint.messages.append(message)
            if message.role != "assistant":
                checkpoint.repairs += 1
                continue
            checkpoint.steps = int(data["step"])
            checkpoint.usage = checkpoint.usage + load(Usage, data.get("usage", {}))
            checkpoint.cost_usd += float(data.get("cost_usd", 0.0))
            if message.tool_calls:
                open_step = OpenStep(checkpoint.steps, message.tool_calls)
                checkpoint.final = None
            else:
                open_step = None
                checkpoint.final = message
        elif event.type is EventType.TOOL_CALL and open_step is not None:
            open_step.started.add(data["call_id"])
        elif event.type is EventType.TOOL_RESULT and open_step is not None:
            call = next(c for c in open_step.calls if c.id == data["call_id"])
            text = tool_message_text(data.get("output", ""), data.get("error"))
            open_step.results[call.id] = Message.tool(call, text, is_error=bool(data.get("error")))
            open_step.started.discard(call.id)
            if isinstance(handoff := data.get("handoff"), dict):
                target = Handoff(str(handoff.get("agent")), str(handoff.get("reason") or ""))
                open_step.handoff = (call.id, target)
        elif event.type is EventType.CHILD_START and open_step is not None:
            open_step.children[data["call_id"]] = str(data["run_id"])
        elif event.type is EventType.CHILD_FINISH:
            # a child's spend counts as its parent's (journaled with the call's result)
            checkpoint.charged.add(str(data.get("run_id")))
            checkpoint.usage = checkpoint.usage + load(Usage, data.get("usage", {}))
            checkpoint.cost_usd += float(data.get("cost_usd", 0.0))
        elif event.type in CHARGED_CALL_EVENTS:
            usage, cost = charge_of(data)
            checkpoint.usage = checkpoint.usage + usage
            checkpoint.cost_usd += cost
        elif event.type is EventType.APPROVAL_REQUESTED and open_step is not None:
            open_step.awaiting[data["call_id"]] = str(data.get("reason", ""))
        elif event.type is EventType.APPROVAL_RESOLVED and open_step is not None:
            open_step.awaiting.pop(data["call_id"], None)
            open_step.decided[data["call_id"]] = (bool(data["approved"]), data.get("reason"))
        elif event.type is EventType.HANDOFF:
            checkpoint.agent = str(data["to"])
            checkpoint.handoffs += 1
            checkpoint.initial_count += replace_system(
                checkpoint.messages, str(data.get("system") or "")
            )
            if open_step is not None:
                open_step.handoff = None
            checkpoint.handoff_due = None
        elif event.type is EventType.STEP_FINISH and open_step is not None:
            if not open_step.unresolved():
                _append_results(checkpoint, open_step)
                if open_step.handoff is not None:
                    call_id, target = open_step.handoff
                    checkpoint.handoff_due = (open_step.step, call_id, target)
                open_step = None
        elif event.type is EventType.RUN_FINISH:
            checkpoint.finished = True
        elif event.type is EventType.WARNING:
            checkpoint.warned.add(str(data.get("code")))
    if open_step is not None:
        if open_step.unresolved():
            checkpoint.open_step = open_step
        else:  # every result is in but step.finish was not recorded
            _append_results(checkpoint, open_step)
            if open_step.handoff is not None:
                call_id, target = open_step.handoff
                checkpoint.handoff_due = (open_step.step, call_id, target)
    return checkpoint


def _append_results(checkpoint: Checkpoint, step: OpenStep) -> None:
    checkpoint.messages += [step.results[c.id] for c in step.calls]


def replace_system(messages: list[Message], system: str) -> int:
    """Put ``system`` in place of the conversation's system prompt (first, when it has
    one); returns by how much the conversation grew or shrank (-1, 0 or 1). A handoff
    does it live (:mod:`corral.engine.loop`) and when replayed."""
    has = bool(messages) and messages[0].role == "system"
    if system and has:
        messages[0] = Message.system(system)
        return 0
    if system:
        messages.insert(0, Message.system(system))
        return 1
    if has:
        del messages[0]
        return -1
    return 0
