"""`corral logs`, approvals acted on where they happen, `run --wait` and Ctrl-C in `corral run`:
real `corral` processes on one SQLite store, as a user meets them."""

from __future__ import annotations

import getpass
import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

from test_cli_run import CALC, CORRAL, TESTS, corral

APPROVE = CALC.replace("tools: [add]", "tools: [add]\n  approval: {policy: always}")
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def environment(home: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "CORRAL_HOME": str(home), "PYTHONUNBUFFERED": "1", **extra}
    env.pop("CORRAL_DB_URL", None)
    env.pop("CORRAL_NATS_URL", None)
    return env


def applied(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "resources.yaml"
    path.write_text(text)
    home = tmp_path / "home"
    corral(home, "apply", "-f", str(path), check=0)
    return home


def task(home: Path, run_id: str) -> dict[str, Any]:
    return dict(json.loads(corral(home, "tasks", "get", run_id, "-o", "json", check=0).stdout))


def only_task(home: Path) -> str:
    [listed] = json.loads(corral(home, "tasks", "list", "-o", "json", check=0).stdout)
    return str(listed["id"])


def pending_approval(home: Path) -> dict[str, Any]:
    [approval] = json.loads(corral(home, "approvals", "list", "-o", "json", check=0).stdout)
    return dict(approval)


def events(home: Path, run_id: str) -> list[dict[str, Any]]:
    lines = corral(home, "logs", run_id, "-o", "json", check=0).stdout.splitlines()
    return [json.loads(line) for line in lines if line]


def stop(process: subprocess.Popen[str]) -> str:
    """SIGTERM a worker; its stderr."""
    process.send_signal(signal.SIGTERM)
    try:
        _, stderr = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    assert process.returncode == 0, stderr
    return stderr


def test_a_run_stopped_for_approval_names_the_approval_and_the_commands(tmp_path: Path) -> None:
    home = applied(tmp_path, APPROVE)
    ran = corral(home, "run", "calc", "What is 2 + 3?", check=3)
    run_id = only_task(home)
    approval = pending_approval(home)["id"]
    assert f"approval {approval}: add(" in ran.stderr
    assert f"approve: corral approvals approve {approval}\n" in ran.stderr
    assert f'reject:  corral approvals reject {approval} --reason "..."' in ran.stderr
    assert f"corral logs -f {run_id}" in ran.stderr

    # nothing runs the run once approved: the command says so, and what to start
    decided = corral(home, "approvals", "approve", approval, check=0)
    assert decided.stdout == f"{approval} approved (run {run_id})\n"
    assert (
        f"run {run_id} queued; no worker has picked it up yet: start `corral worker` or "
        "`corral serve`"
    ) in decided.stderr
    assert task(home, run_id)["state"] == "queued"

    worker = subprocess.Popen(
        [*CORRAL, "worker", "--poll-seconds", "0.1", "--grace-seconds", "1"],
        env=environment(home),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        followed = corral(home, "logs", run_id, "--follow", "--timestamps")
    finally:
        stderr = stop(worker)
    assert followed.returncode == 0, followed.stderr
    lines = followed.stdout.splitlines()
    assert all(re.match(STAMP + " ", line) for line in lines), lines
    user = re.escape(getpass.getuser())
    assert any("⏸ add waits for approval" in line for line in lines)
    assert any(re.search(rf"✓ add approved by {user} at {STAMP}$", line) for line in lines)
    assert re.search(rf"succeeded · 2 step\(s\) · \d+\+\d+ tokens {run_id}$", lines[-1])
    # the worker's line for the run: agent, state, duration
    assert re.search(rf"run {run_id} \(agent calc\): succeeded in \d+\.\d\d s, 2 step", stderr)
    assert "stopped: 1 runs executed, 0 released to other workers" in stderr


def test_run_wait_follows_the_run_after_the_decision(tmp_path: Path) -> None:
    home = applied(tmp_path, APPROVE)
    running = subprocess.Popen(
        [*CORRAL, "run", "calc", "What is 2 + 3?", "--wait"],
        env=environment(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert running.stderr is not None
        seen: list[str] = []
        found = None
        for line in running.stderr:  # the hint, and that it waits
            seen.append(line)
            found = found or re.search(r"approve: corral approvals approve (\S+)", line)
            if "waiting for the decision" in line:
                break
        assert found is not None and "waiting for the decision" in seen[-1], "".join(seen)
        corral(home, "approvals", "reject", found[1], "--reason", "not now", check=0)
        stdout, rest = running.communicate(timeout=60)
    finally:
        running.kill()
    stderr = "".join(seen) + rest
    assert running.returncode == 0, stderr
    assert "2 + 3 = 5" in stdout
    user = re.escape(getpass.getuser())
    assert re.search(rf"✗ add rejected by {user} at {STAMP}: not now", stderr)
    assert re.search(r"^succeeded · 2 step\(s\)", stderr, re.M)


MODELS_AND_TOOLS = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: {name}}}
spec:
  provider: scripted
  script:
    - tool_calls: [{{name: add, arguments: {{a: 2, b: 3}}}}]
    - text: "2 + 3 = 5"
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: {name}}}
spec:
  model: {name}
  tools: [add]
{extra}
"""

DEAD = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: dead}
spec:
  provider: openai
  model: gpt-test
  base_url: http://127.0.0.1:9/v1
  timeout_seconds: 2
  retry: {max_attempts: 1}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: doomed}
spec: {model: dead, max_attempts: 2}
"""


