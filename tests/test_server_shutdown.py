"""SIGTERM to a real ``corral serve`` process with a run in flight: it drains and exits 0.

Within the grace period the run finishes; past it the run is released, and the
next server (another worker) finishes it. Open event streams end at once, so the
HTTP side never holds the shutdown.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.core.runs import RunRecord
from corral.store import open_store
from server_harness import apply, echo_turn, resources, sse_messages, wait_for


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServeProcess:
    """``python -m corral serve`` on a free port over ``home``."""

    def __init__(self, home: Path, grace_seconds: float, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        env = {**os.environ, "CORRAL_HOME": str(home), **(env or {})}
        env.pop("CORRAL_DB_URL", None)
        self.home = home
        options = ["--port", str(self.port), "--workers", "2", "--lease-seconds", "3"]
        options += ["--grace-seconds", str(grace_seconds), "--poll-seconds", "0.05"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "corral", "serve", *options],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        wait_for(self._ready, timeout=30, message="corral serve to be ready")
        self.token = (home / "admin.token").read_text().strip()

    def _ready(self) -> bool:
        assert self.proc.poll() is None, self.proc.communicate()[1]
        try:
            return httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=30
        )

    def terminate(self) -> tuple[int, str]:
        """SIGTERM, then the exit code and stderr once it has exited."""
        self.proc.send_signal(signal.SIGTERM)
        _, stderr = self.proc.communicate(timeout=40)
        return self.proc.returncode, stderr

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def started(home: Path) -> Iterator[list[ServeProcess]]:
    processes: list[ServeProcess] = []
    yield processes
    for process in processes:
        process.kill()


def stored_run(home: Path, run_id: str) -> RunRecord:
    async def read() -> RunRecord:
        store = await open_store(f"sqlite:///{home / 'corral.db'}")
        try:
            record = await store.get_run(run_id)
        finally:
            await store.close()
        assert record is not None
        return record

    return asyncio.run(read())


def start_follower(server: ServeProcess, run_id: str) -> tuple[threading.Thread, list[Any]]:
    """A thread following the run's event stream; the list gets its messages, then 'closed'."""
    received: list[Any] = []

    def follow() -> None:
        with (
            server.client() as client,
            client.stream(
                "GET", f"/v1/runs/{run_id}/events", headers={"Accept": "text/event-stream"}
            ) as resp,
        ):
            received.extend(m for m in sse_messages(resp.iter_lines()) if "event" in m)
        received.append("closed")

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    return thread, received


def in_flight(client: httpx.Client, run_id: str) -> bool:
    events = client.get(f"/v1/runs/{run_id}/events").json()["items"]
    return any(e["type"] == "tool.call" for e in events)


def test_sigterm_lets_the_in_flight_run_finish_and_exits_0(
    home: Path, started: list[ServeProcess]
) -> None:
    server = ServeProcess(home, grace_seconds=20)
    started.append(server)
    with server.client() as client:
        apply(client, resources("drained", [echo_turn("slow", 2.0), "{text: finished}"]))
        run_id = client.post("/v1/tasks", json={"agent": "drained", "input": "x"}).json()["id"]
        follower, received = start_follower(server, run_id)
        wait_for(lambda: in_flight(client, run_id), message="the tool call to start")
        # (its stream open: the shutdown is to close it, not to refuse its connection)
        wait_for(lambda: bool(received), message="the follower's stream to open")

    signalled = time.monotonic()
    code, stderr = server.terminate()
    assert code == 0, stderr
    # The first start printed the admin token once and left it for its owner only.
    assert server.token in stderr
    assert stat.S_IMODE((home / "admin.token").stat().st_mode) == 0o600
    follower.join(5)
    assert received[-1] == "closed"
    assert all(m["event"] != "end" for m in received[:-1]), "the stream ended with the server"
    record = stored_run(home, run_id)
    assert (record.state.value, record.output) == ("succeeded", "finished")
    assert time.monotonic() - signalled < 15


def test_past_the_grace_period_the_run_is_released_and_the_next_server_finishes_it(
    home: Path, started: list[ServeProcess]
) -> None:
    first = ServeProcess(home, grace_seconds=0.2)
    started.append(first)
    idempotent = resources("released", [echo_turn("slow", 2.0), "{text: resumed}"]).replace(
        "timeout_seconds: 60", "timeout_seconds: 60\n  idempotent: true"
    )
    with first.client() as client:
        apply(client, idempotent)
        run_id = client.post("/v1/tasks", json={"agent": "released", "input": "x"}).json()["id"]
        wait_for(lambda: in_flight(client, run_id), message="the tool call to start")

    signalled = time.monotonic()
    code, stderr = first.terminate()
    assert code == 0, stderr
    assert time.monotonic() - signalled < 1.5, "the release waited for the tool"
    record = stored_run(home, run_id)
    assert (record.state.value, record.lease_owner) == ("queued", None)

    second = ServeProcess(home, grace_seconds=20)
    started.append(second)
    with second.client() as client:
        settled = wait_for(
            lambda: client.get(f"/v1/tasks/{run_id}").json()["state"] == "succeeded",
            timeout=30,
            message="the released run to finish",
        )
        assert settled
        assert client.get(f"/v1/tasks/{run_id}").json()["output"] == "resumed"
