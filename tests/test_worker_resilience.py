"""Workers outlive their store: a locked SQLite file, terminated PostgreSQL backends, a
PostgreSQL server that stops and restarts.

The end-to-end tests run the real programs - ``corral serve`` or ``corral
worker`` in a subprocess - against a real database, break the database from
outside, and check that the worker said so (readiness 503 naming the failing
operation, the error counter) and then finished every run without being
restarted. Faster ones inject a store that fails on cue through the server's
``open_store_with`` seam (a subclass of the real store), and drive the lease
keeper, on a fake clock, with one whose renewals fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from corral.core.runs import Lease, RunRecord, RunState
from corral.core.settings import Settings
from corral.resources.loader import load_text
from corral.resources.secrets import SecretCipher
from corral.runtime.health import WorkerHealth
from corral.runtime.leases import LeaseKeeper
from corral.runtime.operations import submit as submit_run
from corral.runtime.worker import RETRY_DELIVERY_SECONDS
from corral.store import Store, open_store
from corral.store.base import StoreError
from corral.store.sql import SqlStore
from databases import PostgresServer
from fake_clock import FakeClock
from postgres_cluster import PrivateCluster
from server_harness import LiveServer, apply, echo_turn, resources, wait_for
from test_server_shutdown import ServeProcess, in_flight
from test_store_durable import a_task
from test_worker_dispatch import DispatchingBus, FakeDelivery, quick_agent, running, until
from test_worker_metrics import free_port, sample

#: holds SQLite's write lock from its own process until a line arrives on stdin
LOCKER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
print("released", flush=True)
"""


def idempotent(yaml_text: str) -> str:
    """The resources with their ``echo`` tool declared idempotent.

    A run whose journal write fails with the store is resumed by a later claim; a
    non-idempotent call cut off then waits for a human by design (see
    ``interrupted_calls``), an idempotent one simply runs again.
    """
    return yaml_text.replace(
        "  timeout_seconds: 60\n", "  timeout_seconds: 60\n  idempotent: true\n"
    )


# --------------------------------------------------------------------------- a store that fails

#: while set, the claims and submits of a :class:`FailingStore` fail as a locked database's do
STORE_DOWN = threading.Event()


class FailingStore(SqlStore):
    """A real store whose claims fail while ``STORE_DOWN`` is set, or always with a bug
    (``crash``): what the worker and the API see of a store in trouble."""

    crash = False

    async def claim_runs(self, *args: Any, **kwargs: Any) -> list[tuple[RunRecord, Lease]]:
        if self.crash:
            raise RuntimeError("a bug in the claim")
        if STORE_DOWN.is_set():
            raise StoreError("cannot claim runs: the database stayed locked (/srv/secret.db)")
        return await super().claim_runs(*args, **kwargs)

    async def submit_agent_run(self, *args: Any, **kwargs: Any) -> Any:
        if STORE_DOWN.is_set():
            raise StoreError("cannot submit a run: the database stayed locked (/srv/secret.db)")
        return await super().submit_agent_run(*args, **kwargs)


class RenewalsFail(SqlStore):
    """A real store whose lease renewals fail while ``failing`` is set."""

    failing = False

    async def renew_lease(self, lease: Lease, lease_seconds: float) -> tuple[Lease, bool]:
        if self.failing:
            raise StoreError("cannot renew the lease: the database stayed locked")
        return await super().renew_lease(lease, lease_seconds)


async def renewal_rounds_until(clock: FakeClock, check: Callable[[], bool]) -> None:
    """Renewal rounds of the keeper on ``clock`` (its only user) until ``check()``: each
    advance of a third of the lease, past any backoff too, starts the next round."""
    with anyio.fail_after(20):
        while not check():
            await clock.sleeping()  # the last round is over
            clock.advance(0.2)


