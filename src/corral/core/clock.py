"""The clock the runtime reads and waits on: one seam, so tests can move time instead of waiting.

The worker (its poll, store sweep and upkeep), its health, the executor, the
lease keeper and the journal's deferred write take a :class:`Clock` (the system
clock unless told otherwise); a test passes a fake one and advances it. Four
operations cover every use:

- :meth:`Clock.now` - wall time in seconds since the epoch (``time.time()``):
  what is compared with stored timestamps (due runs, approval deadlines,
  retention) and stamped on what the runtime stores.
- :meth:`Clock.monotonic` - for intervals measured in this process (backoff,
  pacing).
- :meth:`Clock.sleep` - wait that many seconds.
- :meth:`Clock.call_later` - call a function that many seconds from now, from
  the event loop: a timer that costs no task (the journal arms one per
  idempotent tool call, and most are cancelled by the call's result).

:func:`move_on_after` is ``anyio.move_on_after`` on a clock of one's choosing.
The store stamps with ``time.time()`` of its own; where the runtime decides by
time it passes :meth:`Clock.now` to the store methods that take ``now``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

import anyio

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock", "Timer", "move_on_after"]


class Timer(Protocol):
    """A pending :meth:`Clock.call_later`; cancelling a timer that fired does nothing."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """Where the runtime reads the time and waits for it to pass."""

    def now(self) -> float:
        """Wall time, seconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary start that never goes back (for intervals)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed (at the next checkpoint if not positive)."""
        ...

    def call_later(self, seconds: float, callback: Callable[[], object]) -> Timer:
        """Call ``callback`` in the event loop once ``seconds`` have passed."""
        ...


class SystemClock:
    """The real time: ``time.time()``, ``time.monotonic()``, the event loop's timers."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(max(seconds, 0.0))  # (anyio refuses a negative delay)

    def call_later(self, seconds: float, callback: Callable[[], object]) -> Timer:
        return asyncio.get_running_loop().call_later(seconds, callback)


#: the default of every ``clock`` parameter (it holds no state)
SYSTEM_CLOCK: Clock = SystemClock()


@contextmanager
def move_on_after(clock: Clock, seconds: float) -> Iterator[anyio.CancelScope]:
    """A cancel scope cancelled once ``seconds`` have passed on ``clock``."""
    with anyio.CancelScope() as scope:
        timer = clock.call_later(seconds, scope.cancel)
        try:
            yield scope
        finally:
            timer.cancel()
