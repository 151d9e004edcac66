"""``corral worker --metrics-port``: a standalone worker's Prometheus endpoint, scraped for real.

A real ``corral worker`` process on a SQLite store executes a run submitted by
``corral submit``; its ``/metrics`` then counts the run's model turns, tool
call and finish, and the store's figures; a taken port is a clear error.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from test_cli_run import CALC

CORRAL = [sys.executable, "-m", "corral"]


def environment(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_HOME"] = str(home)
    return env


def corral(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CORRAL, *args], capture_output=True, text=True, env=environment(home), timeout=120
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus exposition text, ``None`` when absent."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{re.escape(name)}" + (rf"\{{{re.escape(wanted)}\}}" if labels else "")
    for line in text.splitlines():
        match = re.match(pattern + r" (\S+)$", line)
        if match:
            return float(match.group(1))
    return None


def test_a_worker_serves_the_metrics_of_the_runs_it_executes(tmp_path: Path) -> None:
    (tmp_path / "calc.yaml").write_text(CALC)
    assert corral(tmp_path, "apply", "-f", str(tmp_path / "calc.yaml")).returncode == 0
    port = free_port()
    args = ["worker", "--poll-seconds", "0.05", "--metrics-port", str(port)]
    worker = subprocess.Popen(
        [*CORRAL, *args], env=environment(tmp_path), stderr=subprocess.PIPE, text=True
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:  # the endpoint comes up with the worker
            try:
                assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
                break
            except httpx.TransportError:
                assert worker.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        submitted = corral(tmp_path, "submit", "calc", "what is 2 + 3?")
        assert submitted.returncode == 0, submitted.stderr
        deadline = time.monotonic() + 60
        while True:
            text = httpx.get(f"{url}/metrics").text
            if sample(text, "corral_runs_finished_total", state="succeeded") == 1.0:
                break
            assert time.monotonic() < deadline, text
            time.sleep(0.1)
        assert sample(text, "corral_runs", state="succeeded") == 1.0  # the store's count
        assert sample(text, "corral_queue_depth") == 0.0
        assert sample(text, "corral_tool_calls_total", outcome="ok") == 1.0
        assert sample(text, "corral_model_latency_seconds_count") == 2.0  # two model turns

        # Another worker cannot take the same port: it says so and starts nothing.
        taken = corral(tmp_path, "worker", "--metrics-port", str(port))
        assert taken.returncode == 2
        assert f"cannot serve metrics on 127.0.0.1:{port}" in taken.stderr
    finally:
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr
    assert f"metrics on http://127.0.0.1:{port}/metrics" in stderr
