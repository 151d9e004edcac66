"""The durable-run commands as a user types them: real processes on one store.

Every test runs twice (:mod:`backends`): on the embedded SQLite store, and on
PostgreSQL + NATS JetStream (``CORRAL_DB_URL`` and ``CORRAL_NATS_URL`` set), where
``corral submit`` and ``corral approvals approve`` announce runs on NATS and the
worker takes them from its deliveries, sweeping the store only when it starts.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from backends import NO_SWEEP, Deployment, deployment_fixture
from cli_harness import invoke
from databases import delete_run, in_thread, rows_of
from nats_servers import nats_prefix_fixture, nats_server_url_fixture
from test_cli_run import CALC

__all__ = ["deployment_fixture", "nats_prefix_fixture", "nats_server_url_fixture"]

CORRAL = [sys.executable, "-m", "corral"]


def corral(
    deployment: Deployment, *args: str, check: int | None = None
) -> subprocess.CompletedProcess[str]:
    proc = invoke(args, deployment.environment())
    if check is not None:
        assert proc.returncode == check, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def apply(deployment: Deployment, tmp_path: Path, text: str) -> None:
    path = tmp_path / "resources.yaml"
    path.write_text(text)
    corral(deployment, "apply", "-f", str(path), check=0)


def state(deployment: Deployment, run_id: str) -> str:
    record = json.loads(corral(deployment, "tasks", "get", run_id, "-o", "json", check=0).stdout)
    return str(record["state"])


def wait_for(deployment: Deployment, state: str, *run_ids: str, timeout: float = 30.0) -> None:
    """Wait until the runs are all in ``state``, looking in the store directly while the
    worker runs: a ``corral`` process per look takes seconds on a busy machine."""
    deadline = time.monotonic() + timeout
    while True:
        rows = in_thread(lambda: rows_of(deployment.db_url, "SELECT id, state FROM runs"))
        states = {str(run_id): str(found) for run_id, found in rows}
        if all(states.get(run_id) == state for run_id in run_ids):
            return
        assert time.monotonic() < deadline, f"not all {state} after {timeout} s: {states}"
        time.sleep(0.1)


def test_submit_approve_and_a_worker_finish_the_run(deployment: Deployment, tmp_path: Path) -> None:
    apply(
        deployment,
        tmp_path,
        CALC.replace("tools: [add]", "tools: [add]\n  approval: {policy: always}"),
    )

    run_id = corral(deployment, "submit", "calc", "What is 2 + 3?", check=0).stdout.strip()
    assert run_id.startswith("run_") and state(deployment, run_id) == "queued"

    # `corral run` of another task waits for approval: exit code 3.
    waiting = corral(deployment, "run", "calc", "and again?", "-o", "json")
    assert waiting.returncode == 3
    other = json.loads(waiting.stdout)["id"]

    # With NATS the worker sweeps the store once, as it starts: the runs the approvals
    # queue again can only reach it as deliveries.
    poll = str(NO_SWEEP) if deployment.dispatches else "0.1"
    worker = subprocess.Popen(
        [*CORRAL, "worker", "--poll-seconds", poll, "--grace-seconds", "1"],
        env=deployment.environment(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(deployment, "waiting_approval", run_id)
        listed = json.loads(corral(deployment, "approvals", "list", "-o", "json", check=0).stdout)
        assert {a["run_id"] for a in listed} == {run_id, other}
        assert {a["tool"] for a in listed} == {"add"}
        record = json.loads(
            corral(deployment, "tasks", "get", run_id, "-o", "json", check=0).stdout
        )
        assert record["pending_approvals"][0]["tool"] == "add"

        for approval_id in (a["id"] for a in listed):
            decided = corral(deployment, "approvals", "approve", approval_id, check=0).stdout
            assert "approved" in decided
        wait_for(deployment, "succeeded", run_id, other)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            _, stderr = worker.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.communicate()
            raise
    assert worker.returncode == 0, stderr
    if deployment.dispatches:
        # Three executions: the submitted run until its approval (taken by the sweep at
        # start or by the delivery of its submit), then both runs after theirs.
        found = re.search(r"(\d+) runs taken from bus deliveries, (\d+) found by the store", stderr)
        assert found is not None, stderr
        delivered, swept = int(found[1]), int(found[2])
        assert delivered + swept == 3 and swept <= 1, stderr

    logs = corral(deployment, "logs", run_id, check=0)
    assert "→ add" in logs.stdout and "⏸ add waits for approval" in logs.stdout
    assert "2 + 3 = 5" in logs.stdout
    events = [
        json.loads(line)
        for line in corral(deployment, "logs", run_id, "-o", "json").stdout.split("\n")
        if line
    ]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["type"] == "run.finish"

    tasks = json.loads(
        corral(deployment, "tasks", "list", "--state", "succeeded", "-o", "json").stdout
    )
    assert {t["id"] for t in tasks} == {run_id, other}
    gc = corral(deployment, "gc", "--keep", "0", check=0)
    assert gc.stdout.strip() == "deleted 2 finished runs"
    assert corral(deployment, "tasks", "get", run_id).returncode == 2


def test_idempotent_submit_and_cancel(deployment: Deployment, tmp_path: Path) -> None:
    apply(deployment, tmp_path, CALC)
    first = corral(deployment, "submit", "calc", "hi", "--idempotency-key", "k", check=0)
    again = corral(deployment, "submit", "calc", "hi", "--idempotency-key", "k", check=0)
    assert first.stdout == again.stdout and "seen before" in again.stderr
    run_id = first.stdout.strip()
    cancelled = corral(deployment, "tasks", "cancel", run_id, check=0)
    assert cancelled.stdout.strip() == f"{run_id} cancelled"
    assert state(deployment, run_id) == "cancelled"
    assert corral(deployment, "submit", "nobody", "hi").returncode == 2


def test_sessions_carry_runs_and_can_be_listed_shown_and_deleted(
    deployment: Deployment, tmp_path: Path
) -> None:
    apply(deployment, tmp_path, CALC)
    corral(deployment, "run", "calc", "What is 2 + 3?", "--session", "s1", check=0)
    listed = corral(deployment, "sessions", "list", check=0).stdout.splitlines()
    assert [line.split()[:2] for line in listed] == [["ID", "AGENT"], ["s1", "calc"]]
    shown = corral(deployment, "sessions", "show", "s1", check=0).stdout
    assert "[user] What is 2 + 3?" in shown and "[assistant] 2 + 3 = 5" in shown
    corral(deployment, "sessions", "delete", "s1", check=0)
    assert corral(deployment, "sessions", "show", "s1").returncode == 2


def test_following_a_run_deleted_meanwhile_fails_as_not_found(
    deployment: Deployment, tmp_path: Path
) -> None:
    apply(
        deployment,
        tmp_path,
        CALC.replace("tools: [add]", "tools: [add]\n  approval: {policy: always}"),
    )
    waiting = corral(deployment, "run", "calc", "What is 2 + 3?", "-o", "json", check=3)
    run_id = json.loads(waiting.stdout)["id"]
    [approval] = json.loads(corral(deployment, "approvals", "list", "-o", "json").stdout)
    corral(deployment, "approvals", "approve", approval["id"], check=0)  # queued: no worker here

    follower = subprocess.Popen(
        [*CORRAL, "logs", run_id, "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**deployment.environment(), "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert follower.stdout is not None
        for line in follower.stdout:  # the events so far: it follows the queued run now
            if "waits for approval" in line:
                break
        in_thread(lambda: delete_run(deployment.db_url, run_id))
        _, stderr = follower.communicate(timeout=60)
    finally:
        follower.kill()
    assert (follower.returncode, stderr.splitlines()) == (2, [f"error: task '{run_id}' not found"])
