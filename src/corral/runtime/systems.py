"""Agent system runs: the deterministic coordinator of a graph of agents (not an LLM).

A system run (``RunRecord.system`` set, no ``branch_id``) is an ordinary durable run
that a worker claims like any other; instead of an agent loop the executor hands it
to :class:`SystemCoordinator`. Each claim reads the run's position from the store -
its agent messages (:mod:`corral.core.agent_messages`) and its node runs (child runs
with ``parent_run_id`` = the system run): only the unfinished ones when the last pass
saved its position under the claim before (:mod:`corral.runtime.system_pass`), all of
them otherwise - and makes one pass:

1. **Finished nodes.** A delivered message whose node run finished becomes ``done``
   (its output taken) or ``failed``; a failed node fails the system run, its error
   naming the node (the other node runs still going are cancelled).
2. **Routing.** The output of each done node goes to its ``next`` agents (``route:
   fixed``) or to those its structured output names in its ``next`` field (``route:
   by_output``: a name or a list of names; one not among ``next`` fails the system).
   One target continues the sender's branch; several fork one branch each
   (``<branch>.<n>``, ``n`` the target's place in ``next``, ``parent_branch_id`` the
   sender's). Message ids are derived from the system run, the message the sender
   handled and the target, and stored insert-or-ignore: a pass that runs again after
   a crash stores nothing twice.
3. **Joins.** A message to a node with ``join: all`` or ``first`` is an *arrival* and is
   not delivered on its own. ``all`` runs the node once, when an arrival came from
   every input, or when nothing still running could bring another (a ``by_output``
   route skipped it): a ``join`` message then carries the gathered outputs,
   ``{"inputs": [{"from": AGENT, "branch_id": ..., "output": ...}, ...]}`` (JSON text
   as the node run's input, sorted by agent and branch), and continues the branch
   the arrivals forked from. ``first`` runs it once with the earliest arrival (by the
   time its sender finished); later ones are recorded (``done`` with a ``dropped``
   error) and dropped. ``any`` (like a node with one input) runs once per arrival.
4. **Delivery.** Each pending message becomes a node run: a child run keyed by the
   message id (so a message delivered twice never runs its agent twice), with the
   branch fields set, and the message is marked ``delivered`` (:func:`~corral.runtime.system_messages.deliver`). On a
   bus that delivers agent messages across workers (NATS) the message is published to
   its agent's inbox and a worker's inbox consumer (:mod:`corral.runtime.inbox`) calls
   :func:`~corral.runtime.system_messages.deliver`; the pass waits for that up to :data:`DELIVERY_GRACE_SECONDS` and
   delivers whatever is still pending itself (a lost publish, a consumer gone). In one
   process (the in-process bus) the coordinator delivers directly. A message the
   consumer dead-lettered fails the system run, naming it.
5. **Limits** (``spec.limits``): a message past ``max_hops`` from the input, more than
   ``max_messages`` messages, the run older than ``timeout_seconds`` or its node runs'
   cost past ``max_cost_usd`` end it ``failed`` with ``budget_exceeded`` naming the limit.
   The run's ``deadline_at`` (its start plus ``timeout_seconds``) is saved with each
   pass: a run parked past it (a node that hangs) is queued by any worker's upkeep
   (``Store.queue_overdue_runs``), and that pass fails it and cancels its node runs.
6. **Park or finish.** While node runs are unfinished the run parks in
   ``waiting_children`` (no worker held); the store queues it again as soon as one of
   them ends (``statements.requeue_parent``), so each branch moves on as its node ends.
   With nothing left in flight the run succeeds with the output of ``spec.output``'s
   node (its last, in a cycle).

The events (``message.send``, ``message.deliver``, ``child.start``, ``child.finish``,
``branch.join``, ``run.finish``) are written after the store changes they report;
each pass writes those its journal is missing, so a crash between a change and its
event loses nothing and repeats nothing. The spec the run follows is the one its
``run.start`` recorded: changing the AgentSystem changes later runs only. A node
run's spend is counted in the system run's when its message is taken (``child.finish``
carries it): the run's ``usage``, ``cost_usd`` and ``steps`` are running totals.
"""

