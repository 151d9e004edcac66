"""The in-process bus of the embedded mode: anyio events, no I/O.

It reaches only the tasks of this process. Another process on the same SQLite
file (a ``corral worker`` beside ``corral serve``) is not signalled; its
followers and workers find its work at their next poll.

Agent messages go through an in-process queue with the NATS bus's semantics, so
embedded mode delivers them through the same seam: a message id sent again within
the duplicate window is dropped; a delivery not settled within the ack wait (or
kept alive by ``in_progress``) is delivered again; ``nak(delay)`` delivers it again
once the delay passed; the delivery numbered ``max_deliver`` is the ``last``, and a
last delivery nak'ed or left unsettled goes to :attr:`LocalBus.dead_letters` (with a
log line) instead. The queue lives as long as the process: a message it held when the
process ended is found again by the coordinator's store sweep.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from corral.bus.base import Bus, EventWatch, MessageDelivery

log = logging.getLogger(__name__)

#: how long a sent message id is remembered to drop a duplicate (as NATS's window)
DUPLICATE_WINDOW_SECONDS = 120.0
#: unsettled messages held at most; beyond, a send is dropped (the store sweep finds it)
MAX_QUEUED_MESSAGES = 100_000
#: dead letters kept for an operator (the oldest are forgotten first)
MAX_DEAD_LETTERS = 1000


class SignalWatch(EventWatch):
    """A watch that a call of :meth:`fire` wakes: the flag behind every in-process watch."""

    def __init__(self) -> None:
        self._signal = anyio.Event()

    def fire(self) -> None:
        """An announcement came: the current or next :meth:`wait` returns ``True``."""
        self._signal.set()

    async def wait(self, seconds: float) -> bool:
        with anyio.move_on_after(seconds):
            await self._signal.wait()
        fired = self._signal.is_set()
        if fired:
            self._signal = anyio.Event()
        return fired


@dataclass(frozen=True)
class DeadLetter:
    """An agent message that ran out of deliveries."""

    message_id: str
    namespace: str
    agent: str
    deliveries: int


@dataclass
class _Queued:
    """An unsettled agent message: waiting until ``due``, or out with ``delivery`` until
    ``due`` (its ack wait), after which it is delivered again."""

    message_id: str
    namespace: str
    agent: str
    due: float
    attempt: int = 0
    delivery: _LocalMessageDelivery | None = None


class _LocalMessageDelivery(MessageDelivery):
    """A delivery from the in-process queue; only the newest delivery of a message settles it."""

    def __init__(self, bus: LocalBus, queued: _Queued) -> None:
        self._bus = bus
        self._queued = queued
        self.message_id = queued.message_id
        self.namespace = queued.namespace
        self.agent = queued.agent
        self.attempt = queued.attempt
        self.last = queued.attempt >= bus.max_deliver

    def _current(self) -> bool:
        return self._queued.delivery is self and self._bus._queue.get(self.message_id) is (
            self._queued
        )

    async def ack(self) -> None:
        if self._current():
            self._bus._forget(self._queued)

    async def term(self) -> None:
        if self._current():
            self._bus._forget(self._queued)

    async def nak(self, delay: float = 0.0) -> None:
        if not self._current():
            return
        if self.last:
            self._bus._dead_letter(self._queued)
        else:
            self._queued.delivery = None
            self._bus._schedule(self._queued, time.monotonic() + max(delay, 0.0))

    async def in_progress(self) -> None:
        if self._current():
            self._bus._schedule(self._queued, time.monotonic() + self._bus.ack_wait_seconds)


class LocalBus(Bus):
    """Signals between the tasks of one process, and its agent inboxes."""

    delivers_messages = True

    def __init__(
        self,
        *,
        ack_wait_seconds: float = 30.0,
        max_deliver: int = 5,
        max_queued: int = MAX_QUEUED_MESSAGES,
    ) -> None:
        self._runnable = anyio.Event()
        self._watches: dict[str, set[SignalWatch]] = {}
        self.ack_wait_seconds = ack_wait_seconds
        self.max_deliver = max(max_deliver, 1)
        self.max_queued = max_queued
        self._closed = False
        #: unsettled messages by id, and when each is due, earliest first (stale entries
        #: are skipped: an entry counts only while its time is the message's ``due``)
        self._queue: dict[str, _Queued] = {}
        self._due: list[tuple[float, int, str]] = []
        self._order = itertools.count()
        self._sent: OrderedDict[str, float] = OrderedDict()
        self._arrived = anyio.Event()
        self.dead_letters: deque[DeadLetter] = deque(maxlen=MAX_DEAD_LETTERS)

    async def close(self) -> None:
        """Agent messages sent afterwards are dropped; the rest carries on (one process)."""
        self._closed = True

    async def announce_runnable(self, run_ids: Sequence[str], *, mark: str | None = None) -> None:
        if run_ids:
            self._runnable.set()

    async def wait_runnable(self, seconds: float) -> None:
        with anyio.move_on_after(seconds):
            await self._runnable.wait()
        if self._runnable.is_set():
            self._runnable = anyio.Event()

    async def announce_events(self, run_id: str, last_seq: int) -> None:
        for watch in self._watches.get(run_id, ()):
            watch.fire()

    @asynccontextmanager
    async def watch_events(self, run_id: str) -> AsyncIterator[EventWatch]:
        watch = SignalWatch()
        self._watches.setdefault(run_id, set()).add(watch)
        try:
            yield watch
        finally:
            watchers = self._watches[run_id]
            watchers.discard(watch)
            if not watchers:
                del self._watches[run_id]

    # ----------------------------------------------------------------- agent messages

    async def send_agent_message(self, namespace: str, agent: str, message_id: str) -> None:
        if self._closed:
            return
        now = time.monotonic()
        while self._sent and next(iter(self._sent.values())) < now - DUPLICATE_WINDOW_SECONDS:
            self._sent.popitem(last=False)
        if message_id in self._sent:
            return  # a duplicate within the window, as NATS drops it
        if len(self._queue) >= self.max_queued:
            log.warning("bus: inbox queue full, agent message %s left to the sweep", message_id)
            return
        self._sent[message_id] = now
        self._schedule(_Queued(message_id, namespace, agent, due=now), now)

    async def take_agent_messages(self, limit: int, seconds: float) -> list[MessageDelivery]:
        if limit < 1:
            await anyio.sleep(seconds)
            return []
        deadline = time.monotonic() + seconds
        while True:
            arrived = self._arrived  # before looking: a send after the look sets this one
            taken = self._take_due(limit)
            now = time.monotonic()
            if taken or now >= deadline or self._closed:
                if self._closed and not taken:
                    await anyio.sleep(max(deadline - now, 0.0))
                return taken
            wait = deadline - now
            if self._due:
                wait = min(wait, max(self._due[0][0] - now, 0.0))
            with anyio.move_on_after(wait):
                await arrived.wait()

    def _take_due(self, limit: int) -> list[MessageDelivery]:
        """Deliver up to ``limit`` messages that are due; dead-letter those that ran out."""
        taken: list[MessageDelivery] = []
        now = time.monotonic()
        while self._due and len(taken) < limit and self._due[0][0] <= now:
            due, _, message_id = heapq.heappop(self._due)
            queued = self._queue.get(message_id)
            if queued is None or queued.due != due:
                continue  # settled, or due at another time since
            if queued.delivery is not None and queued.attempt >= self.max_deliver:
                self._dead_letter(queued)  # its last delivery was never settled
                continue
            queued.attempt += 1
            delivery = _LocalMessageDelivery(self, queued)
            queued.delivery = delivery
            self._schedule(queued, now + self.ack_wait_seconds, wake=False)
            taken.append(delivery)
        return taken

    def _schedule(self, queued: _Queued, due: float, *, wake: bool = True) -> None:
        queued.due = due
        self._queue[queued.message_id] = queued
        heapq.heappush(self._due, (due, next(self._order), queued.message_id))
        if wake:
            self._arrived.set()
            self._arrived = anyio.Event()

    def _forget(self, queued: _Queued) -> None:
        del self._queue[queued.message_id]  # its heap entries are skipped when they come up

    def _dead_letter(self, queued: _Queued) -> None:
        self._forget(queued)
        self.dead_letters.append(
            DeadLetter(queued.message_id, queued.namespace, queued.agent, queued.attempt)
        )
        log.warning(
            "bus: agent message %s to %s/%s was delivered %d times without being settled; "
            "it went to the dead letters (the message stays in the store, where it is settled)",
            queued.message_id,
            queued.namespace,
            queued.agent,
            queued.attempt,
        )
