"""The durable-run commands as a user types them: real processes on one SQLite store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_cli_run import CALC, corral

CORRAL = [sys.executable, "-m", "corral"]


def apply(home: Path, tmp_path: Path, text: str) -> None:
    path = tmp_path / "resources.yaml"
    path.write_text(text)
    corral(home, "apply", "-f", str(path), check=0)


def state(home: Path, run_id: str) -> str:
    record = json.loads(corral(home, "tasks", "get", run_id, check=0).stdout)
    return str(record["state"])


def test_submit_approve_and_a_worker_finish_the_run(tmp_path: Path) -> None:
    home = tmp_path / "home"
    apply(
        home, tmp_path, CALC.replace("tools: [add]", "tools: [add]\n  approval: {policy: always}")
    )

    run_id = corral(home, "submit", "calc", "What is 2 + 3?", check=0).stdout.strip()
    assert run_id.startswith("run_") and state(home, run_id) == "queued"

    # `corral run` of another task waits for approval: exit code 3.
    waiting = corral(home, "run", "calc", "and again?", "-o", "json")
    assert waiting.returncode == 3
    other = json.loads(waiting.stdout)["id"]

    env = {**os.environ, "CORRAL_HOME": str(home)}
    worker = subprocess.Popen(
        [*CORRAL, "worker", "--poll-seconds", "0.1", "--grace-seconds", "1"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while state(home, run_id) != "waiting_approval":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        listed = json.loads(corral(home, "approvals", "list", "-o", "json", check=0).stdout)
        assert {a["run_id"] for a in listed} == {run_id, other}
        assert {a["tool"] for a in listed} == {"add"}
        record = json.loads(corral(home, "tasks", "get", run_id, check=0).stdout)
        assert record["pending_approvals"][0]["tool"] == "add"

        for approval_id in (a["id"] for a in listed):
            decided = corral(home, "approvals", "approve", approval_id, check=0).stdout
            assert "approved" in decided
        while state(home, run_id) != "succeeded" or state(home, other) != "succeeded":
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=15) == 0, worker.stderr.read() if worker.stderr else ""

    logs = corral(home, "logs", run_id, check=0)
    assert "→ add" in logs.stdout and "⏸ add waits for approval" in logs.stdout
    assert "2 + 3 = 5" in logs.stdout
    events = [
        json.loads(line)
        for line in corral(home, "logs", run_id, "-o", "json").stdout.split("\n")
        if line
    ]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["type"] == "run.finish"

    tasks = json.loads(corral(home, "tasks", "list", "--state", "succeeded", "-o", "json").stdout)
    assert {t["id"] for t in tasks} == {run_id, other}
    assert corral(home, "gc", "--keep", "0", check=0).stdout.strip() == "deleted 2 finished runs"
    assert corral(home, "tasks", "get", run_id).returncode == 2


def test_idempotent_submit_and_cancel(tmp_path: Path) -> None:
    home = tmp_path / "home"
    apply(home, tmp_path, CALC)
    first = corral(home, "submit", "calc", "hi", "--idempotency-key", "k", check=0)
    again = corral(home, "submit", "calc", "hi", "--idempotency-key", "k", check=0)
    assert first.stdout == again.stdout and "seen before" in again.stderr
    run_id = first.stdout.strip()
    assert corral(home, "tasks", "cancel", run_id, check=0).stdout.strip() == f"{run_id} cancelled"
    assert state(home, run_id) == "cancelled"
    assert corral(home, "submit", "nobody", "hi").returncode == 2


def test_sessions_carry_runs_and_can_be_listed_shown_and_deleted(tmp_path: Path) -> None:
    home = tmp_path / "home"
    apply(home, tmp_path, CALC)
    corral(home, "run", "calc", "What is 2 + 3?", "--session", "s1", check=0)
    assert "s1\tcalc" in corral(home, "sessions", "list", check=0).stdout
    shown = corral(home, "sessions", "show", "s1", check=0).stdout
    assert "[user] What is 2 + 3?" in shown and "[assistant] 2 + 3 = 5" in shown
    corral(home, "sessions", "delete", "s1", check=0)
    assert corral(home, "sessions", "show", "s1").returncode == 2
