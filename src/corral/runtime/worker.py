"""A worker: claims runnable runs with a lease and executes them, up to its concurrency.

Shutdown (``stop`` set, e.g. on SIGTERM): the worker stops claiming, gives its
in-flight runs ``grace_seconds`` to finish, then interrupts them and releases
their leases so another worker resumes them at once from their journals.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable

import anyio

from corral.bus.base import Bus
from corral.bus.local import LocalBus
from corral.core.ids import new_id
from corral.core.runs import Lease, RunRecord
from corral.core.settings import Settings
from corral.runtime.executor import Observer, RunExecutor
from corral.store.base import Store

log = logging.getLogger(__name__)

PRUNE_INTERVAL_SECONDS = 600.0
#: While runs are queued (the last claim got all it asked for), a busy worker claims again
#: once an eighth of its slots are free, or this long after its last claim: finishing
#: runs are refilled in batches, one claim transaction each.
CLAIM_COALESCE_SECONDS = 0.01


def default_owner() -> str:
    """A worker identity that says where it runs: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{new_id('w')[-6:]}"


class Worker:
    """Claims and executes runs until told to stop."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        *,
        concurrency: int = 8,
        lease_seconds: float = 30.0,
        poll_seconds: float = 0.5,
        grace_seconds: float = 30.0,
        retry_base_seconds: float = 1.0,
        owner: str | None = None,
        bus: Bus | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.store = store
        self.bus = bus or LocalBus()
        self.owner = owner or default_owner()
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.poll_seconds = poll_seconds
        self.grace_seconds = grace_seconds
        self.retention_days = settings.run_retention_days
        self._next_prune = 0.0
        self._last_claim = 0.0
        self._claim_batch = max(1, concurrency // 8)
        self._backlog = False
        self.executor = RunExecutor(
            store,
            settings,
            lease_seconds=lease_seconds,
            retry_base_seconds=retry_base_seconds,
            bus=self.bus,
            observer=observer,  # sees every event of the runs this worker executes (metrics)
        )
        self.active: dict[str, Lease] = {}
        self.executed = 0
        self._wake = anyio.Event()
        self._idle = anyio.Event()
        self._shutdown = anyio.Event()

    def wake(self) -> None:
        """Look for work now instead of at the next poll (used after an in-process submit)."""
        self._wake.set()

    async def serve(self, stop: anyio.Event, *, until_idle: bool = False) -> None:
        """Claim and execute runs until ``stop`` is set (or, with ``until_idle``, none are left)."""
        async with self.executor, anyio.create_task_group() as group:
            while not stop.is_set():
                claimed = await self._claim(group)
                if until_idle and not claimed and not self.active:
                    break
                if not claimed:
                    await self._idle_wait(stop)
            await self._drain()

    async def _idle_wait(self, stop: anyio.Event) -> None:
        """Until there may be work: stop, a freed slot, a bus announcement, or the poll."""
        look = self._next_look()
        with anyio.move_on_after(look):
            await _first_of(stop.wait, self._wake.wait, lambda: self.bus.wait_runnable(look))
        self._wake = anyio.Event()

    async def _claim(self, group: anyio.abc.TaskGroup) -> int:
        await self.store.expire_approvals()
        await self._prune()
        free = self.concurrency - len(self.active)
        if free <= 0 or self._coalescing(free):
            return 0
        self._last_claim = time.monotonic()
        claims = await self.store.claim_runs(self.owner, self.lease_seconds, free)
        for record, lease in claims:
            self.active[record.id] = lease
            group.start_soon(self._execute, record, lease)
        self._backlog = len(claims) == free
        return len(claims)

    def _coalescing(self, free: int) -> bool:
        """Whether to wait for more free slots before claiming (see CLAIM_COALESCE_SECONDS)."""
        if not (self._backlog and self.active) or free >= self._claim_batch:
            return False
        return time.monotonic() - self._last_claim < CLAIM_COALESCE_SECONDS

    def _next_look(self) -> float:
        """How long to wait for a wake-up before looking for work again."""
        free = self.concurrency - len(self.active)
        if self._backlog and self.active and 0 < free < self._claim_batch:
            return min(self.poll_seconds, CLAIM_COALESCE_SECONDS)
        return self.poll_seconds

    async def _prune(self) -> None:
        """Apply the retention setting, at most every PRUNE_INTERVAL_SECONDS."""
        now = time.time()
        if self.retention_days is None or now < self._next_prune:
            return
        self._next_prune = now + PRUNE_INTERVAL_SECONDS
        pruned = await self.store.prune_runs(finished_before=now - self.retention_days * 86400)
        if pruned:
            log.info("pruned %d finished runs older than %g days", pruned, self.retention_days)

    async def _execute(self, record: RunRecord, lease: Lease) -> None:
        try:
            outcome = await self.executor.execute(record, lease, self._shutdown)
            log.info("run %s: %s", record.id, outcome)
        except Exception:
            # The lease is left to expire: another worker (or this one) tries again.
            log.exception("run %s failed in the worker", record.id)
        finally:
            self.active.pop(record.id, None)
            self.executed += 1
            self._wake.set()
            if not self.active:
                self._idle.set()

    async def _drain(self) -> None:
        self._idle = anyio.Event()
        if self.active:
            with anyio.move_on_after(self.grace_seconds):
                await self._idle.wait()
        if self.active:
            log.warning("releasing %d unfinished runs", len(self.active))
            self._shutdown.set()
            with anyio.move_on_after(10):
                await self._idle.wait()


async def _first_of(*waits: Callable[[], Awaitable[object]]) -> None:
    """Return as soon as the first of ``waits`` returns (the others are cancelled)."""
    async with anyio.create_task_group() as group:

        async def wait(until: Callable[[], Awaitable[object]]) -> None:
            await until()
            group.cancel_scope.cancel()

        for until in waits:
            group.start_soon(wait, until)
