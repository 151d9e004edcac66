"""Keeping the leases of an executor's runs: one task renews them all.

A run's lease must be renewed well before it expires (every third of its
length), and a renewal is also how a cancellation request reaches the run. A
task per run that sleeps and renews costs a task, a task group and their cancel
scopes for every run - at no-op speeds the largest cost of a run after its own
work. So one :class:`LeaseKeeper` per executor renews every lease it holds in
rounds, and stops a run (through the callback it registered) when its lease is
lost or a cancellation was asked for. It also stops every run at once when the
worker shuts down.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Literal

import anyio
import anyio.abc

from corral.core.errors import CorralError, LeaseLostError
from corral.core.runs import Lease
from corral.store.base import Store

Reason = Literal["lost", "cancelled", "shutdown"]
Stop = Callable[[Reason], None]


@dataclass(eq=False)
class _Held:
    """One run's lease, renewed while the ``with`` block of :meth:`LeaseKeeper.keep` runs.

    Its own context manager rather than a ``@contextmanager`` generator: every run
    enters one, and a generator-based one costs several times as much.
    """

    keeper: LeaseKeeper
    lease: Lease
    stop: Stop
    shutdown: anyio.Event | None

    def __enter__(self) -> None:
        self.keeper._hold(self)

    def __exit__(self, *exc_info: object) -> None:
        self.keeper._held.discard(self)


class LeaseKeeper:
    """Renews the leases of registered runs every ``lease_seconds / 3``; use it as an async context."""

    def __init__(self, store: Store, lease_seconds: float) -> None:
        self.store = store
        self.lease_seconds = lease_seconds
        self._held: set[_Held] = set()
        self._watched: set[anyio.Event] = set()
        self._group: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> LeaseKeeper:
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        self._group.start_soon(self._renew_forever)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        group, self._group = self._group, None
        if group is not None:
            group.cancel_scope.cancel()
            await group.__aexit__(None, None, None)

    def keep(
        self, lease: Lease, stop: Stop, shutdown: anyio.Event | None = None
    ) -> AbstractContextManager[None]:
        """Renew ``lease`` while the block runs; ``stop(reason)`` ends the run early."""
        return _Held(self, lease, stop, shutdown)

    def _hold(self, held: _Held) -> None:
        if self._group is None:
            raise RuntimeError("LeaseKeeper used outside its `async with` block")
        self._held.add(held)
        shutdown = held.shutdown
        if shutdown is not None and shutdown not in self._watched:
            self._watched.add(shutdown)
            self._group.start_soon(self._stop_on, shutdown)

    async def _renew_forever(self) -> None:
        while True:
            await anyio.sleep(self.lease_seconds / 3)
            # Concurrently: one renewal waiting on a busy database must not make the
            # others late.
            async with anyio.create_task_group() as group:
                for held in list(self._held):
                    group.start_soon(self._renew, held)

    async def _renew(self, held: _Held) -> None:
        if held not in self._held:  # its run ended meanwhile
            return
        try:
            _, cancel = await self.store.renew_lease(held.lease, self.lease_seconds)
        except LeaseLostError:
            held.stop("lost")
            return
        except CorralError:
            # A store that stumbles once is tried again next round; the lease has
            # two more rounds before it expires.
            return
        if cancel:
            held.stop("cancelled")

    async def _stop_on(self, shutdown: anyio.Event) -> None:
        await shutdown.wait()
        for held in list(self._held):
            if held.shutdown is shutdown:
                held.stop("shutdown")
