"""FakeClock: a :class:`~corral.core.clock.Clock` whose timers fire only when a test says so.

Pass it where the runtime takes a ``clock`` (worker, lease keeper, journal,
health) and call :meth:`FakeClock.advance` instead of sleeping until a timer
fires: every timer and ``sleep`` that is due by then has fired when ``advance``
returns (in the order they fall due), and nothing waits in real time.

Its monotonic time (intervals, timers) stands still between advances. Its wall
time is the real time plus every advance so far: the store stamps runs,
leases and approvals with the real time, and a worker on this clock must find
a run submitted a moment ago due, and an approval past its deadline once the
test advanced past it.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import anyio.lowlevel


@dataclass(order=True)
class FakeTimer:
    """A callback due at ``due`` on the clock's monotonic time (``cancel`` disarms it)."""

    due: float
    order: int
    callback: Callable[[], object] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """Time that passes when :meth:`advance` says (monotonic time starts at 0)."""

    def __init__(self) -> None:
        self._monotonic = 0.0
        self._timers: list[FakeTimer] = []
        self._order = itertools.count()
        self._armed: anyio.Event | None = None  # set by the next call_later

    def now(self) -> float:
        return time.time() + self._monotonic

    def monotonic(self) -> float:
        return self._monotonic

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await anyio.lowlevel.checkpoint()
            return
        woken = anyio.Event()
        timer = self.call_later(seconds, woken.set)
        try:
            await woken.wait()
        finally:
            timer.cancel()

    def call_later(self, seconds: float, callback: Callable[[], object]) -> FakeTimer:
        timer = FakeTimer(self._monotonic + max(seconds, 0.0), next(self._order), callback)
        heapq.heappush(self._timers, timer)
        if self._armed is not None:
            self._armed.set()
        return timer

    @property
    def pending(self) -> int:
        """How many timers and sleeps wait for time to pass."""
        return sum(not timer.cancelled for timer in self._timers)

    async def sleeping(self) -> None:
        """Return once a sleep or a timer waits for time to pass (advancing the clock
        before a task's sleep began would not wake it)."""
        while not self.pending:
            self._armed = anyio.Event()
            await self._armed.wait()
        self._armed = None

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass: fire what falls due, each at its own time, in order.

        Callbacks run here, in the caller's task; a sleeper resumes at its next turn.
        """
        if seconds < 0:
            raise ValueError("time does not go back")
        until = self._monotonic + seconds
        while self._timers and self._timers[0].due <= until:
            timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                self._monotonic = timer.due
                timer.callback()
        self._monotonic = until
