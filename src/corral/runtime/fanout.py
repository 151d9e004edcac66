"""Many followers of one run, one store read: shared reads of a run's events.

When a batch of a run's events is committed and announced, every follower of
that run wakes at once and asks the store for the events after the same
position. :class:`FanOut` lets them share one read: a follower joins a read of
the same run and position that is in flight, as long as that read started after
the latest announcement the follower may be answering - the bus announces after
the commit, so such a read sees the commit. Without it, 100 SSE streams of a run
make 100 identical store reads per batch.

:class:`FanOutBus` is the bus of a process with a fan-out: it tells the fan-out
each announcement (``run_id``, ``last_seq``) before passing it on, so the
fan-out knows how fresh a read must be. A run executed by another process is
announced nowhere here; its followers poll, and a shared read is then no staler
than a poll.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager

import anyio

from corral.bus.base import Bus, Delivery, EventWatch, MessageDelivery
from corral.core.events import Event
from corral.store.base import Store

#: runs whose last announcement is remembered (the oldest are forgotten first)
REMEMBERED_RUNS = 10_000


class _Read:
    def __init__(self, covers: int) -> None:
        self.covers = covers
        self.events: list[Event] | None = None
        self.done = anyio.Event()


class FanOut:
    """Store reads of run events, shared by the followers that ask for the same thing."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._announced: OrderedDict[str, int] = OrderedDict()
        self._reads: dict[tuple[str, int], _Read] = {}
        self.reads = 0  # store reads made (the figure sharing keeps low)

    def announced(self, run_id: str, last_seq: int) -> None:
        """Events of ``run_id`` up to ``last_seq`` are committed."""
        self._announced[run_id] = max(last_seq, self._announced.get(run_id, 0))
        self._announced.move_to_end(run_id)
        while len(self._announced) > REMEMBERED_RUNS:
            self._announced.popitem(last=False)

    async def list_events(self, run_id: str, after: int) -> list[Event]:
        """As :meth:`Store.list_events`; the list may be shared: do not change it."""
        needed = self._announced.get(run_id, 0)
        key = (run_id, after)
        shared = self._reads.get(key)
        if shared is not None and shared.covers >= needed:
            await shared.done.wait()
            if shared.events is not None:
                return shared.events
        read = _Read(covers=needed)
        self._reads[key] = read
        self.reads += 1
        try:
            read.events = await self.store.list_events(run_id, after)
            return read.events
        finally:
            if self._reads.get(key) is read:
                del self._reads[key]
            read.done.set()  # joiners of a failed or cancelled read read for themselves


class FanOutBus(Bus):
    """A bus that tells a :class:`FanOut` of every event announcement, then passes it on."""

    def __init__(self, inner: Bus, fan_out: FanOut) -> None:
        self.inner = inner
        self.fan_out = fan_out
        # A dispatching inner bus (NATS) dispatches through this one too.
        self.dispatches = inner.dispatches
        self.ack_wait_seconds = inner.ack_wait_seconds
        self.delivers_messages = inner.delivers_messages

    async def close(self) -> None:
        await self.inner.close()

    async def announce_runnable(self, run_ids: Sequence[str], *, mark: str | None = None) -> None:
        await self.inner.announce_runnable(run_ids, mark=mark)

    async def wait_runnable(self, seconds: float) -> None:
        await self.inner.wait_runnable(seconds)

    async def take_runnable(self, limit: int, seconds: float) -> list[Delivery]:
        return await self.inner.take_runnable(limit, seconds)

    async def announce_events(self, run_id: str, last_seq: int) -> None:
        self.fan_out.announced(run_id, last_seq)  # first: a woken follower must see it
        await self.inner.announce_events(run_id, last_seq)

    def watch_events(self, run_id: str) -> AbstractAsyncContextManager[EventWatch]:
        return self.inner.watch_events(run_id)

    async def send_agent_message(self, namespace: str, agent: str, message_id: str) -> None:
        await self.inner.send_agent_message(namespace, agent, message_id)

    async def take_agent_messages(self, limit: int, seconds: float) -> list[MessageDelivery]:
        return await self.inner.take_agent_messages(limit, seconds)
