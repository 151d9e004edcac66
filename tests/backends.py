"""The two deployments the worker, approval and session tests run on, side by side.

``sqlite``: embedded mode. The SQLite store in the test's home, the in-process
bus, and workers that find runs by sweeping the store.

``postgres+nats``: scale-out. The session's scratch PostgreSQL database (wiped
before the test) and the shared NATS JetStream server, under a prefix of the
test's own (its streams are deleted afterwards). Submits and approval decisions
are announced on NATS, and the worker takes runs from its deliveries
(``Worker._serve_dispatched``). Its store sweep runs once when it starts, before
the test submits anything, and then not for :data:`NO_SWEEP` seconds: longer
than any test, so a run can only start through a delivery. Each drain checks
that the worker claimed nothing by sweeping. (A test that needs the sweep, to
expire approvals say, asks for a short ``poll_seconds`` with the ``worker`` marker.)
A test that takes the ``clock`` fixture (a fake clock) runs its workers on that
clock: their polls, upkeep and lease renewals wait until the test advances it.

Tests take :func:`deployment_fixture` (a store URL, a NATS server or none, the
environment of ``corral`` processes) or :func:`backend_fixture` (a store, a bus
and workers in this process); both are parametrized over :data:`BACKENDS`. The
PostgreSQL and NATS fixtures fail when their server is unreachable, unless
``CORRAL_TEST_POSTGRES=skip`` / ``CORRAL_TEST_NATS=skip`` skip that variant.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.bus import Bus, open_bus
from corral.core.clock import SYSTEM_CLOCK, Clock
from corral.core.runs import Approval, RunRecord, RunState
from corral.core.settings import Settings
from corral.runtime import operations
from corral.runtime.worker import Worker
from corral.store import Store, open_store
from databases import PostgresServer

SQLITE = "sqlite"
POSTGRES_NATS = "postgres+nats"
BACKENDS = [SQLITE, POSTGRES_NATS]
#: the store sweep of a dispatching worker, in seconds: never, within a test
NO_SWEEP = 3600.0
#: how long a drain may take before the test fails
DRAIN_SECONDS = 30.0


@dataclass(frozen=True)
class Deployment:
    """Where one test's Corral keeps its state: a store, and a NATS server for scale-out."""

    kind: str
    home: Path
    db_url: str
    nats_url: str | None = None
    nats_prefix: str = "corral"

    @property
    def dispatches(self) -> bool:
        """Whether runs reach workers as NATS deliveries (else by the store sweep)."""
        return self.nats_url is not None

    def settings(self) -> Settings:
        return Settings(
            home=self.home,
            db_url=self.db_url,
            secret_key=None,
            nats_url=self.nats_url,
            nats_prefix=self.nats_prefix,
        )

    def environment(self) -> dict[str, str]:
        """The environment of a ``corral`` process on this deployment (no other CORRAL_*)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        env["CORRAL_HOME"] = str(self.home)
        if self.kind != SQLITE:
            env["CORRAL_DB_URL"] = self.db_url
        if self.nats_url is not None:
            env.update(CORRAL_NATS_URL=self.nats_url, CORRAL_NATS_PREFIX=self.nats_prefix)
        return env

    async def open_bus(self, name: str) -> Bus:
        """A bus connection of its own (the in-process bus without NATS)."""
        return await open_bus(self.nats_url, prefix=self.nats_prefix, name=name)


@pytest.fixture(name="deployment", params=BACKENDS)
def deployment_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> Deployment:
    home = tmp_path / "home"
    home.mkdir()
    if request.param == SQLITE:
        return Deployment(SQLITE, home, f"sqlite:///{home / 'corral.db'}")
    postgres: PostgresServer = request.getfixturevalue("postgres")
    return Deployment(
        POSTGRES_NATS,
        home,
        postgres.url(postgres.scratch()),
        nats_url=request.getfixturevalue("nats_server_url"),
        nats_prefix=request.getfixturevalue("nats_prefix"),
    )


@dataclass
class Backend:
    """A store, the bus submits and decisions are announced on, and workers in this process.

    On ``postgres+nats`` one dispatching worker, with a NATS connection of its own,
    serves for the whole test (started before the test submits anything); on
    ``sqlite`` each :meth:`drain` is a new worker that stops when nothing is left.
    """

    deployment: Deployment
    store: Store
    bus: Bus
    #: options of every worker of the test (the ``worker`` marker's keywords)
    options: dict[str, Any] = field(default_factory=dict[str, Any])
    #: the clock of its workers (the test's ``clock`` fixture when it takes one)
    clock: Clock = SYSTEM_CLOCK
    #: the dispatching worker of ``postgres+nats`` and its task
    serving_worker: Worker | None = None
    _task: asyncio.Task[None] | None = None
    _worker_bus: Bus | None = None
    _stop: anyio.Event = field(default_factory=anyio.Event)

    @property
    def settings(self) -> Settings:
        return self.deployment.settings()

    def new_worker(self, **defaults: Any) -> Worker:
        options = {**defaults, **self.options}
        return Worker(self.store, self.settings, bus=self.bus, clock=self.clock, **options)

    async def submit(self, agent: str, user_input: str, **options: Any) -> tuple[RunRecord, bool]:
        """Queue a run and announce it, as the API and ``corral submit`` do."""
        return await operations.submit(self.store, agent, user_input, bus=self.bus, **options)

    async def decide(
        self, approval_id: str, approved: bool, *, by: str | None = None, reason: str | None = None
    ) -> Approval:
        """Decide an approval and announce its run, as the API and the CLI do."""
        return await operations.decide(
            self.store, self.bus, approval_id, approved, by=by, reason=reason
        )

    async def drain(self) -> Worker:
        """Execute what can run now; returns when every run is finished or waits for a human.

        ``sqlite``: a worker that stops when it finds nothing more (a run waiting for
        its retry time stays queued). ``postgres+nats``: waits until the serving worker
        has nothing queued or running left, and checks that every run it executed
        came from a delivery.
        """
        if self.serving_worker is None:
            worker = self.new_worker(poll_seconds=0.05)
            with anyio.fail_after(DRAIN_SECONDS):
                await worker.serve(anyio.Event(), until_idle=True)
            return worker
        worker = self.serving_worker
        with anyio.fail_after(DRAIN_SECONDS):
            while not await self._settled(worker):
                await anyio.sleep(0.02)
        self.check_dispatched(worker, settled=True)
        return worker

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[Worker]:
        """A worker executing runs in the background while the block runs."""
        if self.serving_worker is not None:
            yield self.serving_worker
            self.check_dispatched(self.serving_worker)
            return
        worker = self.new_worker(poll_seconds=0.05)
        stop = anyio.Event()
        async with anyio.create_task_group() as group:
            group.start_soon(worker.serve, stop)
            try:
                yield worker
            finally:
                stop.set()

    def check_dispatched(self, worker: Worker, *, settled: bool = False) -> None:
        """On ``postgres+nats`` with no sweep: the worker claimed nothing from the store,
        and (``settled``: none in flight) executed exactly the runs it claimed from deliveries
        and those its runs claimed (a child at its submit, a parent its last child woke)."""
        if not (worker.bus.dispatches and worker.poll_seconds >= NO_SWEEP):
            return  # sweeping: a test that asked for a short poll_seconds
        assert worker.swept == 0, f"{worker.swept} runs claimed by the store sweep"
        if settled:
            claimed = worker.dispatched + worker.taken
            assert claimed == worker.executed, (worker.dispatched, worker.taken, worker.executed)

    async def _settled(self, worker: Worker) -> bool:
        if self._task is not None and self._task.done():
            await self._task  # raises what stopped it
            raise AssertionError("the dispatching worker stopped")
        counts = await self.store.count_runs()
        busy = (RunState.QUEUED, RunState.RUNNING)
        return not worker.active and not any(
            n for (_, state), n in counts.by_state.items() if state in busy
        )

    async def start_serving(self) -> None:
        """Start the dispatching worker; return once its first store sweep is done."""
        self._worker_bus = await self.deployment.open_bus("test worker")
        options = {"poll_seconds": NO_SWEEP, "grace_seconds": 5.0, **self.options}
        worker = Worker(
            self.store, self.settings, bus=self._worker_bus, clock=self.clock, **options
        )
        self.serving_worker = worker
        self._task = asyncio.create_task(worker.serve(self._stop))
        with anyio.fail_after(10):
            while worker.sweeps < 1:
                if self._task.done():
                    await self._task
                    raise AssertionError("the dispatching worker stopped")
                await anyio.sleep(0.01)

    async def close(self) -> None:
        self._stop.set()
        try:
            if self._task is not None:
                await asyncio.wait_for(self._task, 20)
        finally:
            if self._worker_bus is not None:
                await self._worker_bus.close()
            await self.bus.close()
            await self.store.close()


@pytest.fixture(name="backend")
async def backend_fixture(
    deployment: Deployment, request: pytest.FixtureRequest
) -> AsyncIterator[Backend]:
    """A :class:`Backend` on the deployment; ``@pytest.mark.worker(**options)`` sets the
    options of its workers (``lease_seconds``, ``retry_base_seconds``, ``poll_seconds``...),
    and a test that takes the ``clock`` fixture has them run on that clock."""
    marker = request.node.get_closest_marker("worker")
    options = dict(marker.kwargs) if marker is not None else {}
    clock: Clock = (
        request.getfixturevalue("clock") if "clock" in request.fixturenames else SYSTEM_CLOCK
    )
    store = await open_store(deployment.db_url)
    try:
        bus = await deployment.open_bus("test")
    except BaseException:
        await store.close()
        raise
    backend = Backend(deployment, store, bus, options, clock)
    try:
        if deployment.dispatches:
            await backend.start_serving()
        yield backend
    finally:
        await backend.close()