from __future__ import annotations

import contextlib
import math
import reprlib
from collections.abc import Iterator, Sequence
from typing import Any

from corral.bus.base import Bus
from corral.core.agent_messages import AgentMessage, MessageState
from corral.core.clock import SYSTEM_CLOCK, Clock, move_on_after
from corral.core.errors import (
    BudgetExceededError,
    ConflictError,
    CorralError,
    NotFoundError,
    UserError,
)
from corral.core.events import (
    BranchJoinData,
    ChildFinishData,
    ChildStartData,
    ErrorData,
    Event,
    MessageDeliverData,
    MessageSendData,
    RunFinishData,
    RunStartData,
)
from corral.core.messages import dump
from corral.core.runs import RunRecord, RunState
from corral.engine.loop import RunResult
from corral.resources.systems import AgentSystemSpec
from corral.runtime.journal import FencedSink
from corral.runtime.system_messages import KIND, deliver, message_id
from corral.runtime.system_pass import Position, SystemEventData, SystemPass, event_key
from corral.store.base import Store

#: how long a message published on a bus that delivers messages may stay pending before
#: the coordinator delivers it itself (the publish, or its consumer, was lost)
DELIVERY_GRACE_SECONDS = 5.0
#: how often the coordinator looks whether the bus's consumers delivered its messages:
#: first after BUS_DELIVERY_FIRST_POLL_SECONDS (a consumer on an idle worker delivers in a
#: few milliseconds), then at twice the interval each time, up to BUS_DELIVERY_POLL_SECONDS
BUS_DELIVERY_FIRST_POLL_SECONDS = 0.002
BUS_DELIVERY_POLL_SECONDS = 0.05
#: the branch of the system's input
ROOT_BRANCH = "1"
#: the longest branch id (the store's column): each fork adds ``.<n>``
MAX_BRANCH_CHARS = 255


def _stopped_by_system_cost(error: dict[str, object]) -> bool:
    """Whether a node run's error says the cap the system gave it stopped it (no run passes
    its cap, so the system's spend alone never does)."""
    return (
        error.get("code") == "budget_exceeded"
        and error.get("limit") == "max_cost_usd"
        and error.get("inherited") is True
    )


class SystemFailed(CorralError):
    """A system run cannot go on (a failed node, a bad route, a missing output)."""

    code = "system_failed"


