"""Keeping the leases of an executor's runs: one task renews them all.

A run's lease must be renewed well before it expires (every third of its
length), and a renewal is also how a cancellation request reaches the run. A
task per run that sleeps and renews costs a task, a task group and their cancel
scopes for every run - at no-op speeds the largest cost of a run after its own
work. So one :class:`LeaseKeeper` per executor renews every lease it holds in
rounds, and stops a run (through the callback it registered) when its lease is
lost or a cancellation was asked for. It also stops every run at once when the
worker shuts down.

A renewal that fails for a passing reason (a locked or restarting store) stops
nothing: the lease may still be valid, and if it is not, fencing refuses the
run's next write once another worker claimed it. The failure is reported to the
worker's health (logged, counted), and the next round comes sooner, after a
jittered backoff, until renewals work again. Only a lease the store says is
lost (or a run it no longer has) stops the run from here.

Each held lease also knows when it may be lost: its :attr:`HeldLease.deadline`,
a lease length after the claim, then after the start of the last renewal that
succeeded (monotonic time of the keeper's clock). A worker past it (stalled,
or its renewals failing or hanging) may have lost the run to another worker
without being told yet; the run's journal (:class:`~corral.runtime.journal.FencedSink`)
checks the deadline before each event, and past it asks the store to renew the
lease first (:meth:`LeaseKeeper.confirm`). Unless the store renews it, the run
starts no model call, no tool call and no write, and stops as a lost lease.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Literal

import anyio
import anyio.abc

from corral.core.backoff import jittered_backoff
from corral.core.clock import SYSTEM_CLOCK, Clock, move_on_after
from corral.core.errors import CorralError, LeaseLostError, NotFoundError
from corral.core.runs import Lease
from corral.runtime.health import WorkerHealth
from corral.store.base import Store

Reason = Literal["lost", "cancelled", "shutdown"]
#: after a round with a failed renewal, the next comes after a jittered backoff from this
RENEW_RETRY_BASE_SECONDS = 0.25
Stop = Callable[[Reason], None]


@dataclass(eq=False)
class HeldLease:
    """One run's lease, renewed while the ``with`` block of :meth:`LeaseKeeper.keep` runs.

    Its own context manager rather than a ``@contextmanager`` generator: every run
    enters one, and a generator-based one costs several times as much.
    """

    keeper: LeaseKeeper
    lease: Lease
    stop: Stop
    shutdown: anyio.Event | None
    #: when the lease may be lost, on the keeper's monotonic clock: ``lease_seconds``
    #: after entering the block, then after the start of each renewal that succeeded
    #: (the store's expiry is later still). Past it the lease may have gone to another worker.
    deadline: float = math.inf

    def __enter__(self) -> HeldLease:
        self.keeper._hold(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.keeper._held.discard(self)


class LeaseKeeper:
    """Renews the leases of registered runs every ``lease_seconds / 3`` on ``clock``;
    use it as an async context."""

    def __init__(
        self,
        store: Store,
        lease_seconds: float,
        health: WorkerHealth | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.lease_seconds = lease_seconds
        self.health = health
        self.clock = clock
        self._failed_rounds = 0  # rounds in a row in which a renewal failed
        self._round_failed = False
        self._held: set[HeldLease] = set()
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
    ) -> AbstractContextManager[HeldLease]:
        """Renew ``lease`` while the block runs; ``stop(reason)`` ends the run early."""
        return HeldLease(self, lease, stop, shutdown)

    def _hold(self, held: HeldLease) -> None:
        if self._group is None:
            raise RuntimeError("LeaseKeeper used outside its `async with` block")
        # (from here, not from the claim: a claim a moment ago; the store's expiry is later)
        held.deadline = self.clock.monotonic() + self.lease_seconds
        self._held.add(held)
        shutdown = held.shutdown
        if shutdown is not None and shutdown not in self._watched:
            self._watched.add(shutdown)
            self._group.start_soon(self._stop_on, shutdown)

    async def _renew_forever(self) -> None:
        every = self.lease_seconds / 3
        started = self.clock.monotonic()
        while True:
            if self._failed_rounds:  # try again sooner, backing off, never later than usual
                await self.clock.sleep(
                    jittered_backoff(self._failed_rounds, RENEW_RETRY_BASE_SECONDS, every)
                )
            else:  # every third of a lease from the last round's start: its time counts
                await self.clock.sleep(every - (self.clock.monotonic() - started))
            started = self.clock.monotonic()
            self._round_failed = False
            # Concurrently: one renewal waiting on a busy database must not make the
            # others late.
            async with anyio.create_task_group() as group:
                for held in list(self._held):
                    group.start_soon(self._renew, held)
            self._failed_rounds = self._failed_rounds + 1 if self._round_failed else 0

    async def _renew(self, held: HeldLease) -> None:
        if held not in self._held:  # its run ended meanwhile
            return
        sent = self.clock.monotonic()  # the store's new expiry is at least a lease after this
        try:
            _, cancel = await self.store.renew_lease(held.lease, self.lease_seconds)
        except (LeaseLostError, NotFoundError):
            held.stop("lost")
            return
        except CorralError as exc:
            # The lease may still be valid: the run goes on, the renewal is tried again.
            self._round_failed = True
            if self.health is not None:
                self.health.failed("renew", exc)
            return
        held.deadline = sent + self.lease_seconds
        if self.health is not None:
            self.health.succeeded("renew")
        if cancel:
            held.stop("cancelled")

    async def confirm(self, held: HeldLease) -> None:
        """Renew ``held`` at once, its deadline being past; ``LeaseLostError`` unless the
        store renews it within a third of a lease (refused, failed or no answer).

        A deadline passes when the worker stalled or its renewals failed: the lease may
        be another worker's by now, or still this one's (the store renews it only then).
        """
        sent = self.clock.monotonic()
        cause: BaseException | None = None
        with move_on_after(self.clock, self.lease_seconds / 3):
            try:
                _, cancel = await self.store.renew_lease(held.lease, self.lease_seconds)
            except CorralError as exc:
                cause = exc
            else:
                held.deadline = sent + self.lease_seconds
                if cancel:
                    held.stop("cancelled")
                return
        lease = held.lease
        raise LeaseLostError(
            f"run {lease.run_id!r}: the lease of {lease.owner!r} (token {lease.token}) went "
            f"{self.lease_seconds:g} s without a renewal, and renewing it now "
            + ("did not answer" if cause is None else f"failed: {cause}")
        ) from cause

    async def _stop_on(self, shutdown: anyio.Event) -> None:
        await shutdown.wait()
        for held in list(self._held):
            if held.shutdown is shutdown:
                held.stop("shutdown")
