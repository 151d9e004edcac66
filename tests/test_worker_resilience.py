"""Workers outlive their store: a locked SQLite file, terminated PostgreSQL backends, a
PostgreSQL server that stops and restarts.

Each test runs the real programs - ``corral serve`` or ``corral worker`` in a
subprocess - against a real database, breaks the database from outside, and
checks that the worker said so (readiness 503 naming the failing operation,
the error counter) and then finished every run without being restarted.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from corral.core.runs import RunState
from corral.resources.loader import load_text
from corral.runtime.local import submit as submit_run
from corral.store import Store, open_store
from corral.store.sql import BUSY_TIMEOUT_SECONDS
from databases import PostgresServer
from postgres_cluster import PrivateCluster
from server_harness import apply, echo_turn, resources, wait_for
from test_server_shutdown import ServeProcess
from test_worker_metrics import free_port

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


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus exposition text, ``None`` when absent."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{re.escape(name)}" + (rf"\{{{re.escape(wanted)}\}}" if labels else "")
    for line in text.splitlines():
        match = re.match(pattern + r" (\S+)$", line)
        if match:
            return float(match.group(1))
    return None


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    server = ServeProcess(tmp_path / "home", grace_seconds=5)
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
    ready = httpx.get(f"{serve.url}/readyz")
    assert ready.status_code == 200, ready.text

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
        body = {"agent": "locked", "input": "x", "idempotency_key": uuid.uuid4().hex}
        submit = Submit(client, body)
        submit.start()

        # The worker's claim waits out the busy timeout, fails, and readiness says so.
        def unready() -> str | None:
            answer = httpx.get(f"{serve.url}/readyz", timeout=5)
            return answer.json()["detail"] if answer.status_code == 503 else None

        # (Twice the busy timeout when the submit took the lock queue first and failed alone.)
        detail = wait_for(unready, timeout=2 * BUSY_TIMEOUT_SECONDS + 20, message="/readyz 503")
        assert "cannot claim runs: store_error" in detail
        assert serve.proc.poll() is None
        held = time.monotonic() - locked_at
        assert held >= BUSY_TIMEOUT_SECONDS  # the lock outlasted the busy timeout
        locker.stdin.write("release\n")
        locker.stdin.flush()
        assert locker.stdout.readline().strip() == "released"
    finally:
        locker.kill()
        locker.wait()

    submit.join(120)
    answer = submit.response
    assert answer is not None
    if answer.status_code == 503:  # it shared the claim's failed transaction: say so, retry
        assert answer.json()["code"] == "store_unavailable"
        assert answer.headers["Retry-After"] == "1"
        answer = client.post("/v1/tasks", json=body)
    assert answer.status_code == 201, answer.text
    run_id = answer.json()["id"]

    def state() -> str | None:
        found = client.get(f"/v1/tasks/{run_id}").json()["state"]
        return found if found in ("succeeded", "failed", "dead_letter") else None

    assert wait_for(state, timeout=30, message="the run to end") == "succeeded"
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
    return resources("pg", [echo_turn("hi", seconds), "{text: done}"], extra="  max_attempts: 10\n")


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
