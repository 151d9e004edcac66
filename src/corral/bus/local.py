"""The in-process bus of the embedded mode: anyio events, no I/O.

It reaches only the tasks of this process. Another process on the same SQLite
file (a ``corral worker`` beside ``corral serve``) is not signalled; its
followers and workers find its work at their next poll.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio

from corral.bus.base import Bus, EventWatch


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


class LocalBus(Bus):
    """Signals between the tasks of one process."""

    def __init__(self) -> None:
        self._runnable = anyio.Event()
        self._watches: dict[str, set[SignalWatch]] = {}

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
