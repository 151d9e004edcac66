"""The journal of a run: its events, written under its lease in as few commits as is safe.

:class:`FencedSink` receives every event the engine emits for one run and
decides, event by event, when it must be on disk:

- **now** - written (with everything waiting before it) before the engine goes
  on: a ``tool.call`` of a tool that is *not* idempotent (on disk before its side
  effect starts, so a crash can never lead to a silent second call), the
  ``tool.result`` of such a call (on disk before the next model call, so a crash
  never runs a finished tool again nor changes what the model is asked),
  approvals, errors, a user's ``message.create``.
- **later** - rides with the next write: ``run.start``, ``step.start``,
  ``text.delta``, ``step.finish`` and the model's message (``message.create``
  from the assistant). The engine never acts on the outside between a model's
  message and the next *now* or *behind* write, and each of those carries the
  message with it. ``run.finish`` waits for the executor, which stores it
  together with the run's final state in one commit (:meth:`FencedSink.take`).
- **behind** - the ``tool.call`` of a tool declared idempotent: the tool runs
  at once, and the call (with the model's message) is written when the tool's
  ``tool.result`` is (one commit for both), or :data:`BEHIND_AFTER_SECONDS`
  after the call if the tool is still running then - the write starts, and the
  tool goes on while it is in flight. And a ``child.start``: the child run is
  committed before it and a replay of the call finds that child by its
  idempotency key, so it rides with the run's park in ``waiting_children`` (one
  commit) when the run parks at once, and is written a moment later when the
  run goes on (other calls of the step), so followers still see the child start.
  The ``tool.result`` of a call whose child run finished (after its
  ``child.finish``) as well: the child's record keeps the outcome, so a replay
  records the same result again; the results of all the children a resumed run
  finds finished ride in one write (with the run's outcome, when it ends at once).
- **ahead** - the ``tool.result`` of an idempotent tool's call: its write starts
  at once (with the call, when that is still waiting) and the engine goes on
  without waiting for it: the next model call is on the wire while it commits.

Why *behind* is as safe as *now*: writes are committed strictly in order (each
waits for the one before it), so the journal on disk is always a prefix of the
events, and what runs before the call is on disk is only a tool that may run
again after a crash anyway (it is idempotent, and its result is not recorded
yet). The price is a longer window in which a crash loses the model's answer
(it is asked again on resume): from its arrival until its commit, which starts
at most :data:`BEHIND_AFTER_SECONDS` later than it would for a call written
*now*. In return a quick tool's call and result share one commit, where the
engine would otherwise wait for two in a row.

Why *ahead* is safe too: a crash before that commit loses the result of a call
that may run again (the same argument), and the model call in flight then, whose
answer is lost in any case (an answer rides with a later write). The journal stays a
prefix: every write waits for the one before it, so the model's next answer is
never on disk without the results it was given. A *now* write waits for every
write before it (a side effect never starts before the results it follows are
durable), the run's outcome waits for all of them (:meth:`FencedSink.settle`),
and a refused write (a lost lease) surfaces at the next write or at settle.

A refused *ahead* write surfaces late, though: the next model call may be on the
wire by then. So the sink also checks the lease before each event: past its
deadline (:attr:`FencedSink.held`: a worker stalled or unable to renew for a
lease's length) it has the store renew the lease first, and raises
``LeaseLostError`` unless that works. Every model call follows a ``step.start``
and every tool call a ``tool.call``, so a worker whose lease ran out starts
neither, nor any write, before it knows the lease is still its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Literal, Self, cast

import anyio
import anyio.abc

from corral.bus.base import Bus
from corral.core.clock import SYSTEM_CLOCK, Clock, Timer
from corral.core.errors import LeaseLostError
from corral.core.events import (
    AnyEventData,
    ChildFinishData,
    Event,
    EventType,
    MessageCreateData,
    ToolCallData,
    ToolResultData,
)
from corral.core.redaction import Redactor
from corral.core.runs import Lease
from corral.runtime.leases import HeldLease
from corral.store.base import Store

Observer = Callable[[Event], Awaitable[None]]

#: How long an idempotent tool's ``tool.call`` may wait to share its result's commit
#: (see above): most Python and MCP tools answer well within it.
BEHIND_AFTER_SECONDS = 0.01
When = Literal["now", "later", "behind", "ahead"]

#: Events that ride along with the next write.
LATER = frozenset(
    {
        EventType.RUN_START,
        EventType.TEXT_DELTA,
        EventType.STEP_START,
        EventType.STEP_FINISH,
        EventType.RUN_FINISH,
        # with the call's tool.result, in one commit: a child's spend is counted once
        EventType.CHILD_FINISH,
        # a system run's coordinator: what it records is in the store already, and on a
        # replay it writes whatever of it the journal is missing (runtime/systems.py)
        EventType.MESSAGE_SEND,
        EventType.MESSAGE_DELIVER,
        EventType.BRANCH_JOIN,
        # emitted just before the call's tool.result, and written with it
        EventType.MEMORY_WRITE,
        EventType.MEMORY_SEARCH,
    }
)
# The members _timing compares with, as plain names: reading an attribute of an enum class
# costs ten times a global's, and every event of every run goes through _timing.
_APPROVALS = (EventType.APPROVAL_REQUESTED, EventType.APPROVAL_RESOLVED)
_STEP_START = EventType.STEP_START
_STEP_FINISH = EventType.STEP_FINISH
_TOOL_CALL = EventType.TOOL_CALL
_TOOL_RESULT = EventType.TOOL_RESULT
_MESSAGE_CREATE = EventType.MESSAGE_CREATE
_CHILD_FINISH = EventType.CHILD_FINISH
_CHILD_START = EventType.CHILD_START


class FencedSink:
    """Stores one run's events under its lease; use it as an async context.

    Leaving the context waits for writes still in flight (they are shielded from
    cancellation: a half-cancelled write would leave a gap in the journal).

    A write in flight is a task: in ``writes``, a task group the caller keeps for
    all its runs (the executor's), or else in a task group of the sink's own. A
    shared group spares each run a task group of its own, which a run that never
    writes before its final save (no tool calls) would open for nothing. A behind
    call's timed write, started by a timer of ``clock``, is a task of its own.
    """

    def __init__(
        self,
        store: Store,
        lease: Lease,
        observer: Observer | None,
        bus: Bus | None = None,
        *,
        writes: anyio.abc.TaskGroup | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.clock = clock
        self.lease = lease
        self.observer = observer
        self.bus = bus
        self.buffer: list[Event] = []
        self.last_seq = 0
        #: the lease as its keeper holds it, while it does (see the module docstring)
        self.held: HeldLease | None = None
        #: the run's redactor, for the events of :meth:`emit` (the engine redacts its own)
        self.redactor = Redactor()
        self._approvals_in_step = False
        self._shared = writes
        self._own: anyio.abc.TaskGroup | None = None
        self._group: anyio.abc.TaskGroup | None = None
        self._last_write: anyio.Event | None = None
        self._error: BaseException | None = None
        # the timer of a behind call's deferred write (a timer, not a sleeping task: every
        # idempotent tool call arms one, and most are cancelled by the call's result)
        self._behind_timer: Timer | None = None
        self._behind_write: asyncio.Task[None] | None = None  # (a reference keeps it alive)
        self._idempotent_calls: set[str] = set()  # ids of calls whose result is written ahead
        self._finished_children: set[str] = set()  # ids of calls whose child.finish came

    async def __aenter__(self) -> Self:
        if self._shared is not None:
            self._group = self._shared
        else:
            self._group = self._own = anyio.create_task_group()
            await self._own.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._group = None
        self._disarm_behind()
        own, self._own = self._own, None
        if own is not None:
            await own.__aexit__(exc_type, exc, tb)
        if self._last_write is not None:  # a write outside our group (shared, or behind)
            with anyio.CancelScope(shield=True):
                await self._last_write.wait()
        self._behind_write = None

    async def __call__(self, event: Event) -> None:
        held = self.held
        if held is not None and self.clock.monotonic() > held.deadline:
            await self._confirm(held)
        self.buffer.append(event)
        self.last_seq = event.seq
        when = self._timing(event)
        if when == "now":
            await self.flush()
        elif when == "ahead":
            self._start_write()
        elif when == "behind" and self._behind_timer is None:
            self._group_or_fail()  # (outside its block, a timer would fire for nothing)
            self._behind_timer = self.clock.call_later(BEHIND_AFTER_SECONDS, self._behind_due)
        if self.observer is not None:
            await self.observer(event)

    async def _confirm(self, held: HeldLease) -> None:
        """The lease went a lease's length unrenewed: go on only if the store renews it now.
        Otherwise ``LeaseLostError``, and every write after this fails the same way."""
        try:
            await held.keeper.confirm(held)
        except LeaseLostError as exc:
            if self._error is None:
                self._error = exc
            raise

    def _timing(self, event: Event) -> When:
        kind = event.type
        if kind in _APPROVALS:
            self._approvals_in_step = True
        elif kind is _STEP_START:
            self._approvals_in_step = False
        elif kind is _STEP_FINISH and self._approvals_in_step:
            # The run may end waiting for a human, with no event after this one.
            self._approvals_in_step = False
            return "now"
        elif kind is _TOOL_CALL:
            call = cast(ToolCallData, event.data)
            if call.idempotent:
                self._idempotent_calls.add(call.call_id)
                return "behind"
        elif kind is _TOOL_RESULT:
            call_id = cast(ToolResultData, event.data).call_id
            if call_id in self._finished_children:
                self._finished_children.discard(call_id)
                return "behind"
            if call_id in self._idempotent_calls:
                self._idempotent_calls.discard(call_id)
                return "ahead"
        elif kind is _CHILD_START:
            return "behind"
        elif kind is _CHILD_FINISH:
            # the child's record keeps its outcome: the call's result is written behind
            # (a system run's node runs answer no call: its coordinator has no call_id)
            finished = cast(ChildFinishData, event.data).call_id
            if finished is not None:
                self._finished_children.add(finished)
            return "later"
        if kind in LATER:
            return "later"
        if (
            kind is _MESSAGE_CREATE
            and cast(MessageCreateData, event.data).message.get("role") == "assistant"
        ):
            return "later"
        return "now"

    async def flush(self) -> None:
        """Write what waits; returns once it and every write before it are durable."""
        if not self.buffer:
            await self.settle()
        elif self._last_write is None or self._last_write.is_set():
            # Nothing in flight: write here, sparing a task and the wake-ups of waiting for it.
            done = self._next_write()
            await self._write(self._take_buffer(), None, done)
            if self._error is not None:
                raise self._error
        else:
            self._start_write()
            await self.settle()

    async def settle(self) -> None:
        """Wait for the writes in flight; ``LeaseLostError`` (or another error) if one failed."""
        if self._last_write is not None:
            await self._last_write.wait()
        if self._error is not None:
            raise self._error

    def _group_or_fail(self) -> anyio.abc.TaskGroup:
        if self._group is None:
            raise RuntimeError("FencedSink used outside its `async with` block")
        return self._group

    def _start_write(self) -> None:
        group = self._group_or_fail()
        before = self._last_write
        done = self._next_write()
        group.start_soon(self._write, self._take_buffer(), before, done)

    def _next_write(self) -> anyio.Event:
        """Start a write: the event it sets when done, which the next write waits for."""
        if self._error is not None:
            raise self._error
        done = self._last_write = anyio.Event()
        self._disarm_behind()  # this write takes a behind call with it
        return done

    def _disarm_behind(self) -> None:
        if self._behind_timer is not None:
            self._behind_timer.cancel()
            self._behind_timer = None

    def _take_buffer(self) -> list[Event]:
        batch, self.buffer = self.buffer, []
        return batch

    def _behind_due(self) -> None:
        """The behind ``tool.call`` waited long enough for its result: write it now.

        A loop callback cannot start a task in an anyio task group, so this write is
        an asyncio task of its own: it never raises (``_write`` keeps any error for the
        engine) and the sink's exit waits for it like any write.
        """
        self._behind_timer = None
        held = self.held
        if held is not None and self.clock.monotonic() > held.deadline:
            return  # (left to the next write, after the next event confirmed the lease)
        if self._group is not None and self.buffer and self._error is None:
            before = self._last_write
            done = self._next_write()
            write = self._write(self._take_buffer(), before, done)
            self._behind_write = asyncio.get_running_loop().create_task(write)

    async def _write(
        self, batch: list[Event], before: anyio.Event | None, done: anyio.Event
    ) -> None:
        with anyio.CancelScope(shield=True):
            try:
                if before is not None:
                    await before.wait()
                if self._error is None:  # nothing after a refused write: the journal stays a prefix
                    await self.store.append_events(batch, lease=self.lease)
                    if self.bus is not None:
                        await self.bus.announce_events(self.lease.run_id, batch[-1].seq)
            except Exception as exc:  # noqa: BLE001 - raised to the engine by the next write or settle
                self._error = exc
            finally:
                done.set()

    def take(self) -> list[Event]:
        """What waits, for a caller that writes it in a transaction of its own (after settle)."""
        return self._take_buffer()

    async def announce(self) -> None:
        """Tell the bus about events the caller wrote (see :meth:`take`)."""
        if self.bus is not None:
            await self.bus.announce_events(self.lease.run_id, self.last_seq)

    async def emit(self, data: AnyEventData) -> None:
        """An event from outside the loop, numbered after the last one, redacted."""
        if self.redactor:
            plain = data.to_dict()
            redacted = self.redactor.data(plain)
            if redacted is not plain:  # (the redactor hands back what holds no secret)
                data = data.from_dict(redacted)
        await self(Event(self.lease.run_id, self.last_seq + 1, data, self.clock.now()))