async def test_failed_renewals_stop_no_run_until_the_lease_is_really_lost(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'corral.db'}"
    store = await RenewalsFail.open(url, cipher=SecretCipher(key=SecretCipher.generate_key()))
    assert isinstance(store, RenewalsFail)
    counted: list[str] = []
    health = WorkerHealth("w1", on_error=counted.append)
    stopped: list[str] = []
    clock = FakeClock()
    try:
        await store.submit_run(a_task("run_1"))
        [(_, lease)] = await store.claim_runs("w1", 0.6)
        async with LeaseKeeper(store, 0.6, health, clock) as keeper:
            with keeper.keep(lease, stopped.append):
                store.failing = True  # rounds fail, past the lease's expiry too
                await renewal_rounds_until(clock, lambda: len(counted) >= 4)
                assert "renew" in health.failing and stopped == []
                store.failing = False
                # renewed again: still its lease
                await renewal_rounds_until(clock, lambda: "renew" not in health.failing)
                assert stopped == []
                # Lost for real: it expired while renewals failed and another worker took it.
                store.failing = True
                await renewal_rounds_until(clock, lambda: len(counted) >= 6)
                [(_, taken)] = await store.claim_runs("w2", 30.0, now=time.time() + 5)
                store.failing = False
                await renewal_rounds_until(clock, lambda: bool(stopped))
        assert stopped == ["lost"] and taken.token == lease.token + 1
        assert set(counted) == {"renew"}
    finally:
        await store.close()


async def test_a_dispatched_worker_whose_delivered_claims_fail_is_unready_until_one_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_TEST_SIDE_EFFECTS", str(tmp_path / "effects.txt"))
    settings = Settings(
        home=tmp_path, db_url=f"sqlite:///{tmp_path / 'corral.db'}", secret_key=None
    )
    store = await open_failing(settings)
    bus = DispatchingBus()
    try:
        await quick_agent(store)
        async with running(store, settings, bus) as worker:
            run, _ = await submit_run(store, "helper", "hi")
            STORE_DOWN.set()
            refused = FakeDelivery(run.id)
            bus.deliver(refused)
            await until(lambda: bool(refused.settled))
            [(what, delay)] = refused.settled
            assert what == "nak" and delay >= RETRY_DELIVERY_SECONDS  # again, backing off
            problem = worker.health.problem()
            assert problem is not None and "cannot claim runs: store_error" in problem

            STORE_DOWN.clear()
            again = FakeDelivery(run.id, attempt=2)
            bus.deliver(again)
            await until(lambda: bool(again.settled))
        assert again.settled == [("ack", 0.0)]
        assert worker.health.problem() is None
        stored = await store.get_run(run.id)
        assert stored is not None and stored.state is RunState.SUCCEEDED
        assert (tmp_path / "effects.txt").read_text() == "hi\n"  # its tool ran, once
    finally:
        STORE_DOWN.clear()
        await store.close()


class CrashingStore(FailingStore):
    crash = True


async def open_failing(settings: Settings) -> FailingStore:
    store = await FailingStore.open(settings.db_url, cipher=SecretCipher.from_settings(settings))
    assert isinstance(store, FailingStore)
    return store


async def open_crashing(settings: Settings) -> CrashingStore:
    store = await CrashingStore.open(settings.db_url, cipher=SecretCipher.from_settings(settings))
    assert isinstance(store, CrashingStore)
    return store