class SystemCoordinator:
    """Executes system runs for a :class:`~corral.runtime.executor.RunExecutor`."""

    def __init__(self, store: Store, bus: Bus | None, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.bus = bus
        self.clock = clock

    async def journal(self, record: RunRecord) -> list[Event]:
        """The part of the claimed system run's journal a pass needs: its first event
        (``run.start``, with the spec) and its last, when the run's position is fresh
        (:mod:`corral.runtime.system_pass`); otherwise all of it (none under its first
        claim)."""
        if record.fencing_token <= 1:
            return []
        position = Position.of(record)
        if position is None:
            return await self.store.list_events(record.id)
        head = await self.store.list_events(record.id, limit=1)
        after = max(position.seq - 1, head[-1].seq if head else 0)
        return head + await self.store.list_events(record.id, after_seq=after)

    async def run(self, record: RunRecord, sink: FencedSink, events: list[Event]) -> RunResult:
        """One pass over the claimed system run ``record`` (``events``: what
        :meth:`journal` read): the result to save (parked in ``waiting_children``,
        succeeded or failed), with the run's position for the next pass."""
        spec = await self._spec(record, sink, events)
        if isinstance(spec, RunResult):
            return spec
        # saved with the pass: parked past it, a worker's upkeep queues the run (a node
        # that hangs brings no node's end to wake it) and this check fails it
        record.deadline_at = (record.started_at or record.created_at) + spec.limits.timeout_seconds
        # what deliver() caps the node runs with, less what the others hold
        record.max_cost_usd = spec.limits.max_cost_usd
        position = Position.of(record)
        if position is None:
            state = await SystemPass.rebuilt(self.store, record, spec, events)
        else:
            state = await SystemPass.fresh(self.store, record, spec, position)
        result = await self._pass(state, sink)
        record.position = state.position(sink.last_seq).dump()
        return result

    async def _pass(self, state: SystemPass, sink: FencedSink) -> RunResult:
        record = state.record
        try:
            return await self._advance(state, sink)
        except (SystemFailed, BudgetExceededError) as exc:
            if await self._cancel_requested(record):
                # A cancel came during the pass (before the lease keeper saw it), and the
                # store refused the node runs it would have started (the deliveries in
                # flight were dead-lettered): the run ends as a cancel ends it, and its
                # save cascades to the node runs.
                record.cancel_requested = True
                await sink.emit(RunFinishData(state=RunState.CANCELLED.value))
                return self._result(state, RunState.CANCELLED)
            return await self._fail(state, sink, exc.to_dict())

    # ----------------------------------------------------------------- the spec

    async def _spec(
        self, record: RunRecord, sink: FencedSink, events: list[Event]
    ) -> AgentSystemSpec | RunResult:
        """The spec the run follows: recorded in its ``run.start`` (written at the first
        claim, from the stored AgentSystem)."""
        if events:
            start = events[0].data
            recorded = start.system_spec if isinstance(start, RunStartData) else None
            return AgentSystemSpec.model_validate(recorded)
        assert record.system is not None
        stored = await self.store.get_resource(record.namespace, KIND, record.system)
        await sink.emit(
            RunStartData(
                agent=record.agent,
                input=record.input,
                system=record.system,
                system_spec=(
                    stored.resource.spec.model_dump(mode="json") if stored is not None else None
                ),
            )
        )
        if stored is None or not isinstance(stored.resource.spec, AgentSystemSpec):
            error = {
                "code": NotFoundError.code,
                "message": f"AgentSystem {record.system!r} not found in namespace "
                f"{record.namespace!r}",
            }
            await sink.emit(ErrorData.of(error))
            await sink.emit(RunFinishData(state=RunState.FAILED.value))
            return RunResult(state=RunState.FAILED, error=error)
        return stored.resource.spec

    # ----------------------------------------------------------------- one pass

    async def _advance(self, state: SystemPass, sink: FencedSink) -> RunResult:
        record, spec = state.record, state.spec
        if not state.total:
            entry = AgentMessage(
                id=message_id(record.id, "input", spec.entry),
                namespace=record.namespace,
                system_run_id=record.id,
                from_agent=None,
                to_agent=spec.entry,
                branch_id=ROOT_BRANCH,
                parent_branch_id=None,
                type="input",
                payload=record.input,
                idempotency_key=message_id(record.id, "input", spec.entry),
                created_at=record.created_at,
            )
            await self._send(state, sink, [entry])
        await self._journal_sent(state, sink)
        dead = [m for m in state.ordered() if m.state is MessageState.DEAD_LETTER]
        if dead:
            raise SystemFailed(_undeliverable(dead[0]))
        self._check_time(state)
        await self._take_finished(state, sink)
        self._check_cost(state)
        for message in state.ordered():
            child = state.child_of(message)
            if message.state is MessageState.DONE and child is not None:
                await self._send(state, sink, self._route(state, message, child))
        await self._join(state, sink)
        await self._deliver_pending(state, sink)
        if _children_running(state):
            return self._result(state, RunState.WAITING_CHILDREN)
        return await self._finish(state, sink)

    async def _journal_sent(self, state: SystemPass, sink: FencedSink) -> None:
        """``message.send`` for every stored message the journal does not have yet (a pass
        that stored it and stopped before its events were written)."""
        for message in state.ordered():
            if ("message.send", message.id) not in state.journaled:
                await self._event(state, sink, _sent(message))

    def _check_time(self, state: SystemPass) -> None:
        limits, record = state.spec.limits, state.record
        if record.deadline_at is not None and self.clock.now() >= record.deadline_at:
            raise BudgetExceededError(
                "timeout_seconds",
                f"system run {record.id} ran past its limit of {limits.timeout_seconds:g} s "
                "(limits.timeout_seconds)",
            )

    def _check_cost(self, state: SystemPass) -> None:
        """The node runs taken so far against ``max_cost_usd``."""
        limits, record = state.spec.limits, state.record
        if limits.max_cost_usd is not None:
            spent = state.cost_usd
            if spent > limits.max_cost_usd:
                raise BudgetExceededError(
                    "max_cost_usd",
                    f"system run {record.id} spent ${spent:.6f}, past its limit of "
                    f"${limits.max_cost_usd:g} (limits.max_cost_usd)",
                )

    async def _take_finished(self, state: SystemPass, sink: FencedSink) -> None:
        """Mark the messages whose node runs finished ``done`` or ``failed`` (in the order
        the node runs finished), with their ``child.finish`` events; a failed one fails
        the system."""
        delivered = [
            (child, message)
            for message in state.messages.values()
            if (child := state.child_of(message)) is not None and child.state.finished
        ]
        delivered.sort(key=lambda pair: (pair[0].finished_at or 0.0, pair[0].id))
        failed: tuple[AgentMessage, RunRecord] | None = None
        for child, message in delivered:
            if ("child.finish", child.id) not in state.journaled:
                await self._event(
                    state,
                    sink,
                    ChildFinishData(
                        run_id=child.id,
                        agent=child.agent,
                        state=child.state.value,
                        usage=dump(child.usage),
                        cost_usd=child.cost_usd,
                        message_id=message.id,
                        branch_id=message.branch_id,
                    ),
                )
            succeeded = child.state is RunState.SUCCEEDED
            if message.state is MessageState.DELIVERED:
                marked = await self.store.mark_agent_message(
                    message.id,
                    MessageState.DONE if succeeded else MessageState.FAILED,
                    error=None if succeeded else _child_error(child),
                    now=child.finished_at,
                )
                if marked is not None:
                    state.messages[message.id] = marked
                    state.charge(child)
            if not succeeded and failed is None:
                failed = (message, child)
        if failed is not None:
            self._check_cost(state)
            message, child = failed
            cause = child.error or {}
            if _stopped_by_system_cost(cause):  # the system's budget ran out
                raise BudgetExceededError(
                    "max_cost_usd",
                    f"system run {state.record.id}: agent {child.agent!r} was stopped at what "
                    f"was left of the system's limit of ${state.spec.limits.max_cost_usd:g} "
                    f"(limits.max_cost_usd): {cause.get('message', '')}",
                )
            raise SystemFailed(
                f"agent {child.agent!r} (branch {message.branch_id}) ended "
                f"{child.state.value}: {cause.get('message', cause.get('code', 'no error'))}"
            )

    # ----------------------------------------------------------------- routing

    def _route(
        self, state: SystemPass, message: AgentMessage, child: RunRecord
    ) -> list[AgentMessage]:
        """The messages the output of ``child`` (the node run of ``message``) sends on."""
        node = state.spec.node(message.to_agent)
        targets = list(node.next)
        if node.route == "by_output":
            targets = _chosen(message.to_agent, node.next, child.output)
        fork = len(targets) > 1
        sent: list[AgentMessage] = []
        for target in targets:
            if fork:
                branch = f"{message.branch_id}.{node.next.index(target) + 1}"
                parent_branch: str | None = message.branch_id
                if len(branch) > MAX_BRANCH_CHARS:  # (a fork on a cycle: the column's size)
                    raise SystemFailed(
                        f"agent {message.to_agent!r} forked a branch id of {len(branch)} "
                        f"characters, past {MAX_BRANCH_CHARS}: a fork on a cycle went round "
                        "too often (lower limits.max_hops)"
                    )
            else:
                branch, parent_branch = message.branch_id, message.parent_branch_id
            ident = message_id(state.record.id, message.id, target)
            sent.append(
                AgentMessage(
                    id=ident,
                    namespace=state.record.namespace,
                    system_run_id=state.record.id,
                    from_agent=message.to_agent,
                    to_agent=target,
                    branch_id=branch,
                    parent_branch_id=parent_branch,
                    type="output",
                    payload=child.output,
                    idempotency_key=ident,
                    hop=message.hop + 1,
                    # when its sender's output was stored: the same on every pass
                    created_at=child.finished_at or self.clock.now(),
                )
            )
        return sent

    async def _send(
        self, state: SystemPass, sink: FencedSink, messages: list[AgentMessage]
    ) -> None:
        """Store ``messages`` (those not stored yet), within the limits."""
        new = [m for m in messages if m.id not in state.messages]
        if not new:
            return
        limits = state.spec.limits
        for message in new:
            if limits.max_hops is not None and message.hop > limits.max_hops:
                raise BudgetExceededError(
                    "max_hops",
                    f"a message from {message.from_agent!r} to {message.to_agent!r} would be "
                    f"hop {message.hop}, past the system's limit of {limits.max_hops} "
                    "(limits.max_hops)",
                )
        if state.total + len(new) > limits.max_messages:
            raise BudgetExceededError(
                "max_messages",
                f"system run {state.record.id} would send more than its limit of "
                f"{limits.max_messages} messages (limits.max_messages)",
            )
        created = await self.store.add_agent_messages(new)
        for message, stored in zip(new, created, strict=True):
            if not stored:  # (a finished one this pass did not read: never sent twice)
                continue
            state.total += 1
            state.messages[message.id] = message
            await self._event(state, sink, _sent(message))

    # ----------------------------------------------------------------- joins

    async def _join(self, state: SystemPass, sink: FencedSink) -> None:
        """Run the join nodes whose inputs are in (see the module docstring)."""
        spec = state.spec
        joins = [name for name in spec.nodes() if spec.node(name).join in ("all", "first")]
        waiting: list[str] = []
        for name in joins:
            arrivals = _arrivals(state, name)
            if not arrivals:
                continue
            if await self._fired(state, name):
                await self._drop(state, sink, name, [a for a in arrivals if _unfinished(a)])
                continue
            if spec.node(name).join == "first":
                await self._fire(state, sink, name, arrivals[:1], arrivals[1:])
            elif {a.from_agent for a in arrivals} >= set(spec.inputs(name)):
                await self._fire(state, sink, name, arrivals, [])
            else:
                waiting.append(name)
        if waiting and not _in_flight(state):
            # Nothing running can bring another input: the joins that no other waiting
            # join leads to go ahead with what came (those downstream wait for them).
            downstream = {d for name in waiting for d in _descendants(spec, name)}
            for name in waiting:
                if name not in downstream:
                    await self._fire(state, sink, name, _arrivals(state, name), [])

    async def _fired(self, state: SystemPass, node: str) -> bool:
        """Whether the join of ``node`` ran (its message is stored: maybe finished, which a
        pass that read only the live messages looks up)."""
        ident = message_id(state.record.id, "join", node)
        if ident in state.messages or state.complete:
            return ident in state.messages
        return await self.store.get_agent_message(ident) is not None

    async def _fire(
        self,
        state: SystemPass,
        sink: FencedSink,
        node: str,
        taken: list[AgentMessage],
        dropped: list[AgentMessage],
    ) -> None:
        """Send ``node`` the join of ``taken`` (once), and drop ``dropped``."""
        record = state.record
        ident = message_id(record.id, "join", node)
        branch = _common_branch([m.branch_id for m in taken])
        inputs = sorted(taken, key=lambda m: (m.from_agent or "", m.branch_id))
        join = AgentMessage(
            id=ident,
            namespace=record.namespace,
            system_run_id=record.id,
            from_agent=None,
            to_agent=node,
            branch_id=branch,
            parent_branch_id=_parent_branch(branch),
            type="join",
            payload={
                "inputs": [
                    {"from": m.from_agent, "branch_id": m.branch_id, "output": m.payload}
                    for m in inputs
                ]
            },
            idempotency_key=ident,
            hop=max(m.hop for m in taken),
            created_at=self.clock.now(),
        )
        await self._send(state, sink, [join])
        if ("branch.join", ident) not in state.journaled:
            await self._event(
                state,
                sink,
                BranchJoinData(
                    agent=node,
                    join=state.spec.node(node).join,
                    message_id=ident,
                    branch_id=branch,
                    inputs=[m.id for m in inputs],
                    dropped=[m.id for m in dropped],
                ),
            )
        for message in taken:
            if _unfinished(message):
                await self._mark(state, message, MessageState.DONE, None)
        await self._drop(state, sink, node, [m for m in dropped if _unfinished(m)], quiet=True)

    async def _drop(
        self,
        state: SystemPass,
        sink: FencedSink,
        node: str,
        late: list[AgentMessage],
        *,
        quiet: bool = False,
    ) -> None:
        """Record arrivals at a join that already ran as dropped."""
        for message in late:
            error = {
                "code": "dropped",
                "message": f"the join of {node!r} had run when this input came",
            }
            await self._mark(state, message, MessageState.DONE, error)
            if not quiet and ("branch.join", message.id) not in state.journaled:
                await self._event(
                    state,
                    sink,
                    BranchJoinData(agent=node, message_id=message.id, dropped=[message.id]),
                )

    async def _mark(
        self,
        state: SystemPass,
        message: AgentMessage,
        to: MessageState,
        error: dict[str, Any] | None,
    ) -> None:
        marked = await self.store.mark_agent_message(message.id, to, error=error)
        if marked is not None:
            state.messages[message.id] = marked

    # ----------------------------------------------------------------- delivery

    async def _deliver_pending(self, state: SystemPass, sink: FencedSink) -> None:
        """Deliver the pending messages (see the module docstring): through the bus's
        inboxes when it delivers messages across workers, waiting up to the grace for
        their node runs to appear, then, for whatever is still pending, here."""
        pending = [
            m
            for m in state.ordered()
            if m.state is MessageState.PENDING and not _is_arrival(state.spec, m)
        ]
        if self._bus_delivers() and pending:
            assert self.bus is not None
            now = self.clock.now()
            due = min(_sent_at(m, now) for m in pending) + DELIVERY_GRACE_SECONDS
            # a consumer that delivers one announces it on the system run's events (see
            # corral.runtime.inbox): the look after a delivery comes then, not at the poll
            async with self.bus.watch_events(state.record.id) as delivered:
                for message in pending:
                    await self.bus.send_agent_message(
                        message.namespace, message.to_agent, message.id
                    )
                polls = delivery_polls()
                while pending and self.clock.now() < due:
                    with move_on_after(self.clock, next(polls)):
                        await delivered.wait(math.inf)
                    pending = await self._still_pending(state, pending)
        for message in pending:
            try:
                started, marked = await deliver(self.store, self.bus, message, parent=state.record)
            except (NotFoundError, ConflictError, UserError) as exc:
                raise SystemFailed(
                    f"the message to agent {message.to_agent!r} (branch "
                    f"{message.branch_id}) could not be delivered: {exc.message}"
                ) from None
            state.children[started.id] = started
            if marked is None:  # a consumer delivered it meanwhile: read it as stored
                marked = await self.store.get_agent_message(message.id)
            if marked is not None:
                state.messages[message.id] = marked
        await self._journal_delivered(state, sink)

    def _bus_delivers(self) -> bool:
        """Whether messages go through the bus's inboxes: a bus that delivers them to the
        inbox consumers of the workers (NATS). In one process (the in-process bus) the
        coordinator delivers them itself: the same :func:`deliver`, one hop less."""
        return self.bus is not None and self.bus.delivers_messages and self.bus.dispatches

    async def _still_pending(
        self, state: SystemPass, waiting: list[AgentMessage]
    ) -> list[AgentMessage]:
        """Read ``waiting`` again: those a consumer delivered meanwhile are taken in (their
        node runs too); a dead-lettered one fails the system."""
        left: list[AgentMessage] = []
        for message in waiting:
            stored = await self.store.get_agent_message(message.id)
            if stored is None:
                continue
            state.messages[message.id] = stored
            if stored.state is MessageState.PENDING:
                left.append(stored)
            elif stored.state is MessageState.DEAD_LETTER:
                raise SystemFailed(_undeliverable(stored))
            elif stored.child_run_id is not None:
                child = await self.store.get_run(stored.child_run_id)
                if child is not None:
                    state.children[child.id] = child
        return left

    async def _journal_delivered(self, state: SystemPass, sink: FencedSink) -> None:
        """``message.deliver`` and ``child.start`` for each delivered message (once)."""
        for message in state.ordered():
            child = state.child_of(message)
            if child is None:
                continue
            if ("message.deliver", message.id) not in state.journaled:
                await self._event(
                    state,
                    sink,
                    MessageDeliverData(
                        message_id=message.id,
                        to=message.to_agent,
                        run_id=child.id,
                        branch_id=message.branch_id,
                    ),
                )
            if ("child.start", child.id) not in state.journaled:
                await self._event(
                    state,
                    sink,
                    ChildStartData(
                        run_id=child.id,
                        agent=child.agent,
                        message_id=message.id,
                        branch_id=message.branch_id,
                        parent_branch_id=message.parent_branch_id,
                    ),
                )

    # ----------------------------------------------------------------- the end

    async def _finish(self, state: SystemPass, sink: FencedSink) -> RunResult:
        """Nothing is left in flight: the system's output is its output node's last."""
        await state.complete_from(self.store)
        node = state.spec.output_node()
        outputs = [
            (child.finished_at or 0.0, child.id, child.output)
            for message in state.messages.values()
            if message.to_agent == node
            and message.state is MessageState.DONE
            and (child := state.child_of(message)) is not None
        ]
        if not outputs:
            raise SystemFailed(
                f"the system ended without a run of its output agent {node!r} (spec.output): "
                "no route led there"
            )
        output = max(outputs)[2]
        await sink.emit(RunFinishData(state=RunState.SUCCEEDED.value, output=output))
        return self._result(state, RunState.SUCCEEDED, output=output)

    async def _fail(self, state: SystemPass, sink: FencedSink, error: dict[str, Any]) -> RunResult:
        """End the system run ``failed`` with ``error``; its unfinished node runs are
        cancelled (their spend so far is not counted: only finished ones report it)."""
        await state.complete_from(self.store)  # (a node run whose message is still pending)
        for child in list(state.unfinished_children()):
            with contextlib.suppress(NotFoundError):  # (deleted meanwhile)
                await self.store.request_cancel(child.id)
        await sink.emit(ErrorData.of(error))
        await sink.emit(RunFinishData(state=RunState.FAILED.value))
        return self._result(state, RunState.FAILED, error=error)

    async def _cancel_requested(self, record: RunRecord) -> bool:
        """Whether a cancel of the system run came during this pass."""
        stored = await self.store.get_run(record.id)
        return stored is not None and stored.cancel_requested

    def _result(
        self,
        state: SystemPass,
        to: RunState,
        *,
        output: Any = None,
        error: dict[str, Any] | None = None,
    ) -> RunResult:
        """The run's result: its spend is its taken node runs' (``steps``: how many)."""
        return RunResult(
            state=to,
            output=output,
            error=error,
            steps=state.taken,
            usage=state.usage,
            cost_usd=state.cost_usd,
        )

    async def _event(self, state: SystemPass, sink: FencedSink, data: SystemEventData) -> None:
        state.journaled.add((data.TYPE.value, event_key(data)))
        await sink.emit(data)


# --------------------------------------------------------------------------- helpers


def delivery_polls() -> Iterator[float]:
    """The waits between the coordinator's looks at the messages it published, in seconds."""
    wait = BUS_DELIVERY_FIRST_POLL_SECONDS
    while True:
        yield wait
        wait = min(2 * wait, BUS_DELIVERY_POLL_SECONDS)


def _sent(message: AgentMessage) -> MessageSendData:
    return MessageSendData(
        message_id=message.id,
        from_agent=message.from_agent,
        to=message.to_agent,
        kind=message.type,
        branch_id=message.branch_id,
        parent_branch_id=message.parent_branch_id,
        hop=message.hop,
    )


def _sent_at(message: AgentMessage, now: float) -> float:
    # a message's created_at is when its sender finished: never later than now
    return min(message.created_at, now)


def _unfinished(message: AgentMessage) -> bool:
    return not message.state.finished


def _is_arrival(spec: AgentSystemSpec, message: AgentMessage) -> bool:
    """Whether ``message`` waits at a join (``all``/``first``) rather than being delivered."""
    return message.type == "output" and spec.node(message.to_agent).join in ("all", "first")


def _arrivals(state: SystemPass, node: str) -> list[AgentMessage]:
    """The arrivals at join ``node``, earliest first."""
    return [m for m in state.ordered() if m.to_agent == node and _is_arrival(state.spec, m)]


def _children_running(state: SystemPass) -> bool:
    """Whether a delivered message awaits its node run's end. One that ended during this
    pass (after the pass took the finished ones) counts too: the run parks, and the
    store queues it again at once (its children all finished), for the next pass."""
    return any(m.state is MessageState.DELIVERED for m in state.messages.values())


def _in_flight(state: SystemPass) -> bool:
    """Whether a message is still on its way to a node run or a node run is unfinished."""
    return _children_running(state) or any(
        m.state is MessageState.PENDING and not _is_arrival(state.spec, m)
        for m in state.messages.values()
    )


def _descendants(spec: AgentSystemSpec, node: str) -> set[str]:
    seen: set[str] = set()
    todo = list(spec.node(node).next)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(spec.node(name).next)
    return seen


def _chosen(node: str, allowed: Sequence[str], output: Any) -> list[str]:
    """The next agents a ``by_output`` node's output names (its ``next`` field)."""
    named = output.get("next") if isinstance(output, dict) else None
    if isinstance(named, str):
        named = [named]
    if not isinstance(named, list) or not all(isinstance(n, str) for n in named):
        raise SystemFailed(
            f"agent {node!r} routes by its output, whose 'next' field must name one of "
            f"{list(allowed)} (or list several); it gave {_short(named)}"
        )
    unknown = [n for n in named if n not in allowed]
    if unknown:
        raise SystemFailed(
            f"agent {node!r} routed its output to {_short(unknown[0])}, which is not among its "
            f"next agents {list(allowed)}"
        )
    return [n for n in allowed if n in named]


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80


def _short(value: Any) -> str:
    """``value`` for an error message, bounded: an output may be as big as a model makes it."""
    return _SHORT.repr(value)


def _common_branch(branches: Sequence[str]) -> str:
    """The branch ``branches`` forked from (their longest common prefix of parts)."""
    parts = [b.split(".") for b in branches]
    common: list[str] = []
    for column in zip(*parts, strict=False):
        if len(set(column)) != 1:
            break
        common.append(column[0])
    if len(branches) == 1:
        return branches[0]
    return ".".join(common) or ROOT_BRANCH


def _parent_branch(branch: str) -> str | None:
    head, dot, _ = branch.rpartition(".")
    return head if dot else None


def _undeliverable(message: AgentMessage) -> str:
    cause = (message.error or {}).get("message", "no delivery worked")
    return (
        f"the message to agent {message.to_agent!r} (branch {message.branch_id}) could not be "
        f"delivered after {message.attempt} attempt(s): {cause}"
    )


def _child_error(child: RunRecord) -> dict[str, Any]:
    return {
        "code": "child_failed",
        "message": f"the run {child.id} of agent {child.agent!r} ended {child.state.value}",
        "details": {"run_id": child.id, "state": child.state.value, "error": child.error},
    }


__all__ = ["DELIVERY_GRACE_SECONDS", "SystemCoordinator", "SystemFailed", "delivery_polls"]