def test_logs_follow_exits_as_run_does_and_ends_with_the_final_state(tmp_path: Path) -> None:
    home = applied(
        tmp_path,
        "---".join(
            [
                CALC,
                MODELS_AND_TOOLS.format(name="careful", extra="  approval: {policy: always}"),
                MODELS_AND_TOOLS.format(name="brief", extra="  limits: {max_steps: 1}"),
                DEAD,
            ]
        ),
    )

    def run(agent: str, code: int) -> str:
        out = corral(home, "run", agent, "What is 2 + 3?", "-o", "json", check=code)
        return str(json.loads(out.stdout)["id"])

    succeeded, waiting, failed = run("calc", 0), run("careful", 3), run("brief", 1)
    dead = run("doomed", 1)  # two attempts, a backoff between them
    cancelled = corral(home, "submit", "calc", "never mind", check=0).stdout.strip()
    corral(home, "tasks", "cancel", cancelled, check=0)

    expected = {succeeded: 0, waiting: 3, failed: 1, dead: 1, cancelled: 1}
    shown = {}
    for run_id, code in expected.items():
        followed = corral(home, "logs", run_id, "-f")
        assert followed.returncode == code, (run_id, followed.stdout, followed.stderr)
        shown[run_id] = followed.stdout
        # without --follow the story is the same and the exit code is 0
        assert corral(home, "logs", run_id, check=0).stdout == followed.stdout

    def last(run_id: str) -> str:
        return shown[run_id].splitlines()[-1]

    assert last(succeeded).startswith("succeeded · 2 step(s)")
    assert "2 + 3 = 5" in shown[succeeded] and "▶ calc What is 2 + 3?" in shown[succeeded]
    approval = pending_approval(home)["id"]
    assert f"approve: corral approvals approve {approval}" in shown[waiting]
    assert any(
        line.startswith("waiting_approval · 1 step(s)") for line in shown[waiting].splitlines()
    )
    assert "✗ " in shown[failed]
    assert last(failed).startswith("failed · ") and "budget_exceeded" in last(failed)
    assert re.search(
        r"↻ run: retry 2/2 in \d+\.\d s: model endpoint 'dead'.*\(model_unreachable\)", shown[dead]
    ), shown[dead]
    assert last(dead).startswith("dead_letter · ") and last(dead).endswith(dead)
    assert last(cancelled).startswith("cancelled · 0 step(s)")


def test_logs_show_the_retries_of_a_model_endpoint_and_of_a_tool(tmp_path: Path) -> None:
    from corral.testing.fake_openai import FakeOpenAIServer, FakeReply, FakeToolCall

    with FakeOpenAIServer() as server:
        server.fail(503, times=1, message="overloaded")
        server.add_reply(
            FakeReply(tool_calls=[FakeToolCall("flaky", {"note": "hi"})]), FakeReply(text="done")
        )
        home = applied(
            tmp_path,
            f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: fake}}
spec:
  provider: openai
  model: m
  base_url: "{server.base_url}"
  retry: {{max_attempts: 3, initial_backoff_seconds: 0.01}}
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: flaky}}
spec:
  type: python
  python: {{function: "agent_tools:flaky", path: "{TESTS}"}}
  retry: {{max_attempts: 3, initial_backoff_seconds: 0.01}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: patient}}
