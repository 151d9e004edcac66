"""Follow a run from the outside: its events as they are committed, and its state.

The store is the source of truth; the bus only wakes the follower early. A
follower registers its watch *before* its first read, reads the store, and
waits for the next announcement or ``poll_seconds``, whichever comes first - so
it also follows a run that a process the bus cannot reach executes (a
``corral worker`` on the same SQLite file), one poll interval later.

Used by the HTTP server's SSE streams and by the prompt endpoints, which wait
for a run to settle, by ``corral logs -f`` (``operations.follow_run``), and by a
``LocalRunner`` following a run that another worker holds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from enum import StrEnum

import anyio

from corral.bus.base import Bus, EventWatch
from corral.core.events import Event, EventType
from corral.core.runs import RunRecord, RunState
from corral.runtime.fanout import FanOut
from corral.store.base import Store

#: how soon a follower looks again after an event its run's state change follows
SOON_SECONDS = 0.02
_STATE_FOLLOWS = frozenset(
    {EventType.RUN_FINISH, EventType.APPROVAL_REQUESTED, EventType.STEP_FINISH}
)


class Until(StrEnum):
    """When following ends."""

    #: the run reached a final state (a run waiting for approval is followed on)
    FINISHED = "finished"
    #: the run finished or waits for a human: nothing more happens without one
    SETTLED = "settled"

    def reached(self, state: RunState) -> bool:
        if self is Until.SETTLED and state is RunState.WAITING_APPROVAL:
            return True
        return state.finished


class RunFollower:
    """Reads one run's events in order, from ``after``, until the run ends (or ``stop``).

    Iterate :meth:`batches`: each round yields the events committed since the
    previous one - an empty list when a wait passed without news, so a caller
    can send keep-alives. ``last_seq`` is the last event handed out; ``record``
    the run as last read (``None`` until a round read it, and when the run was
    deleted); ``ended`` whether the run reached ``until``. With ``fan_out`` the
    reads are shared with the other followers of the run in this process.
    """

    def __init__(
        self,
        store: Store,
        bus: Bus,
        run_id: str,
        *,
        after: int = 0,
        until: Until = Until.FINISHED,
        poll_seconds: float = 1.0,
        stop: Stop | None = None,
        fan_out: FanOut | None = None,
    ) -> None:
        self.store = store
        self.fan_out = fan_out
        self.bus = bus
        self.run_id = run_id
        self.last_seq = after
        self.until = until
        self.poll_seconds = poll_seconds
        self.stop = stop
        self.record: RunRecord | None = None
        self.ended = False

    async def batches(self) -> AsyncIterator[list[Event]]:
        """The run's new events, round by round, until it ends or ``stop`` is set."""
        async with self.bus.watch_events(self.run_id) as watch:
            while True:
                events, done = await self._round()
                yield events
                if done:
                    self.ended = True
                    return
                if self.stop is not None and self.stop.is_set():
                    return
                # The state is saved just after the events that end a run or pause it,
                # and no announcement follows that save: look again soon.
                soon = self.until is Until.SETTLED and any(e.type in _STATE_FOLLOWS for e in events)
                await _wait(watch, self.stop, SOON_SECONDS if soon else self.poll_seconds)

    async def _events(self, after: int) -> list[Event]:
        if self.fan_out is not None:
            return await self.fan_out.list_events(self.run_id, after)
        return await self.store.list_events(self.run_id, after)

    async def _round(self) -> tuple[list[Event], bool]:
        events = await self._events(self.last_seq)
        if events:
            self.last_seq = events[-1].seq
        if self.until is Until.FINISHED and any(e.type is EventType.RUN_FINISH for e in events):
            return events, True
        # The state is read when it decides (a prompt waits for ``waiting_approval`` too,
        # which no event marks as final) or when nothing came: a cancelled queued run
        # writes no event, and a deleted run is gone.
        if self.until is Until.SETTLED or not events:
            self.record = await self.store.get_run(self.run_id)
            if self.record is None:
                return events, True
            if self.until.reached(self.record.state):
                # The state is saved after the run's last events: hand those out too.
                tail = await self._events(self.last_seq)
                if tail:
                    self.last_seq = tail[-1].seq
                return events + tail, True
        return events, False

    async def settle(self) -> RunRecord | None:
        """Follow until the run reaches ``until`` (or ``stop``); returns it as last read."""
        async for _ in self.batches():
            continue  # only the end matters here: batches() keeps self.record current
        if self.record is None or not self.until.reached(self.record.state):
            self.record = await self.store.get_run(self.run_id)
        return self.record


async def _wait(watch: EventWatch, stop: Stop | None, seconds: float) -> None:
    """Until events are announced, ``stop`` is set, or ``seconds`` pass."""
    if stop is None:
        await watch.wait(seconds)
        return
    with stop.interrupts():
        await watch.wait(seconds)


class Stop:
    """A stop signal for many followers: setting it cancels their waits at once.

    Each wait runs in a cancel scope that :meth:`set` cancels, which costs far less
    than a task per wait watching an event (a hundred SSE streams wait many times a
    second).
    """

    def __init__(self) -> None:
        self._set = False
        self._scopes: set[anyio.CancelScope] = set()

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        for scope in list(self._scopes):
            scope.cancel()

    @contextmanager
    def interrupts(self) -> Iterator[None]:
        """A scope for one wait, cancelled when the stop is (or has been) set."""
        with anyio.CancelScope() as scope:
            if self._set:
                scope.cancel()
            self._scopes.add(scope)
            try:
                yield
            finally:
                self._scopes.discard(scope)
