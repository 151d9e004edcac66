"""The Bus contract: announcements that let workers and followers stop polling.

Two kinds of signal, both hints about state already committed to the store:

- *runnable*: a run may be claimed now (submitted, released, approved). Workers
  wait on :meth:`Bus.wait_runnable` between claims instead of sleeping a full
  poll interval.
- *events stored*: a run has new events up to a sequence number. Followers (SSE
  streams, ``corral logs --follow``) hold an :class:`EventWatch` and read the
  store when it fires.

Every announcement is sent after the commit it announces, so a woken reader
always finds what it was told about. Every wait has a timeout, and callers
treat a timeout like a signal (they look at the store): that is what keeps a
lost message harmless.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Self


class EventWatch(ABC):
    """A registration for one run's events; created *before* the first read of the store.

    Registering first closes the gap between reading the store and starting to
    wait: an announcement that arrives in between makes the next :meth:`wait`
    return at once.
    """

    @abstractmethod
    async def wait(self, seconds: float) -> bool:
        """Wait until events were announced since the last wait, or ``seconds`` pass.

        Returns ``True`` when an announcement came, ``False`` on timeout. Either
        way the caller reads the store next.
        """


class Bus(ABC):
    """Wake-ups between the processes (or tasks) of one Corral deployment."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:  # noqa: B027 - most buses hold nothing to release
        """Release connections; announcements after close are dropped."""

    @abstractmethod
    async def announce_runnable(self, run_ids: Sequence[str]) -> None:
        """Say that these runs may be claimed now (after the commit that made them so)."""

    @abstractmethod
    async def wait_runnable(self, seconds: float) -> None:
        """Return when a run was announced runnable since the last call, or after ``seconds``."""

    @abstractmethod
    async def announce_events(self, run_id: str, last_seq: int) -> None:
        """Say that ``run_id`` has events stored up to ``last_seq`` (after their commit)."""

    @abstractmethod
    def watch_events(self, run_id: str) -> AbstractAsyncContextManager[EventWatch]:
        """Register for announcements of ``run_id``'s events for the life of the context."""