def test_while_claims_fail_serve_is_unready_and_submits_answer_503_then_it_recovers(
    tmp_path: Path,
) -> None:
    STORE_DOWN.set()
    try:
        with LiveServer(tmp_path, workers=2, open_store_with=open_failing) as server:
            client = server.client(server.admin)
            apply(client, resources("flaky", [echo_turn("hi"), "{text: done}"]))

            def readiness() -> httpx.Response | None:
                answer = client.get("/readyz")
                return answer if answer.status_code == 503 else None

            unready = wait_for(readiness, message="/readyz 503")
            assert unready.json() == {
                "status": "not_ready",
                "detail": unready.json()["detail"],
            }
            assert "cannot claim runs: store_error" in unready.json()["detail"]
            assert "secret" not in unready.text  # the driver's words stay in the log
            refused = client.post("/v1/tasks", json={"agent": "flaky", "input": "x"})
            assert refused.status_code == 503
            assert refused.json()["code"] == "store_unavailable"
            assert refused.headers["Retry-After"] == "1"
            assert "secret" not in refused.text
            assert client.get("/healthz").status_code == 200  # alive, only not ready

            STORE_DOWN.clear()
            wait_for(lambda: client.get("/readyz").status_code == 200, message="ready again")
            run_id = client.post("/v1/tasks", json={"agent": "flaky", "input": "x"}).json()["id"]
            wait_for(
                lambda: client.get(f"/v1/tasks/{run_id}").json()["state"] == "succeeded",
                message="the run to succeed",
            )
            metrics = client.get("/metrics").text
            assert (sample(metrics, "corral_worker_errors_total", operation="claim") or 0) >= 1
            for operation in ("sweep", "renew", "approvals", "retention"):  # a fixed set, at 0
                assert sample(metrics, "corral_worker_errors_total", operation=operation) == 0
    finally:
        STORE_DOWN.clear()


def test_a_crashed_embedded_worker_fails_readiness_and_the_api_keeps_serving(
    tmp_path: Path,
) -> None:
    with LiveServer(tmp_path, workers=2, open_store_with=open_crashing) as server:
        client = server.client(server.admin)

        def readiness() -> httpx.Response | None:
            answer = client.get("/readyz")
            return answer if answer.status_code == 503 else None

        detail = wait_for(readiness, message="/readyz 503").json()["detail"]
        assert detail == "the worker stopped on an unexpected error (RuntimeError); see the log"
        assert client.get("/healthz").status_code == 200
        assert client.get("/v1/tasks").status_code == 200
        assert client.get("/readyz").status_code == 503  # for good: nothing restarts it


#: the busy timeout of the server under test (CORRAL_SQLITE_BUSY_TIMEOUT_SECONDS; 30 s by default)
BUSY_TIMEOUT_SECONDS = 3.0


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    busy = {"CORRAL_SQLITE_BUSY_TIMEOUT_SECONDS": str(BUSY_TIMEOUT_SECONDS)}
    server = ServeProcess(tmp_path / "home", grace_seconds=5, env=busy)
    try:
        yield server
    finally:
        server.kill()