spec: {{model: fake, tools: [flaky]}}
""",
        )
        proc = subprocess.run(
            [*CORRAL, "run", "patient", "note hi"],
            env=environment(home, CORRAL_TEST_FLAKY=str(tmp_path / "flaky.txt")),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr
    run_id = only_task(home)
    shown = corral(home, "logs", run_id, check=0).stdout
    assert re.search(
        r"↻ fake: retry 2/3 in \d+\.\d s: model endpoint 'fake': HTTP 503: .*overloaded",
        shown,
    ), shown
    assert re.search(
        r"↻ flaky: retry 2/3 in \d+\.\d s: ConnectionError: 503 from "
        r"http://service.test/notes \(execution_failed\)",
        shown,
    ), shown
    assert "← flaky noted hi" in shown
    # the journal holds them: in the events' data, as the API serves them
    journal = events(home, run_id)
    [model_retry] = next(e for e in journal if e["type"] == "message.create")["data"]["retries"]
    assert (model_retry["retry"], model_retry["max_attempts"]) == (2, 3)
    assert model_retry["code"] == "model_error" and model_retry["retry_in"] >= 0
    result = next(e for e in journal if e["type"] == "tool.result")["data"]
    assert result["attempts"] == 2 and [r["retry"] for r in result["retries"]] == [2]
    assert result["retries"][0]["code"] == "execution_failed"
    assert (tmp_path / "flaky.txt").read_text() == "hi\nhi\n"


NAPPING = f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: sleepy}}
spec:
  provider: scripted
  script:
    - tool_calls: [{{name: nap, arguments: {{seconds: 60}}}}]
    - text: "rested"
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: nap}}
spec:
  type: python
  python: {{function: "agent_tools:nap", path: "{TESTS}"}}
  timeout_seconds: 120
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: napper}}
spec: {{model: sleepy, tools: [nap]}}
"""


def test_ctrl_c_in_run_releases_the_run_and_says_how_to_follow_it(tmp_path: Path) -> None:
    home = applied(tmp_path, NAPPING)
    running = subprocess.Popen(
        [*CORRAL, "run", "napper", "take a nap"],
        env=environment(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert running.stderr is not None
        seen: list[str] = []
        for line in running.stderr:  # the tool is running (in its thread, for 60 s)
            seen.append(line)
            if line.startswith("→ nap"):
                break
        assert seen and seen[-1].startswith("→ nap"), "".join(seen)
        running.send_signal(signal.SIGINT)
        _, rest = running.communicate(timeout=30)  # not the 60 s of the tool
    finally:
        running.kill()
    stderr = "".join(seen) + rest
    run_id = only_task(home)
    assert running.returncode == 130, stderr
    assert f"interrupted: run {run_id} is queued again with its journal" in stderr
    assert f"follow it: corral logs -f {run_id}" in stderr
    assert f"cancel it: corral tasks cancel {run_id}" in stderr
    assert "Traceback" not in stderr
    stored = task(home, run_id)
    # released for any worker: no lease left, the attempt given back
    assert (stored["state"], stored["lease_owner"], stored["attempts"]) == ("queued", None, 0)
    assert [e["type"] for e in events(home, run_id)][-1] == "tool.call"


ESCAPES = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: sly}
spec:
  provider: scripted
  script:
    - text: "fine\\e]0;pwned\\a\\e[2J\\e[1A\\rhidden\\x9b31m tail"
---
apiVersion: corral/v1
kind: Agent
metadata: {name: "sly"}
spec: {model: sly}
"""


def test_terminal_escapes_a_model_writes_never_reach_the_terminal(tmp_path: Path) -> None:
    home = applied(tmp_path, ESCAPES)
    ran = corral(home, "run", "sly", "hi", check=0)
    run_id = only_task(home)
    shown = [
        ran.stdout + ran.stderr,
        corral(home, "logs", run_id, check=0).stdout,
        corral(home, "tasks", "describe", run_id, check=0).stdout,
    ]
    for text in shown:
        assert "fine" in text and "tail" in text, text
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", text), repr(text)
    # the machine forms keep the text exactly
    assert task(home, run_id)["output"] == "fine\x1b]0;pwned\x07\x1b[2J\x1b[1A\rhidden\x9b31m tail"
