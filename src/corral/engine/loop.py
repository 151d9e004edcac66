"""The agent loop: model turn, parallel tool calls, results, next turn.

The loop knows nothing about where it runs (a CLI, a worker, a test): it gets a
live :class:`AgentDefinition`, an input and an event sink, and returns a
:class:`RunResult`. Events for one run are emitted strictly in order:

    run.start
      step.start  text.delta*  message.create  (tool.call+ tool.result+)?  step.finish
      ...
    run.finish | error run.finish

A tool call that needs a human's approval ends the run in ``waiting_approval``
after the step's other calls have run; the pending calls are in the result. A
call whose tool started a child run (``agents_exec``: ``child.start``) ends it in
``waiting_children``; :meth:`AgentLoop.resume` with the finished child runs
records each one's outcome (``child.finish``, its spend charged to this run) as
the call's result.

A ``handoff`` call (:class:`~corral.tools.base.Handoff`) hands the conversation to
another agent: once every other call of its step has a result, the loop asks its
``switch`` for the target's :class:`AgentDefinition`, journals a ``handoff`` event
(from, to, reason, and the target's system prompt, which replaces the first one)
and goes on under the target: its model, tools, instructions and limits, with
the spend so far and the same conversation. Only the first ``handoff`` call of a
step hands off (later ones are refused with ``invalid_input``); one past the
handing agent's ``limits.max_handoffs`` is refused with ``budget_exceeded``.

Every event is the journal of the run (see :mod:`corral.engine.replay`):
:meth:`AgentLoop.resume` rebuilds the state from stored events and carries on
from the first thing not recorded, without calling a model or a tool again. A
``tool.call`` event is emitted just before a call executes; a call that has one
but no ``tool.result`` was interrupted, and is executed again only when its tool
is idempotent - otherwise the run asks a human (or fails, per the agent).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import anyio

from corral.core.errors import (
    CorralError,
    LeaseLostError,
    ModelError,
    OutputValidationError,
    ToolErrorCode,
    ToolErrorInfo,
)
from corral.core.events import (
    AnyEventData,
    ApprovalRequestedData,
    ApprovalResolvedData,
    ChildFinishData,
    ChildStartData,
    ErrorData,
    Event,
    EventSink,
    HandoffData,
    JsonObject,
    MessageCreateData,
    RunFinishData,
    RunStartData,
    StepFinishData,
    StepStartData,
    TextDeltaData,
    ToolCallData,
    ToolResultData,
    WarningData,
)
from corral.core.messages import (
    Message,
    ModelResponse,
    TextDelta,
    ToolCall,
    Usage,
    dump,
    dump_messages,
)
from corral.core.runs import Decision, PendingApproval, RunRecord, RunState
from corral.engine.budget import Budget, capped, held_by, inherited_limits
from corral.engine.replay import OpenStep, charge_of, replace_system, replay
from corral.engine.structured import parse_output, repair_prompt, schema_instruction
from corral.engine.turn_settings import turn_settings
from corral.models.base import Model, ModelSettings
from corral.resources.kinds import Limits, SessionPolicy
from corral.tools.base import Handoff, ToolContext
from corral.tools.governance import ToolOutcome, Toolset

#: a human decision handed to :meth:`AgentLoop.resume`: a Decision, or ``(approved, reason)``
Decided = Decision | tuple[bool, str | None]


@dataclass
class AgentDefinition:
    """An agent made live: its model (with fallbacks) and governed tools."""

    name: str
    model: Model
    toolset: Toolset
    namespace: str = "default"
    instructions: str = ""
    limits: Limits = field(default_factory=Limits)
    model_settings: ModelSettings = field(default_factory=ModelSettings)
    output_schema: dict[str, Any] | None = None
    output_retries: int = 2
    stream: bool = True
    workspace: Path = field(default_factory=lambda: Path.cwd())
    #: what to do with a non-idempotent call interrupted by a crash: ask a human, or fail
    interrupted_calls: Literal["ask", "fail"] = "ask"
    session_policy: SessionPolicy = field(default_factory=SessionPolicy)
    #: the effective execution policy its tools were built under, as ``run.start`` records it
    execution: dict[str, Any] | None = None
    #: the names of the agents it may call (``spec.links``): its agent tokens carry them
    links: tuple[str, ...] = ()
    #: ``spec.max_concurrent_runs``: its runs executing at once across all workers
    max_concurrent_runs: int | None = None


#: a tool call's planted environment variables, and those of their values to redact by name,
#: given the call (``STEP:INDEX``) and what it may spend of the run's ``max_cost_usd`` and
#: ``max_tokens`` (``None``: no limit)
CallEnvironment = Callable[
    [str, float | None, int | None], tuple[Mapping[str, str], Mapping[str, str]]
]
#: the live definition of the agent a ``handoff`` names (raises ``CorralError`` when it
#: cannot be built)
Switch = Callable[[str], Awaitable[AgentDefinition]]
#: the run's child runs started outside its journal (a tool program's
#: ``POST /v1/links/{agent}/exec``) that are not in ``known`` (run ids), finished or not
OutsideChildren = Callable[[set[str]], Awaitable[Sequence[RunRecord]]]
#: of the child runs ``run_ids`` the run would park for, those that ended soon, by run id
#: (the run goes on when they all did)
ChildrenEnded = Callable[[list[str]], Awaitable[Mapping[str, RunRecord]]]

#: the ref of the built-in handoff tool (:class:`corral.tools.agents.HandOff`)
HANDOFF_TOOL = "handoff"


def _usage_estimated(endpoint: str) -> str:
    return (
        f"model endpoint {endpoint!r} reported no token usage: the run's tokens and cost are "
        "estimated (about 3 bytes of text a token), and its limits are enforced on the estimate"
    )


@dataclass
class RunResult:
    """Where a run ended and what it produced."""

    state: RunState
    output: Any = None
    error: dict[str, Any] | None = None
    messages: list[Message] = field(default_factory=list[Message])
    pending_approvals: list[PendingApproval] = field(default_factory=list[PendingApproval])
    steps: int = 0
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    #: how many leading messages were the run's starting point (system prompt, history, input)
    initial_count: int = 0
    #: the agent the run ended under (another than the submitted one after a handoff)
    agent: str = ""

    @property
    def new_messages(self) -> list[Message]:
        """What the run added to a conversation: its input and everything after it."""
        return self.messages[max(0, self.initial_count - 1) :]


class Emitter:
    """Numbers events, redacts them and hands them to the sink in order.

    The loop awaits each event before it emits the next, except while a step's
    tool calls run in parallel (:meth:`parallel`): there a lock keeps the events
    numbered without gaps and handed over one at a time. Elsewhere no lock is
    taken (a run emits half a dozen events even when it does nothing).
    """

    def __init__(self, run_id: str, sink: EventSink, toolset: Toolset, last_seq: int = 0) -> None:
        self.run_id = run_id
        self._sink = sink
        # (an agent without secrets has nothing to redact: no call per event)
        self._redactor = toolset.redactor if toolset.redactor else None
        self._redact = self._redactor.data if self._redactor is not None else None
        self._seq = last_seq
        self._lock: anyio.Lock | None = None

    async def __call__(self, data: AnyEventData) -> None:
        if self._lock is None:
            await self._sink(self._next(data))
        else:
            async with self._lock:
                await self._sink(self._next(data))

    def _next(self, data: AnyEventData) -> Event:
        """The next event: numbered and redacted. (A plain function, not a coroutine of
        its own: every event of every run goes through here.)"""
        self._seq += 1
        if self._redact is not None:
            plain = data.to_dict()
            redacted = self._redact(plain)
            if redacted is not plain:  # (the redactor hands back what holds no secret)
                data = data.from_dict(redacted)
        return Event(self.run_id, self._seq, data, time.time())

    def redact_also(self, toolset: Toolset) -> None:
        """Redact the secrets of ``toolset`` from now on too (a handoff's target: the
        conversation still holds what the earlier agent's tools saw)."""
        if toolset.redactor:
            redactor = toolset.redactor
            if self._redactor is not None:
                redactor = self._redactor.merged(redactor)
            self._redactor = redactor
            self._redact = redactor.data

    @contextmanager
    def parallel(self) -> Iterator[None]:
        """Around tasks that emit concurrently (every one of them ends inside the block)."""
        # fast_acquire: an uncontended acquire does not yield to the event loop
        self._lock = anyio.Lock(fast_acquire=True)
        try:
            yield
        finally:
            self._lock = None


class AgentLoop:
    """Runs one agent on one input (``run``), or carries a stored run on (``resume``)."""

    def __init__(
        self,
        agent: AgentDefinition,
        run_id: str,
        sink: EventSink,
        *,
        raise_retryable: bool = False,
        call_environment: CallEnvironment | None = None,
        switch: Switch | None = None,
        outside_children: OutsideChildren | None = None,
        children_ended: ChildrenEnded | None = None,
        cost_cap: float | None = None,
        token_cap: int | None = None,
    ) -> None:
        """``raise_retryable``: let a retryable model failure (the endpoints stayed down after
        their own retries) propagate instead of failing the run, so a worker can try the
        whole run again later; the journal keeps what was done. ``call_environment`` gives
        each call of a tool that hands them to a process (exec, stdio MCP) its planted
        variables and the values of them to redact (an agent with links: a fresh agent
        token per such call). ``switch`` builds the target of a
        ``handoff`` (without it, handoffs are refused). ``outside_children`` finds the
        child runs a tool program started over the API: a finished one's spend is charged
        to this run (``child.finish``) when a step's calls are done; until then (and while
        it runs, its caps) it is held from what later calls may spend outside the run.
        ``children_ended`` is asked, before the run parks for child runs, for those of
        them that end soon (children running on this worker: see
        :mod:`corral.runtime.delegation`); when they all did, the run goes on without
        parking.
        ``cost_cap``, ``token_cap``: the run's own caps on its cost and tokens
        (``RunRecord.max_cost_usd``, ``max_tokens``), over its agent's ``limits`` and any
        handoff target's."""
        self.agent = agent
        self.cost_cap = cost_cap
        self.token_cap = token_cap
        self.call_environment = call_environment
        self.switch = switch
        self.outside_children = outside_children
        self.children_ended = children_ended
        #: child runs whose spend is journaled (``child.finish``), by run id
        self.charged: set[str] = set()
        self.handoffs = 0
        self._deadline_scope: anyio.CancelScope | None = None
        self._started_at = 0.0
        self.run_id = run_id
        self.sink = sink
        self.raise_retryable = raise_retryable
        self.emit = Emitter(run_id, sink, agent.toolset)
        self.budget = Budget(
            capped(agent.limits, cost_cap, token_cap),
            inherited=inherited_limits(agent.limits, cost_cap, token_cap),
        )
        self.messages: list[Message] = []
        self.initial_count = 0
        self.repairs = 0
        self.children: Mapping[str, RunRecord] = {}
        #: the codes of the ``warning`` events emitted (each is said once per run)
        self.warned: set[str] = set()

    async def run(self, user_input: str, history: Sequence[Message] = ()) -> RunResult:
        """Run to a final answer, a pause for approval, or a failure."""
        agent = self.agent
        system = agent.instructions
        if agent.output_schema is not None:
            system = f"{system}\n\n{schema_instruction(agent.output_schema)}".strip()
        self.messages = [Message.system(system)] if system else []
        self.messages += [*history, Message.user(user_input)]
        self.initial_count = len(self.messages)
        await self.emit(
            RunStartData(
                agent=agent.name,
                input=user_input,
                messages=dump_messages(self.messages),
                execution=agent.execution,
            )
        )
        return await self._guarded(self._drive(None, None, {}, None))

    async def resume(
        self,
        events: Sequence[Event],
        decisions: Mapping[str, Decided] = {},
        children: Mapping[str, RunRecord] = {},
    ) -> RunResult:
        """Carry on a run from its stored events.

        ``decisions`` maps call ids to human decisions not yet recorded in the
        events: a :class:`Decision` (who decided and when are journaled with it) or
        ``(approved, reason)``. ``children`` maps run ids to the run's child runs
        (those finished answer their calls, the others are waited for; one that is
        missing answers with ``child_failed``). Nothing recorded is executed again.
        """
        self.children = children
        checkpoint = replay(events)
        if checkpoint.finished:
            raise CorralError(f"run {self.run_id!r} has already finished")
        self.messages = checkpoint.messages
        self.initial_count = checkpoint.initial_count
        self.repairs = checkpoint.repairs
        self.budget.steps = checkpoint.steps
        self.budget.usage = checkpoint.usage
        self.budget.cost_usd = checkpoint.cost_usd
        self.charged = set(checkpoint.charged)
        self.handoffs = checkpoint.handoffs
        self.warned = checkpoint.warned
        self.emit = Emitter(self.run_id, self.sink, self.agent.toolset, checkpoint.last_seq)
        return await self._guarded(
            self._drive(
                checkpoint.final, checkpoint.open_step, dict(decisions), checkpoint.handoff_due
            )
        )

    async def _guarded(self, drive: Awaitable[RunResult]) -> RunResult:
        # anyio.fail_after, spelled out: it costs every run two generator-based context
        # managers more. Nothing else cancels this scope, so if it caught a cancellation,
        # its deadline passed.
        self._started_at = anyio.current_time()
        deadline = self._started_at + self.agent.limits.timeout_seconds
        try:
            with anyio.CancelScope(deadline=deadline) as limit:
                self._deadline_scope = limit
                result = await drive
            if limit.cancelled_caught:
                raise TimeoutError
        except TimeoutError:
            result = await self._failed(self.budget.timed_out())
        except CorralError as exc:
            if isinstance(exc, LeaseLostError):
                raise
            if self.raise_retryable and isinstance(exc, ModelError) and exc.retryable:
                raise
            result = await self._failed(exc)
        if not result.state.parked:
            await self._finish(result)
        return result

    async def conclude(self, state: RunState, error: CorralError) -> RunResult:
        """End the run from outside the loop (dead letter, cancellation): error, then run.finish."""
        result = await self._failed(error)
        result.state = state
        await self._finish(result)
        return result

    async def _finish(self, result: RunResult) -> None:
        await self.emit(
            RunFinishData(
                state=result.state.value,
                output=result.output,
                steps=self.budget.steps,
                usage=dump(self.budget.usage),
                cost_usd=self.budget.cost_usd,
            )
        )

    async def _drive(
        self,
        final: Message | None,
        open_step: OpenStep | None,
        decisions: dict[str, Decided],
        handoff_due: tuple[int, str, Handoff] | None,
    ) -> RunResult:
        if handoff_due is not None:  # its step's results were journaled, the switch was not
            await self._hand_off(*handoff_due)
        if open_step is not None:
            pending, waiting = await self._settled_calls(open_step, decisions)
            if pending or waiting:
                await self._finish_step(open_step.step)
                return self._parked(pending)
            await self._step_done(open_step)
            await self._finish_step(open_step.step)
        message = final
        while True:
            if message is None:
                message = await self._model_step()
            step = self.budget.steps
            if message.tool_calls:
                calls = OpenStep(step, message.tool_calls)
                pending, waiting = await self._settled_calls(calls, decisions)
                if pending or waiting:
                    await self._finish_step(step)
                    return self._parked(pending)
                await self._step_done(calls)
                await self._finish_step(step)
                message = None
                continue
            if self.agent.output_schema is None:
                await self._finish_step(step)
                return self._result(RunState.SUCCEEDED, output=message.content)
            try:
                output = parse_output(message.content, self.agent.output_schema)
            except ValueError as problem:
                await self._finish_step(step)
                if self.repairs >= self.agent.output_retries:
                    raise OutputValidationError(
                        f"no valid structured output after {self.repairs} repair attempts: "
                        f"{problem}"
                    ) from problem
                self.repairs += 1
                repair = Message.user(repair_prompt(str(problem)))
                self.messages.append(repair)
                await self.emit(MessageCreateData(message=dump(repair)))
                message = None
                continue
            await self._finish_step(step)
            return self._result(RunState.SUCCEEDED, output=output)

    async def _model_step(self) -> Message:
        step = self.budget.start_step()
        await self.emit(StepStartData(step=step))
        response = await self._model_turn()
        # arguments over their tool's cap are cut here, before the journal and the
        # conversation keep them (so a replay sees what the live run saw)
        message = self.agent.toolset.bound(response.message)
        self.messages.append(message)
        await self.emit(
            MessageCreateData(
                step=step,
                message=dump(message),
                endpoint=response.endpoint,
                usage=dump(response.usage),
                cost_usd=response.cost_usd,
                retries=list(response.retries) if response.retries else None,
            )
        )
        if response.usage.source == "estimated":
            await self._warn_once("usage_estimated", _usage_estimated(response.endpoint))
        self.budget.charge(response)
        return message

    async def _model_turn(self) -> ModelResponse:
        agent = self.agent
        tools = agent.toolset.specs
        settings = await self._affordable_settings()
        if not agent.stream:
            return await agent.model.request(self.messages, tools, settings)
        final: ModelResponse | None = None
        # a secret split across two deltas is caught by holding a few characters back
        pieces = agent.toolset.redactor.stream() if agent.toolset.redactor else None
        async for item in agent.model.stream(self.messages, tools, settings):
            if isinstance(item, TextDelta):
                text = item.text if pieces is None else pieces.feed(item.text)
                if text:
                    await self.emit(TextDeltaData(text=text))
            else:
                final = item
        if pieces is not None and (rest := pieces.flush()):
            await self.emit(TextDeltaData(text=rest))
        if final is None:  # a provider bug, not a user error
            raise CorralError(f"model {agent.model.name!r} ended its stream without a response")
        return final

    async def _affordable_settings(self) -> ModelSettings:
        """The next turn's settings (:func:`~corral.engine.turn_settings.turn_settings`),
        once the turn's worst case is known to fit in what the run has left, less what
        uncharged children its tool programs started hold of it (``BudgetExceededError``
        before anything is paid otherwise)."""
        agent, budget = self.agent, self.budget
        run_messages = self.messages[self.initial_count :]
        settings = turn_settings(agent.model_settings, agent.model, run_messages, budget.limited)
        if budget.limited:
            held = (0.0, 0)
            if self.outside_children is not None:
                outside = await self.outside_children(self.charged)
                held = held_by(
                    [child for child in outside if not child.state.finished],
                    [child for child in outside if child.state.finished],
                )
            bound = agent.model.turn_bound(self.messages, agent.toolset.specs, settings)
            budget.afford(bound, *held)
        return settings

    async def _warn_once(self, code: str, message: str) -> None:
        """A ``warning`` event, unless the run already emitted one with this code."""
        if code not in self.warned:
            self.warned.add(code)
            await self.emit(WarningData(code=code, message=message))

    def _parked(self, pending: list[PendingApproval]) -> RunResult:
        """The result of a step some of whose calls wait: for a human first (a decision
        is needed whatever the children do), else for child runs."""
        if pending:
            return self._result(RunState.WAITING_APPROVAL, pending=pending)
        return self._result(RunState.WAITING_CHILDREN)

    async def _settled_calls(
        self, step: OpenStep, decisions: dict[str, Decided]
    ) -> tuple[list[PendingApproval], list[str]]:
        """:meth:`_tool_calls`, then, when only child runs are left to wait for and they
        all ended meanwhile (``children_ended``), their outcomes recorded as their calls'
        results. When some did not, the run parks for them all: a call whose child this
        execution started is not in ``children`` until it ended (absent, it reads as gone),
        and the resumed run finds the ended ones in the store."""
        pending, waiting = await self._tool_calls(step, decisions)
        if waiting and not pending and self.children_ended is not None:
            child_ids = [step.children[call] for call in waiting]
            ended = await self.children_ended(child_ids)
            if ended.keys() >= set(child_ids):
                self.children = {**self.children, **ended}
                pending, waiting = await self._tool_calls(step, decisions)
        return pending, waiting

    async def _tool_calls(
        self, step: OpenStep, decisions: dict[str, Decided]
    ) -> tuple[list[PendingApproval], list[str]]:
        """Run the step's unresolved calls in parallel; returns the calls left waiting for
        a human, and the ids of those waiting for a child run.

        Each result is journaled (``tool.result``) as soon as its call ends; the
        tool messages join the conversation in call order once every call of the
        step has a result.
        """
        toolset = self.agent.toolset
        pending: list[PendingApproval] = []
        waiting: list[str] = []
        runnable: list[tuple[int, ToolCall, bool]] = []
        handoffs = [c.id for c in step.calls if toolset.ref_of(c.name) == HANDOFF_TOOL]
        for index, call in enumerate(step.calls):
            if call.id in step.results:
                continue
            if call.id in handoffs[1:]:  # one handoff per turn: the first one
                refused = ToolErrorInfo(
                    ToolErrorCode.INVALID_INPUT,
                    "only one handoff per turn: this turn's first handoff call hands off",
                )
                outcome = ToolOutcome(call, HANDOFF_TOOL, "", refused)
                step.results[call.id] = await self._record(step.step, outcome)
                continue
            if call.id in step.children:
                child_id = step.children[call.id]
                child = self.children.get(child_id)
                if child is None:  # deleted: waiting would never end
                    gone = ToolErrorInfo(
                        ToolErrorCode.CHILD_FAILED,
                        f"the child run {child_id} is gone",
                        details={"run_id": child_id, "state": None, "error": None},
                    )
                    outcome = toolset.answered(call, None, gone)
                    step.results[call.id] = await self._record(step.step, outcome)
                elif not child.state.finished:
                    waiting.append(call.id)
                else:
                    step.results[call.id] = await self._child_finished(step.step, call, child)
                continue
            decision = decisions.pop(call.id, None) or step.decided.get(call.id)
            if decision is not None:
                if isinstance(decision, Decision):
                    approved, reason = decision.approved, decision.reason
                else:
                    approved, reason = decision
                if call.id not in step.decided:
                    await self.emit(
                        ApprovalResolvedData(
                            step=step.step,
                            call_id=call.id,
                            tool=toolset.ref_of(call.name),
                            approved=approved,
                            reason=reason,
                            **(decision.journaled() if isinstance(decision, Decision) else {}),
                        )
                    )
                if not approved:
                    rejected = ToolErrorInfo(
                        ToolErrorCode.APPROVAL_REJECTED,
                        f"a human rejected this call{': ' + reason if reason else ''}",
                    )
                    outcome = ToolOutcome(call, toolset.ref_of(call.name), "", rejected)
                    step.results[call.id] = await self._record(step.step, outcome)
                    continue
                runnable.append((index, call, True))
            elif call.id in step.awaiting:
                pending.append(self._pending(call, step.awaiting[call.id]))
            elif call.id in step.started and not toolset.is_idempotent(call.name):
                pending.append(await self._interrupted(step.step, call))
            else:
                runnable.append((index, call, False))

        sharing = sum(1 for _, call, _ in runnable if toolset.shares_budget(call.name))
        outside: Sequence[RunRecord] = ()
        if sharing and self.outside_children is not None:
            outside = await self.outside_children(self.charged)
        share = self._outside_share(step, sharing, outside)
        spent: list[tuple[Usage, float]] = []

        async def invoke(index: int, call: ToolCall, approved: bool) -> None:
            async def started() -> None:
                await self.emit(
                    ToolCallData(
                        step=step.step,
                        call_id=call.id,
                        tool=toolset.ref_of(call.name),
                        arguments=call.arguments,
                        idempotent=toolset.is_idempotent(call.name),
                    )
                )

            context = self._context(step.step, index, call, share)
            outcome = await toolset.invoke(call, context, approved=approved, on_start=started)
            for done in context.journal:  # what the call did, before its result
                await self.emit(replace(done, step=step.step, call_id=call.id, tool=outcome.ref))
                spent.append(charge_of(done))  # what it paid (embeddings), the run's spend
            if outcome.child is not None:
                step.children[call.id] = outcome.child.run_id
                waiting.append(call.id)
                await self.emit(
                    ChildStartData(
                        step=step.step,
                        call_id=call.id,
                        tool=outcome.ref,
                        run_id=outcome.child.run_id,
                        agent=outcome.child.agent,
                    )
                )
            elif outcome.handoff is not None:
                outcome = self._handoff_allowed(outcome)
                accepted: JsonObject | None = None
                if outcome.handoff is not None:
                    step.handoff = (call.id, outcome.handoff)
                    accepted = {"agent": outcome.handoff.agent, "reason": outcome.handoff.reason}
                step.results[call.id] = await self._record(step.step, outcome, accepted)
            elif outcome.needs_approval:
                assert outcome.error is not None
                approval = self._pending(call, outcome.error.reason)
                pending.append(approval)
                await self.emit(ApprovalRequestedData(step=step.step, **dump(approval)))
            else:
                step.results[call.id] = await self._record(step.step, outcome)

        if len(runnable) == 1:  # the common case needs no task group
            await invoke(*runnable[0])
        elif runnable:
            with self.emit.parallel():
                async with anyio.create_task_group() as group:
                    for index, call, approved in runnable:
                        group.start_soon(invoke, index, call, approved)
        if spent:  # once every call is recorded, all of it: a limit passed fails the run
            self.budget.spend(sum((u for u, _ in spent), Usage()), sum(c for _, c in spent))
        if not step.unresolved():
            self.messages += [step.results[c.id] for c in step.calls]
        order = {c.id: i for i, c in enumerate(step.calls)}
        return sorted(pending, key=lambda p: order[p.call_id]), waiting

    def _handoff_allowed(self, outcome: ToolOutcome) -> ToolOutcome:
        """The outcome of a ``handoff`` call: itself, or a refusal when the run may not
        hand off (no ``switch``; ``limits.max_handoffs`` of the handing agent reached)."""
        assert outcome.handoff is not None
        limit = self.agent.limits.max_handoffs
        error: ToolErrorInfo | None = None
        if self.switch is None:
            error = ToolErrorInfo(ToolErrorCode.UNAVAILABLE, "this runtime cannot hand off")
        elif self.handoffs >= limit:
            error = ToolErrorInfo(
                ToolErrorCode.BUDGET_EXCEEDED,
                f"the run has handed off {self.handoffs} times, this agent's limit of "
                f"{limit} (limits.max_handoffs)",
                details={"limit": "max_handoffs", "max_handoffs": limit},
            )
        if error is None:
            return outcome
        return ToolOutcome(outcome.call, outcome.ref, "", error, outcome.attempts)

    async def _step_done(self, step: OpenStep) -> None:
        """What follows a step whose calls all have results, before its ``step.finish``:
        the spend of child runs its tool programs started over the API, then its handoff."""
        if self.outside_children is not None:
            for child in await self.outside_children(self.charged):
                if child.state.finished:  # (one still running is charged once it ended)
                    await self._charge_outside(step.step, child)
        if step.handoff is not None:
            call_id, handoff = step.handoff
            await self._hand_off(step.step, call_id, handoff)

    async def _charge_outside(self, step: int, child: RunRecord) -> None:
        """Journal the spend of a finished child run a tool program started (no call of
        this run answers with it) and charge it; a limit this passes fails the run."""
        self.charged.add(child.id)
        await self.emit(
            ChildFinishData(
                step=step,
                run_id=child.id,
                agent=child.agent,
                state=child.state.value,
                usage=dump(child.usage),
                cost_usd=child.cost_usd,
            )
        )
        self.budget.spend(child.usage, child.cost_usd)

    async def _hand_off(self, step: int, call_id: str, handoff: Handoff) -> None:
        """Go on under ``handoff.agent``: journal the switch, then take its definition,
        its system prompt (in place of the first) and its limits (the spend so far kept)."""
        assert self.switch is not None
        target = await self.switch(handoff.agent)
        system = target.instructions
        if target.output_schema is not None:
            system = f"{system}\n\n{schema_instruction(target.output_schema)}".strip()
        await self.emit(
            HandoffData(
                step=step,
                call_id=call_id,
                from_agent=self.agent.name,
                to=target.name,
                reason=handoff.reason,
                system=system,
            )
        )
        self.initial_count += replace_system(self.messages, system)
        self.agent = target
        self.handoffs += 1
        self.budget = Budget(
            capped(target.limits, self.cost_cap, self.token_cap),
            self.budget.steps,
            self.budget.usage,
            self.budget.cost_usd,
            inherited_limits(target.limits, self.cost_cap, self.token_cap),
        )
        self.emit.redact_also(target.toolset)
        if self._deadline_scope is not None:  # the target's time limit, from the run's start
            self._deadline_scope.deadline = self._started_at + target.limits.timeout_seconds

    async def _child_finished(self, step: int, call: ToolCall, child: RunRecord) -> Message:
        """Record a finished child run as its call's result: ``child.finish`` (with the
        child's spend, charged to this run) and ``tool.result`` (its answer, or its error
        as ``child_failed``), one commit (see the journal). A limit this passes fails the
        run after both are recorded."""
        await self.emit(
            ChildFinishData(
                step=step,
                call_id=call.id,
                run_id=child.id,
                agent=child.agent,
                state=child.state.value,
                usage=dump(child.usage),
                cost_usd=child.cost_usd,
            )
        )
        error = None
        if child.state is not RunState.SUCCEEDED:
            cause = child.error or {}
            what = f": {cause.get('code', 'error')}: {cause.get('message', '')}" if cause else ""
            error = ToolErrorInfo(
                ToolErrorCode.CHILD_FAILED,
                f"the run {child.id} of agent {child.agent!r} ended {child.state.value}{what}",
                details={"run_id": child.id, "state": child.state.value, "error": child.error},
            )
        outcome = self.agent.toolset.answered(call, child.output, error)
        message = await self._record(step, outcome)
        self.charged.add(child.id)
        self.budget.spend(child.usage, child.cost_usd)
        return message

    async def _interrupted(self, step: int, call: ToolCall) -> PendingApproval:
        ref = self.agent.toolset.ref_of(call.name)
        what = (
            f"the call to {ref!r} was interrupted (its worker stopped) and its outcome is unknown"
        )
        if self.agent.interrupted_calls == "fail":
            raise CorralError(f"{what}; the agent fails such runs")
        reason = f"{what}; the tool is not idempotent, so running it again needs a human's approval"
        approval = self._pending(call, reason)
        await self.emit(ApprovalRequestedData(step=step, **dump(approval)))
        return approval

    def _pending(self, call: ToolCall, reason: str) -> PendingApproval:
        toolset = self.agent.toolset
        now = time.time()
        ttl = toolset.approval.expires_after_seconds
        return PendingApproval(
            call.id,
            toolset.ref_of(call.name),
            call.arguments,
            reason,
            now,
            now + ttl if ttl else None,
        )

    async def _record(
        self, step: int, outcome: ToolOutcome, handoff: JsonObject | None = None
    ) -> Message:
        await self.emit(
            ToolResultData(
                step=step,
                call_id=outcome.call.id,
                tool=outcome.ref,
                output=outcome.output,
                error=dump(outcome.error) if outcome.error else None,
                attempts=outcome.attempts,
                duration_ms=outcome.duration_ms,
                retries=list(outcome.retries) if outcome.retries else None,
                handoff=handoff,
            )
        )
        return Message.tool(outcome.call, outcome.model_text(), is_error=outcome.error is not None)

    def _outside_share(
        self, step: OpenStep, sharing: int, outside: Sequence[RunRecord]
    ) -> tuple[float | None, int | None]:
        """What each of ``sharing`` calls of ``step`` that can spend the run's budget outside
        the run (child runs) may spend, as ``(cost, tokens)`` (``None``: no limit): what the
        run has left, less the caps of the step's children still running (each may spend all
        of its cap before it is charged) and what the uncharged children tool programs
        started (``outside``: of this step or an earlier one) hold - their caps while they
        run, their spend once ended - split evenly. Together they cannot spend more than
        the run has left, however many run at once."""
        running = [
            child
            for call_id, run_id in step.children.items()
            if call_id not in step.results
            and (child := self.children.get(run_id)) is not None
            and not child.state.finished
        ]
        running += [child for child in outside if not child.state.finished]
        ended = [child for child in outside if child.state.finished]
        return self.budget.left(*held_by(running, ended), max(sharing, 1))

    def _context(
        self, step: int, index: int, call: ToolCall, share: tuple[float | None, int | None]
    ) -> ToolContext:
        agent = self.agent
        environment: Mapping[str, str] = {}
        hidden: Mapping[str, str] = {}
        if agent.toolset.shares_budget(call.name):
            cost_left, tokens_left = share
        else:  # (it starts nothing: what the run has left, as it is)
            cost_left, tokens_left = self.budget.left()
        if self.call_environment is not None and agent.toolset.plants_environment(call.name):
            # (a token minted for this call, carrying what the run has left)
            environment, hidden = self.call_environment(f"{step}:{index}", cost_left, tokens_left)
        return ToolContext(
            run_id=self.run_id,
            agent=agent.name,
            namespace=agent.namespace,
            call_id=call.id,
            idempotency_key=f"{self.run_id}:{step}:{index}",
            workspace=agent.workspace,
            environment=environment,
            hidden=hidden,
            cost_left=cost_left,
            tokens_left=tokens_left,
        )

    async def _finish_step(self, step: int) -> None:
        await self.emit(
            StepFinishData(step=step, usage=dump(self.budget.usage), cost_usd=self.budget.cost_usd)
        )

    async def _failed(self, exc: CorralError) -> RunResult:
        error = exc.to_dict()
        await self.emit(ErrorData.of(error))
        return self._result(RunState.FAILED, error=error)

    def _result(
        self,
        state: RunState,
        *,
        output: Any = None,
        error: dict[str, Any] | None = None,
        pending: list[PendingApproval] | None = None,
    ) -> RunResult:
        return RunResult(
            state=state,
            output=output,
            error=error,
            messages=list(self.messages),
            pending_approvals=pending or [],
            steps=self.budget.steps,
            usage=self.budget.usage,
            cost_usd=self.budget.cost_usd,
            initial_count=self.initial_count,
            agent=self.agent.name,
        )