class Submit(threading.Thread):
    """``POST /v1/tasks`` in a thread (it may wait as long as the store's lock)."""

    def __init__(self, client: httpx.Client, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.client, self.body = client, body
        self.response: httpx.Response | None = None

    def run(self) -> None:
        self.response = self.client.post("/v1/tasks", json=self.body, timeout=120)


def test_a_write_lock_held_past_the_busy_timeout_makes_serve_unready_then_it_recovers(
    serve: ServeProcess,
) -> None:
    client = serve.client()
    apply(client, resources("locked", [echo_turn("hi"), "{text: done}"]))
    apply(client, idempotent(resources("inflight", [echo_turn("slow", 3.0), "{text: done}"])))
    ready = httpx.get(f"{serve.url}/readyz")
    assert ready.status_code == 200, ready.text
    # A run in its tool call when the lock comes: its lease renewals fail meanwhile.
    inflight = client.post("/v1/tasks", json={"agent": "inflight", "input": "x"}).json()["id"]
    wait_for(lambda: in_flight(client, inflight), message="the tool call to start")

    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(serve.home / "corral.db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert locker.stdout is not None and locker.stdin is not None
        assert locker.stdout.readline().strip() == "locked"
        locked_at = time.monotonic()

        # The worker's claim waits out the busy timeout, fails, and readiness says so.
        def unready() -> str | None:
            answer = httpx.get(f"{serve.url}/readyz", timeout=5)
            return answer.json()["detail"] if answer.status_code == 503 else None

        # (Twice the busy timeout when a lease renewal took the writer's queue first.)
        detail = wait_for(unready, timeout=2 * BUSY_TIMEOUT_SECONDS + 20, message="/readyz 503")
        assert "cannot claim runs: store_error" in detail
        assert serve.proc.poll() is None
        held = time.monotonic() - locked_at
        assert held >= BUSY_TIMEOUT_SECONDS  # the lock outlasted the busy timeout
        # A run submitted while the database is still locked: it waits for the lock.
        body = {"agent": "locked", "input": "x", "idempotency_key": uuid.uuid4().hex}
        submit = Submit(client, body)
        submit.start()
        locker.stdin.write("release\n")
        locker.stdin.flush()
        assert locker.stdout.readline().strip() == "released"
    finally:
        locker.kill()
        locker.wait()

    submit.join(120)
    answer = submit.response
    assert answer is not None and answer.status_code == 201, answer
    run_id = answer.json()["id"]

    def ended(run: str) -> str | None:
        found = client.get(f"/v1/tasks/{run}").json()["state"]
        return found if found in ("succeeded", "failed", "dead_letter") else None

    assert wait_for(lambda: ended(run_id), timeout=30, message="the run to end") == "succeeded"
    assert wait_for(lambda: ended(inflight), timeout=30, message="the run to end") == "succeeded"
    wait_for(lambda: httpx.get(f"{serve.url}/readyz").status_code == 200, message="ready again")
    metrics = httpx.get(f"{serve.url}/metrics").text
    assert (sample(metrics, "corral_worker_errors_total", operation="claim") or 0) >= 1
    assert sample(metrics, "corral_worker_errors_total", operation="retention") == 0

    code, stderr = serve.terminate()
    assert code == 0, stderr
    assert "cannot claim runs" in stderr and "can claim runs again" in stderr
    assert "Traceback" not in stderr, stderr


# --------------------------------------------------------------------------- PostgreSQL


#: a run of agent ``pg``: one tool call of ``seconds``, then an answer (tried up to 10 times)
def pg_resources(seconds: float) -> str:
    turns = [echo_turn("hi", seconds), "{text: done}"]
    return idempotent(resources("pg", turns, extra="  max_attempts: 10\n"))


class WorkerProcess:
    """``corral worker --metrics-port`` on the store at ``url``."""

    def __init__(self, home: Path, url: str) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        env.update(CORRAL_HOME=str(home), CORRAL_DB_URL=url)
        args = ["--metrics-port", str(self.port), "--poll-seconds", "0.1"]
        args += ["--lease-seconds", "3", "--grace-seconds", "1"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "corral", "worker", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def health(self) -> httpx.Response | None:
        assert self.proc.poll() is None, self.stop()
        try:
            return httpx.get(f"{self.url}/healthz", timeout=5)
        except httpx.TransportError:
            return None

    async def wait_health(self, status: int, timeout: float = 30.0) -> httpx.Response:
        """Poll ``/healthz`` until it answers ``status``."""
        with anyio.fail_after(timeout):
            while True:
                answer = await anyio.to_thread.run_sync(self.health)
                if answer is not None and answer.status_code == status:
                    return answer
                await anyio.sleep(0.05)

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=5).text

    def stop(self) -> str:
        """SIGTERM; its stderr once it exited (killed after 30 s)."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            _, stderr = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, stderr = self.proc.communicate()
        return stderr


async def submit_runs(store: Store, count: int) -> list[str]:
    return [(await submit_run(store, "pg", f"run {i}"))[0].id for i in range(count)]


async def wait_succeeded(store: Store, ids: list[str], timeout: float = 60.0) -> None:
    """Until every run of ``ids`` succeeded; fails at once if one ended otherwise."""
    with anyio.fail_after(timeout):
        for run_id in ids:
            while True:
                record = await store.get_run(run_id)
                assert record is not None
                if record.state is RunState.SUCCEEDED:
                    break
                assert not record.state.finished, (run_id, record.state, record.error)
                await anyio.sleep(0.05)


async def wait_running(store: Store) -> None:
    with anyio.fail_after(30):
        while not (await store.list_runs("default", states=[RunState.RUNNING])):
            await anyio.sleep(0.02)


async def test_a_worker_outlives_its_postgresql_backends_being_terminated(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    database = postgres.create(migrated=True)
    url = postgres.url(database)
    store = await open_store(url)
    worker: WorkerProcess | None = None
    terminate = (
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
        f" WHERE datname = '{database}' AND pid <> pg_backend_pid()"
    )
    try:
        await store.apply(load_text(pg_resources(0.5), "pg.yaml"))
        worker = WorkerProcess(tmp_path, url)
        await worker.wait_health(200)
        ids = await submit_runs(store, 4)
        await wait_running(store)

        # Every backend of the database terminated again and again, with runs in flight;
        # then no connection allowed either, until the worker says it cannot claim.
        terminated = 0
        for _ in range(20):
            terminated += int((await postgres.admin(terminate))[0][0])
            await anyio.sleep(0.05)
        await postgres.admin(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        try:
            with anyio.fail_after(30):
                while True:
                    terminated += int((await postgres.admin(terminate))[0][0])
                    answer = await anyio.to_thread.run_sync(worker.health)
                    if answer is not None and answer.status_code == 503:
                        break
                    await anyio.sleep(0.05)
            # Its metrics are scraped meanwhile: the store's gauges say they are stale.
            down = httpx.get(f"{worker.url}/metrics", timeout=30)
            assert down.status_code == 200
            assert sample(down.text, "corral_store_up") == 0
            assert (sample(down.text, "corral_worker_errors_total", operation="claim") or 0) >= 1
        finally:
            await postgres.admin(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        assert terminated > 0
        assert answer.json()["status"] == "not_ready"
        assert "cannot claim runs: store_error" in answer.json()["detail"]

        ids += await submit_runs(store, 2)
        await wait_succeeded(store, ids)
        await worker.wait_health(200)
        errors = sample(worker.metrics(), "corral_worker_errors_total", operation="claim")
        assert errors is not None and errors >= 1
        assert sample(worker.metrics(), "corral_store_up") == 1
    finally:
        stderr = worker.stop() if worker is not None else ""
        await store.close()
        postgres.drop(database)
    assert "Traceback" not in stderr, stderr
    assert "can claim runs again" in stderr


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    private = PrivateCluster()
    try:
        private.start()
        yield private
    finally:
        private.remove()


async def test_a_worker_outlives_a_restart_and_a_stop_of_the_postgresql_server(
    tmp_path: Path, cluster: PrivateCluster
) -> None:
    url = cluster.url()
    store = await open_store(url)
    worker: WorkerProcess | None = None
    try:
        await store.apply(load_text(pg_resources(1.0), "pg.yaml"))
        worker = WorkerProcess(tmp_path, url)
        await worker.wait_health(200)

        # A restart of the server process with runs in flight.
        ids = await submit_runs(store, 4)
        await wait_running(store)
        await anyio.to_thread.run_sync(cluster.restart)
        ids += await submit_runs(store, 2)
        await wait_succeeded(store, ids)

        # Stopped for as long as it takes the worker to say it cannot claim, then back.
        ids += await submit_runs(store, 2)
        await wait_running(store)
        await anyio.to_thread.run_sync(cluster.stop)
        answer = await worker.wait_health(503)
        assert "cannot claim runs: store_error" in answer.json()["detail"]
        await anyio.to_thread.run_sync(cluster.start)
        ids += await submit_runs(store, 1)
        await wait_succeeded(store, ids)
        await worker.wait_health(200)
    finally:
        stderr = worker.stop() if worker is not None else ""
        await store.close()
    assert "Traceback" not in stderr, stderr
