"""Execute one claimed run: build the agent, run or resume the loop, keep the lease alive.

Every write goes through the lease (the store refuses it once another worker
has claimed the run), so a stalled worker that wakes up after its lease expired
cannot commit anything; nor does it start another model or tool call once it
knows its lease ran out unrenewed (the journal checks the lease's deadline).
While the run executes, the executor's :class:`~corral.runtime.leases.LeaseKeeper`
renews the lease (one task for all runs) and stops the run when the lease is
lost or a cancellation was asked for.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Self

import anyio
import anyio.abc

from corral.bus.base import Bus
from corral.core.backoff import jittered_backoff
from corral.core.clock import SYSTEM_CLOCK, Clock
from corral.core.errors import CorralError, LeaseLostError, ModelError, ToolError, ToolErrorCode
from corral.core.events import ErrorData, Event, EventType, HandoffData, RunFinishData, RunStartData
from corral.core.ids import new_id
from corral.core.messages import Message
from corral.core.redaction import Redactor
from corral.core.runs import Approval, ApprovalState, Decision, Lease, RunRecord, RunState
from corral.core.settings import Settings
from corral.engine.loop import (
    AgentDefinition,
    AgentLoop,
    Decided,
    RunResult,
)
from corral.engine.replay import replay
from corral.runtime.agent_tokens import (
    REDACTION_NAME,
    TOKEN_VARIABLE,
    AgentTokenIssuer,
    AgentTokenSigner,
)
from corral.runtime.agents import AgentCache, Loading
from corral.runtime.delegation import (
    CHILD_WAIT_SECONDS,
    ChildSlots,
    StoreDelegation,
    started_by_a_tool_program,
)
from corral.runtime.health import TRANSIENT, WorkerHealth
from corral.runtime.journal import FencedSink, Observer
from corral.runtime.leases import LeaseKeeper, Reason
from corral.runtime.sessions import missing_session, session_history
from corral.runtime.systems import SystemCoordinator
from corral.store.base import Store

Outcome = Literal["done", "released", "lost"]
#: what takes a run a save woke and claimed (see :meth:`RunExecutor.execute`)
WokenRun = Callable[[RunRecord, Lease], None]

log = logging.getLogger(__name__)

#: Retry backoff of whole runs: base * 2^(attempt-1), capped, with full jitter.
RUN_RETRY_MAX_SECONDS = 60.0


@dataclass
class _Stop:
    reason: Reason | None = None


class RunExecutor:
    """Runs claimed runs for one worker (or for ``corral run`` in-process).

    Use it as an async context: it keeps the live agents its runs share
    (:class:`~corral.runtime.agents.AgentCache`) until it is left.
    """

    def __init__(
        self,
        store: Store,
        settings: Settings,
        *,
        lease_seconds: float = 30.0,
        observer: Observer | None = None,
        loading: Loading | None = None,
        retry_base_seconds: float = 1.0,
        bus: Bus | None = None,
        health: WorkerHealth | None = None,
        clock: Clock = SYSTEM_CLOCK,
        tokens: AgentTokenIssuer | None = None,
        slots: ChildSlots | None = None,
    ) -> None:
        """``tokens`` mints the agent tokens of agents with links (default: signed with the
        deployment's secret key, ``CORRAL_URL`` from ``CORRAL_PUBLIC_URL``); ``slots``: the
        worker's, where child runs start at once (see :mod:`corral.runtime.delegation`)."""
        self.store = store
        self.tokens = tokens or AgentTokenIssuer(
            AgentTokenSigner.from_settings(settings), lambda: settings.public_url
        )
        self.clock = clock
        self.bus = bus
        self.settings = settings
        self.lease_seconds = lease_seconds
        self.retry_base_seconds = retry_base_seconds
        self.observer = observer
        self.slots = slots
        #: (namespace, agent) of the agents with ``max_concurrent_runs`` whose runs this
        #: executor started, as last built: the end of one of their runs may let a queued
        #: run of theirs be claimed (nothing announces that)
        self.limited_agents: set[tuple[str, str]] = set()
        # the runs executing here, as claimed: their child runs are started without a read
        self._executing: dict[str, RunRecord] = {}
        # the runs executing here that may have children their end would leave running (a
        # journal with children, or agent tokens handed out): their end cancels them
        self._parents: set[str] = set()
        delegation = StoreDelegation(store, bus, slots, self._executing)
        self.agents = AgentCache(store, settings, loading, delegation)
        self.leases = LeaseKeeper(store, lease_seconds, health, clock)
        self.systems = SystemCoordinator(store, bus, clock)
        # the journal writes in flight of every run (see FencedSink)
        self._writes: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> Self:
        await self.agents.__aenter__()
        await self.leases.__aenter__()
        self._writes = anyio.create_task_group()
        await self._writes.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        writes, self._writes = self._writes, None
        if writes is not None:  # empty by now: each run's sink waited for its writes
            await writes.__aexit__(None, None, None)
        await self.leases.__aexit__(*exc_info)
        await self.agents.__aexit__(*exc_info)

    def _sink(self, lease: Lease) -> FencedSink:
        return FencedSink(
            self.store, lease, self.observer, self.bus, writes=self._writes, clock=self.clock
        )

    async def execute(
        self,
        record: RunRecord,
        lease: Lease,
        shutdown: anyio.Event | None = None,
        *,
        on_woken: WokenRun | None = None,
    ) -> Outcome:
        """Execute one claimed run until it ends, pauses, is released, or its lease is lost.

        With ``on_woken``, the run the outcome's save queued (a parent whose last child
        this was, or the run itself parked for children that all finished meanwhile) is
        claimed for this lease's owner in that same commit and handed to ``on_woken``
        (not announced): the caller goes on with it in the slot this run frees."""
        if self._writes is None:
            raise RuntimeError("RunExecutor used outside its `async with` block")
        sink = self._sink(lease)
        self._executing[record.id] = record
        try:
            async with sink:
                return await self._execute(record, lease, sink, shutdown, on_woken)
        except LeaseLostError:
            return "lost"
        except TRANSIENT:  # the store or bus failed, not the run: the worker outlives it
            raise
        except Exception as exc:  # noqa: BLE001 - the attempt's cause, kept (cancellation passes)
            return await self._failed_attempt(record, lease, exc, sink.redactor)
        finally:
            if self._executing.get(record.id) is record:
                del self._executing[record.id]
                self._parents.discard(record.id)

    async def _failed_attempt(
        self, record: RunRecord, lease: Lease, exc: Exception, redactor: Redactor
    ) -> Outcome:
        """An attempt that raised: journal the error as the attempt's cause, then retry the
        run with backoff, or end it in dead letter with that cause after its last attempt.

        If even that cannot be written (the store is down), that error propagates and the
        lease is left to expire (the run is tried again, the attempt counted)."""
        log.error("run %s: attempt %d failed", record.id, record.attempts, exc_info=exc)
        error = exc.to_dict() if isinstance(exc, CorralError) else _internal_error(exc)
        sink = self._sink(lease)
        sink.redactor = redactor  # what the attempt's agent resolved, if it got that far
        try:
            async with sink:
                events = await self.store.list_events(record.id)
                sink.last_seq = events[-1].seq if events else 0
                if record.attempts >= record.max_attempts:
                    if not events:
                        await sink.emit(RunStartData(agent=record.agent, input=record.input))
                    await sink.emit(ErrorData.of(error))
                    await sink.emit(RunFinishData(state=RunState.DEAD_LETTER.value))
                    result = RunResult(state=RunState.DEAD_LETTER, error=error)
                    await self._save(record, lease, result, sink)
                    return "done"
                # A journal must begin with the run.start the engine writes (it carries the
                # conversation); before it, the cause stays in the log until the last attempt.
                retry_at = self._retry_at(record)
                if events:
                    await sink.emit(ErrorData.of(error, **self._retry(record, retry_at)))
                    await sink.flush()
                await self.store.release_run(lease, not_before=retry_at)
        except LeaseLostError:
            return "lost"
        await self.announce_released(lease)
        return "released"

    async def _execute(
        self,
        record: RunRecord,
        lease: Lease,
        sink: FencedSink,
        shutdown: anyio.Event | None,
        on_woken: WokenRun | None,
    ) -> Outcome:
        stop = _Stop()
        # Events are only ever written under a lease, and a run's first lease has fencing
        # token 1: under it there is no journal to read yet. A system run's coordinator
        # reads the part of the journal its pass needs (SystemCoordinator.journal).
        if record.is_system_run:
            events = await self.systems.journal(record)
        else:
            events = await self.store.list_events(record.id) if lease.token > 1 else []
        sink.last_seq = events[-1].seq if events else 0
        result: RunResult | Literal["released"] | None = None
        with anyio.CancelScope() as scope:

            def halt(reason: Reason) -> None:
                if stop.reason is None:
                    stop.reason = reason
                scope.cancel()

            with self.leases.keep(lease, halt, shutdown) as sink.held:
                if shutdown is not None and shutdown.is_set():
                    halt("shutdown")
                try:
                    result = await self._run(record, lease, sink, events)
                except* LeaseLostError:  # a refused write in parallel tool calls comes grouped
                    stop.reason = "lost"
        sink.held = None  # (no longer renewed: what follows is fenced by the store alone)
        if stop.reason == "lost":
            return "lost"
        try:
            if result == "released":  # a retry with backoff: due at its not_before
                await self.announce_released(lease)
                return "released"
            if stop.reason == "shutdown":
                await sink.flush()
                # Stopping the worker did not fail the run: the attempt is given back
                # (an exhausted claim counted none, so has none to give back).
                await self.store.release_run(lease, refund_attempt=not lease.exhausted)
                await self.announce_released(lease)
                return "released"
            if stop.reason == "cancelled":
                record.cancel_requested = True  # as stored (the lease keeper read it there)
                await sink.flush()
                await sink.emit(RunFinishData(state=RunState.CANCELLED.value))
                result = RunResult(state=RunState.CANCELLED)
            assert isinstance(result, RunResult)
            await self._save(record, lease, result, sink, on_woken)
        except LeaseLostError:
            return "lost"
        return "done"

    async def _run(
        self, record: RunRecord, lease: Lease, sink: FencedSink, events: list[Event]
    ) -> RunResult | Literal["released"]:
        ended = _journaled_end(events)
        if ended is not None:  # its worker died between the last event and saving the record
            return ended
        if record.cancel_requested:  # asked while it was queued between two attempts
            await sink.emit(RunFinishData(state=RunState.CANCELLED.value))
            return RunResult(state=RunState.CANCELLED)
        if lease.exhausted:
            # This claim only ends the run: it is not an attempt of its own (the store
            # counted none).
            error = _gave_up(record, events)
            await sink.emit(ErrorData.of(error))
            await sink.emit(RunFinishData(state=RunState.DEAD_LETTER.value))
            return RunResult(state=RunState.DEAD_LETTER, error=error)
        if record.is_system_run:  # a graph of agents: its coordinator, not an agent loop
            return await self.systems.run(record, sink, events)
        if any(event.type is EventType.CHILD_START for event in events):
            self._parents.add(record.id)
        gone = await missing_session(self.store, record)
        if gone is not None:
            return await self._failed_to_start(sink, gone, events, record)
        # the agent the conversation is under: the submitted one, or the last handoff's
        active = _active_agent(events) or record.agent
        try:
            agent, release = await self.agents.acquire(
                record.namespace, active, output_schema=record.output_schema
            )
        except TRANSIENT:  # reading the resources failed, not the Agent: the worker's error
            raise
        except CorralError as exc:  # (the builder redacted it)
            return await self._failed_to_start(sink, exc, events, record)
        sink.redactor = agent.toolset.redactor
        if agent.name == record.agent:  # (the agent a claim's admission counts the run under)
            if agent.max_concurrent_runs is None:
                self.limited_agents.discard((record.namespace, record.agent))
            else:
                self.limited_agents.add((record.namespace, record.agent))
        releases = [release]
        calls = _LinkedCalls(self, record, agent, sink, resumed=bool(events))

        async def switch(name: str) -> AgentDefinition:
            if name not in calls.agent.links:  # unlinked while the handoff's turn waited
                raise ToolError(
                    ToolErrorCode.PERMISSION_DENIED,
                    f"agent {calls.agent.name!r} no longer links {name!r}: no handoff",
                )
            target, give_back = await self.agents.acquire(
                record.namespace, name, output_schema=record.output_schema
            )
            releases.append(give_back)
            sink.redactor = sink.redactor.merged(target.toolset.redactor)
            calls.agent = target
            return target

        try:
            loop = AgentLoop(
                agent,
                record.id,
                sink,
                raise_retryable=True,
                call_environment=calls.environment,
                switch=switch,
                outside_children=calls.outside_children,
                children_ended=self._children_ended,
                cost_cap=record.max_cost_usd,
                token_cap=record.max_tokens,
            )
            try:
                if events:
                    decisions = await self._decisions(record.id, events)
                    children = await self._children(record.id, events)
                    return await loop.resume(events, decisions, children)
                history = await self._history(record, agent)
                return await loop.run(record.input, history)
            except ModelError as exc:  # retryable: try the whole run again later, or give up
                if record.attempts >= record.max_attempts:
                    return await loop.conclude(RunState.DEAD_LETTER, exc)
                await sink.flush()
                retry_at = self._retry_at(record)
                await sink.emit(ErrorData.of(exc.to_dict(), **self._retry(record, retry_at)))
                await self.store.release_run(lease, not_before=retry_at)
                return "released"
        finally:
            for give_back in releases:
                give_back()

    async def _children_ended(self, child_ids: list[str]) -> dict[str, RunRecord]:
        """Those of the run's children ``child_ids`` that ended, when they all run on this
        worker, within ``CHILD_WAIT_SECONDS`` (else none, or some: the run parks for the
        others). Their records as their executions saved them: no read."""
        if self.slots is None:
            return {}
        return await self.slots.ended(child_ids, CHILD_WAIT_SECONDS)

    async def announce_released(self, lease: Lease) -> None:
        """Announce a run this lease released: its fencing token marks the release, which
        no other announcement of the run shares (each claim takes a new token)."""
        if self.bus is not None:
            await self.bus.announce_runnable([lease.run_id], mark=f"released:{lease.token}")

    def _retry(self, record: RunRecord, retry_at: float) -> dict[str, Any]:
        """What an attempt's ``error`` event says of the retry: the attempt that comes
        next, of how many, and in how many seconds."""
        return {
            "retry": record.attempts + 1,
            "max_attempts": record.max_attempts,
            "retry_in": round(max(0.0, retry_at - self.clock.now()), 3),
        }

    def _retry_at(self, record: RunRecord) -> float:
        """When the run is due again after its failed attempt (backing off)."""
        backoff = jittered_backoff(record.attempts, self.retry_base_seconds, RUN_RETRY_MAX_SECONDS)
        return self.clock.now() + backoff

    async def _decisions(self, run_id: str, events: list[Event]) -> dict[str, Decided]:
        """The run's decided approvals, with who decided and when (journaled on resume),
        when its journal asked for any (one read then: a resumed parent of children asked
        for none)."""
        decided: dict[str, Decided] = {}
        if not any(e.type is EventType.APPROVAL_REQUESTED for e in events):
            return decided
        for approval in await self.store.list_approvals(run_id=run_id):
            if approval.state is ApprovalState.PENDING:
                continue
            expired = approval.state is ApprovalState.EXPIRED
            decided[approval.call_id] = Decision(
                approval.state is ApprovalState.APPROVED,
                "the approval request expired" if expired else approval.decision_reason,
                by=approval.decided_by,
                decided_at=approval.decided_at,
                approval_id=approval.id,
                expired=expired,
            )
        return decided

    async def _children(self, run_id: str, events: list[Event]) -> dict[str, RunRecord]:
        """The run's child runs by id, when its journal started any (one read then)."""
        if not any(e.type is EventType.CHILD_START for e in events):
            return {}
        return {child.id: child for child in await self.store.list_children(run_id)}

    async def _history(self, record: RunRecord, agent: AgentDefinition) -> list[Message]:
        if record.session_id is None:
            return []
        return await session_history(self.store, record.namespace, record.session_id, agent)

    async def _failed_to_start(
        self, sink: FencedSink, exc: CorralError, events: list[Event], record: RunRecord
    ) -> RunResult:
        if not events:
            await sink.emit(RunStartData(agent=record.agent, input=record.input))
        await sink.emit(ErrorData.of(exc.to_dict()))
        await sink.emit(RunFinishData(state=RunState.FAILED.value))
        return RunResult(state=RunState.FAILED, error=exc.to_dict())

    async def _save(
        self,
        record: RunRecord,
        lease: Lease,
        result: RunResult,
        sink: FencedSink,
        on_woken: WokenRun | None = None,
    ) -> None:
        """Store the run's outcome with its last events (``run.finish``), in one commit;
        ``record`` is the stored run afterwards. Everything of the outcome is redacted here
        (the engine redacts the events)."""
        result = _redacted(result, sink.redactor)
        record.state = result.state
        record.output = result.output
        record.error = result.error
        if result.messages:
            record.messages = result.messages
        record.steps = result.steps or record.steps
        record.usage = result.usage if result.steps else record.usage
        record.cost_usd = result.cost_usd or record.cost_usd
        record.pending_approvals = result.pending_approvals
        if result.agent:  # (a result the loop made: it knows the agent it ended under)
            record.active_agent = result.agent if result.agent != record.agent else None
        if result.state.finished:
            record.finished_at = self.clock.now()
        if result.state is not RunState.RUNNING:  # as save_run stores it: no lease left
            record.lease_owner = record.lease_expires_at = None
        if result.state.parked:
            # Attempts count the tries that failed to get anywhere: a run that reached a
            # human's decision (or its children) starts over, or its pauses alone would
            # dead-letter it.
            record.attempts = 0
        asked = (
            {a.call_id for a in await self.store.list_approvals(run_id=record.id)}
            if result.pending_approvals
            else set()
        )
        approvals = [
            Approval(
                id=new_id("apr"),
                run_id=record.id,
                namespace=record.namespace,
                agent=result.agent or record.agent,  # whose call it is (after a handoff)
                call_id=p.call_id,
                tool=p.tool,
                arguments=p.arguments,
                reason=p.reason,
                requested_at=p.requested_at,
                expires_at=p.expires_at,
            )
            for p in result.pending_approvals
            if p.call_id not in asked
        ]
        added = result.new_messages if result.state is RunState.SUCCEEDED else []
        await sink.settle()
        woken = await self.store.save_run(
            record,
            lease,
            approvals,
            session_messages=added,
            events=sink.take(),
            claim_woken=None if on_woken is None else (lease.owner, self.lease_seconds),
        )
        await sink.announce()
        # (queued nothing: a parent waiting in its slot or for other children hears nothing)
        if woken is not None and woken.record is not None and woken.lease is not None:
            assert on_woken is not None  # (only asked for with it)
            on_woken(woken.record, woken.lease)  # claimed already: announcing costs a claim
        elif woken is not None:
            await self._announce_woken(record, lease)
        if record.state is RunState.CANCELLED or (
            record.state.finished and record.id in self._parents
        ):
            # A run's end ends its children: one started while the cancellation was on its
            # way (after the store's cascade looked) is cancelled now, and so is one still
            # running when its parent ended otherwise (a tool program's, started without
            # waiting; those a run given up on was waiting for): nothing would charge what
            # it spent after, or read its answer.
            await self.store.request_cancel(record.id)

    async def _announce_woken(self, record: RunRecord, lease: Lease) -> None:
        """Announce the run a save of ``record`` queued (see ``Store.save_run``): a finished
        child's parent, or the run itself parked for children that all finished meanwhile.
        The mark names the change: the child that finished, the claim that parked it."""
        if self.bus is None:
            return
        if record.state.finished and record.parent_run_id is not None:
            await self.bus.announce_runnable([record.parent_run_id], mark=f"child:{record.id}")
        elif record.state is RunState.WAITING_CHILDREN:
            await self.bus.announce_runnable([record.id], mark=f"parked:{lease.token}")


class _LinkedCalls:
    """What a run's tool calls get from the runtime for its links: a fresh agent token
    (and the URL) per call of an agent with links, redacted from the call's outcome, for
    the agent the run is under now; and the child runs those calls' programs started
    over the API (``POST /v1/links/{agent}/exec``) once finished, for the loop to charge."""

    def __init__(
        self,
        executor: RunExecutor,
        record: RunRecord,
        agent: AgentDefinition,
        sink: FencedSink,
        *,
        resumed: bool,
    ) -> None:
        self.tokens = executor.tokens
        self.store = executor.store
        self.parents = executor._parents
        self.record = record
        self.agent = agent
        self.sink = sink
        # whether a token went out since the children were last looked for (a resumed run:
        # maybe, before the crash)
        self.minted = resumed
        # whether the last look found children not yet charged (looked for again until
        # they are: one still running holds its caps, then is charged once it ended)
        self.uncharged = False

    def environment(
        self, call: str, cost_left: float | None, tokens_left: int | None
    ) -> tuple[Mapping[str, str], Mapping[str, str]]:
        agent, record = self.agent, self.record
        if not agent.links:
            return {}, {}
        self.minted = True
        self.parents.add(record.id)  # (its program may start children over the API)
        env = self.tokens.environment(
            namespace=record.namespace,
            agent=agent.name,
            run_id=record.id,
            links=agent.links,
            cost_left=cost_left,
            tokens_left=tokens_left,
            call=call,
            seq=self.sink.last_seq,
        )
        return env, {REDACTION_NAME: env[TOKEN_VARIABLE]}

    async def outside_children(self, known: set[str]) -> list[RunRecord]:
        if not self.minted and not self.uncharged:  # no token, no new child: no read
            return []
        self.minted = False
        children = [
            child
            for child in await self.store.list_children(self.record.id)
            if child.id not in known and started_by_a_tool_program(child, self.record.id)
        ]
        self.uncharged = bool(children)
        return children


def _active_agent(events: list[Event]) -> str | None:
    """The agent of the journal's last ``handoff``, if any."""
    for event in reversed(events):
        if isinstance(event.data, HandoffData):
            return event.data.to
    return None


def _internal_error(exc: Exception) -> dict[str, Any]:
    """An unexpected exception as a run error: its type and message, no traceback."""
    return {"code": "internal_error", "message": f"{type(exc).__name__}: {exc}"}


def _gave_up(record: RunRecord, events: list[Event]) -> dict[str, Any]:
    """The error of a run whose workers stopped during every attempt, with the last error
    its journal holds (an earlier attempt's) as the cause, when there is one."""
    message = f"gave up after {record.max_attempts} attempts (its workers kept stopping)"
    last = _last_error(events)
    if last is None:
        return {"code": CorralError.code, "message": message}
    cause = dataclasses.replace(last, retry=None, max_attempts=None, retry_in=None).to_dict()
    return {
        "code": CorralError.code,
        "message": f"{message}; the last error: {last.message}",
        "cause": cause,
    }


def _last_error(events: list[Event]) -> ErrorData | None:
    """The journal's last ``error`` event, if any."""
    return next((e.data for e in reversed(events) if isinstance(e.data, ErrorData)), None)


def _redacted(result: RunResult, redact: Redactor) -> RunResult:
    if not redact:
        return result
    return dataclasses.replace(
        result,
        output=redact.data(result.output),
        error=redact.data(result.error),
        messages=redact.messages(result.messages),
        pending_approvals=[redact.approval(p) for p in result.pending_approvals],
    )


def _journaled_end(events: list[Event]) -> RunResult | None:
    """The result a journal that ends with ``run.finish`` records, or ``None``."""
    if not events or not isinstance(finish := events[-1].data, RunFinishData):
        return None
    checkpoint = replay(events)
    state = RunState(finish.state)
    error = None
    if state is not RunState.SUCCEEDED and (last := _last_error(events)) is not None:
        error = last.to_dict()
    return RunResult(
        state=state,
        output=finish.output,
        error=error,
        messages=checkpoint.messages,
        steps=checkpoint.steps,
        usage=checkpoint.usage,
        cost_usd=checkpoint.cost_usd,
        initial_count=checkpoint.initial_count,
    )


__all__ = ["AgentDefinition", "FencedSink", "Observer", "RunExecutor"]
