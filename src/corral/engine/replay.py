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

from corral.core.events import (
    ApprovalRequestedData,
    ApprovalResolvedData,
    ChildFinishData,
    ChildStartData,
    Event,
    HandoffData,
    MemorySearchData,
    MemoryWriteData,
    MessageCreateData,
    RunFinishData,
    RunStartData,
    StepFinishData,
    ToolCallData,
    ToolResultData,
    WarningData,
)
from corral.core.messages import Message, ToolCall, Usage, load
from corral.tools.base import Handoff
from corral.tools.governance import tool_message_text


def charge_of(data: MemoryWriteData | MemorySearchData | ChildFinishData) -> tuple[Usage, float]:
    """The tokens and cost an event charges to its run (none when it carries none)."""
    return load(Usage, data.usage or {}), float(data.cost_usd or 0.0)


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
    if not events or not isinstance(start := events[0].data, RunStartData):
        raise ValueError("a run's events must begin with run.start")
    checkpoint = Checkpoint(
        input=start.input,
        messages=[load(Message, m) for m in start.messages or ()],
    )
    checkpoint.initial_count = len(checkpoint.messages)
    fold = _Fold(checkpoint)
    for event in events:
        checkpoint.last_seq = event.seq
        fold.apply(event)
    fold.end()
    return checkpoint


class _Fold:
    """Folds a run's events into its checkpoint, one at a time (see :func:`replay`)."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        self.open_step: OpenStep | None = None

    def apply(self, event: Event) -> None:
        checkpoint, open_step = self.checkpoint, self.open_step
        match event.data:
            case MessageCreateData() as data:
                self._message(data)
            case ToolCallData(call_id=call_id) if open_step is not None:
                open_step.started.add(call_id)
            case ToolResultData() as data if open_step is not None:
                self._result(open_step, data)
            case ChildStartData(call_id=str(call_id), run_id=run_id) if open_step is not None:
                open_step.children[call_id] = run_id
            case ChildFinishData() as data:
                # a child's spend counts as its parent's (journaled with the call's result)
                checkpoint.charged.add(data.run_id)
                self._charge(data)
            case MemoryWriteData() | MemorySearchData() as data:
                self._charge(data)
            case ApprovalRequestedData(call_id=call_id, reason=reason) if open_step is not None:
                open_step.awaiting[call_id] = reason
            case ApprovalResolvedData() as data if open_step is not None:
                open_step.awaiting.pop(data.call_id, None)
                open_step.decided[data.call_id] = (data.approved, data.reason)
            case HandoffData(to=to, system=system):
                checkpoint.agent = to
                checkpoint.handoffs += 1
                checkpoint.initial_count += replace_system(checkpoint.messages, system or "")
                if open_step is not None:
                    open_step.handoff = None
                checkpoint.handoff_due = None
            case StepFinishData() if open_step is not None and not open_step.unresolved():
                self._close(open_step)
            case RunFinishData():
                checkpoint.finished = True
            case WarningData(code=code):
                checkpoint.warned.add(code)
            case _:
                pass  # (step.start, text.delta, a system run's events: nothing to rebuild from them)

    def _message(self, data: MessageCreateData) -> None:
        checkpoint = self.checkpoint
        message = load(Message, data.message)
        if self.open_step is not None and not self.open_step.unresolved():
            # a step whose step.finish was never journaled (a run resumed with all its
            # results in): its tool messages come before what followed it
            _append_results(checkpoint, self.open_step)
            self.open_step = None
        checkpoint.messages.append(message)
        if message.role != "assistant":
            checkpoint.repairs += 1
            return
        checkpoint.steps = int(data.step or 0)
        checkpoint.usage = checkpoint.usage + load(Usage, data.usage or {})
        checkpoint.cost_usd += float(data.cost_usd or 0.0)
        if message.tool_calls:
            self.open_step = OpenStep(checkpoint.steps, message.tool_calls)
            checkpoint.final = None
        else:
            self.open_step = None
            checkpoint.final = message

    @staticmethod
    def _result(open_step: OpenStep, data: ToolResultData) -> None:
        call = next(c for c in open_step.calls if c.id == data.call_id)
        text = tool_message_text(data.output, data.error)
        open_step.results[call.id] = Message.tool(call, text, is_error=bool(data.error))
        open_step.started.discard(call.id)
        if data.handoff is not None:
            target = Handoff(str(data.handoff.get("agent")), str(data.handoff.get("reason") or ""))
            open_step.handoff = (call.id, target)

    def _charge(self, data: MemoryWriteData | MemorySearchData | ChildFinishData) -> None:
        usage, cost = charge_of(data)
        self.checkpoint.usage = self.checkpoint.usage + usage
        self.checkpoint.cost_usd += cost

    def _close(self, open_step: OpenStep) -> None:
        """A step whose every call has its result: its tool messages join the conversation
        (and its handoff is due, when it made one)."""
        _append_results(self.checkpoint, open_step)
        if open_step.handoff is not None:
            call_id, target = open_step.handoff
            self.checkpoint.handoff_due = (open_step.step, call_id, target)
        self.open_step = None

    def end(self) -> None:
        open_step = self.open_step
        if open_step is None:
            return
        if open_step.unresolved():
            self.checkpoint.open_step = open_step
        else:  # every result is in but step.finish was not recorded
            self._close(open_step)


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
