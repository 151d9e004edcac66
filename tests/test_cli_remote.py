"""The CLI's remote mode: the same commands, the same output and exit codes as embedded.

Every command runs twice as a user types it (in this process, through the app the
console script runs: tests/cli_harness.py): once embedded, on a store of its own (``CORRAL_HOME``), and once remote, with
``CORRAL_URL``/``CORRAL_TOKEN`` naming a ``corral serve`` subprocess and a
``CORRAL_HOME`` that must stay empty. Their stdout must match once ids,
timestamps and ages are made neutral, and so must their exit codes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from cli_harness import invoke
from corral.core.sessions import SESSION_ID_RULE
from test_cli_run import CALC

CORRAL = [sys.executable, "-m", "corral"]
TESTS = Path(__file__).parent


def agent(name: str, turns: list[str], *, approval: str = "never") -> str:
    """A scripted agent of its own (a server shares a live agent's script between runs)."""
    script = "\n".join(f"    - {turn}" for turn in turns)
    return f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: {name}-model}}
spec:
  provider: scripted
  script:
{script}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: {name}}}
spec:
  model: {name}-model
  tools: [add]
  approval: {{policy: {approval}}}
"""


ADD = "tool_calls: [{name: add, arguments: {a: 2, b: 3}}]"


@dataclass
class Mode:
    """How one mode runs ``corral``: its environment."""

    name: str
    env: dict[str, str]

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return invoke(args, self.env)

    def start(self, *args: str) -> Running:
        """A real ``corral`` process, for a command that runs on while the test acts."""
        process = subprocess.Popen(
            [*CORRAL, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        return Running(process, list(args))


@dataclass
class Running:
    """A ``corral`` process started, not yet waited for."""

    process: subprocess.Popen[str]
    args: list[str]

    def wait(self) -> subprocess.CompletedProcess[str]:
        stdout, stderr = self.process.communicate(timeout=120)
        return subprocess.CompletedProcess(self.args, self.process.returncode, stdout, stderr)


def _base_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_HOME"] = str(home)
    env["COLUMNS"] = "200"
    return env


@pytest.fixture(scope="module")
def modes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Mode, Mode, Path]]:
    root = tmp_path_factory.mktemp("remote")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server_home = root / "server"
    server = subprocess.Popen(
        [*CORRAL, "serve", "--port", str(port), "--workers", "2", "--poll-seconds", "0.1"],
        env=_base_env(server_home),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            assert time.monotonic() < deadline, "corral serve did not start"
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        token = (server_home / "admin.token").read_text().strip()
        embedded = Mode("embedded", _base_env(root / "embedded"))
        unused = root / "unused"
        remote = Mode("remote", {**_base_env(unused), "CORRAL_URL": url, "CORRAL_TOKEN": token})
        yield embedded, remote, unused
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


_ID = re.compile(r"\b(run|apr|tok|chat)_[0-9a-z]{20,32}\b")
_TIME = re.compile(r"\b1[0-9]{9}(\.[0-9]+)?\b|\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
_DURATION = re.compile(r'"duration_ms": [0-9.]+')
_RUN_TIME = re.compile(r"Duration: +\S+")
_PADDING = re.compile(r" {2,}|─+")
_AGE = re.compile(r"(?<![\w.])\d+[smhd]\b")


def neutral(text: str) -> str:
    """``text`` with ids numbered by first appearance, timestamps and ages blanked, and
    table padding made even."""
    seen: dict[str, str] = {}

    def number(match: re.Match[str]) -> str:
        return seen.setdefault(match.group(0), f"<{match.group(1)}{len(seen) + 1}>")

    text = _AGE.sub("<age>", _TIME.sub("<time>", _ID.sub(number, text)))
    text = _DURATION.sub('"duration_ms": <ms>', text)
    # an age of 9s or 10s changes a table's column widths, not its content
    return _PADDING.sub("  ", "\n".join(line.rstrip() for line in text.splitlines()))


def both(modes: tuple[Mode, Mode, Path], *args: str) -> tuple[str, int]:
    """Run ``corral args`` in both modes; assert the same stdout and exit code."""
    embedded, remote, _ = modes
    here, there = embedded(*args), remote(*args)
    assert (neutral(there.stdout), there.returncode) == (neutral(here.stdout), here.returncode), (
        f"corral {' '.join(args)}\n--- embedded stderr\n{here.stderr}\n--- remote stderr\n"
        f"{there.stderr}"
    )
    return here.stdout, here.returncode


def ids(stdout: str, prefix: str) -> list[str]:
    return re.findall(rf"\b{prefix}_[0-9a-z]{{20,32}}\b", stdout)


def test_commands_answer_the_same_embedded_and_remote(
    modes: tuple[Mode, Mode, Path], tmp_path: Path
) -> None:
    embedded, remote, unused = modes
    calc = tmp_path / "calc.yaml"
    calc.write_text(CALC)
    careful = tmp_path / "careful.yaml"
    careful.write_text(agent("careful", [ADD, "{text: done}"], approval="always"))
    chatty = tmp_path / "chatty.yaml"
    chatty.write_text(agent("chatty", ["{text: one}", "{text: two}"]))
    shaper = tmp_path / "shaper.yaml"
    shaper.write_text(agent("shaper", ["{text: '{\"sum\": 5}'}"]))
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "required": ["sum"]}))
    broken = tmp_path / "broken.yaml"
    broken.write_text(CALC.replace("tools: [add]", "tools: [add]\n  limits: {max_steps: 0}"))

    # resources
    assert both(modes, "apply", "-f", str(calc))[1] == 0
    assert both(modes, "apply", "-f", str(careful), "-f", str(chatty), "-f", str(shaper))[1] == 0
    assert both(modes, "apply", "-f", str(calc))[0].count("unchanged") == 3
    assert both(modes, "apply", "-f", str(broken))[1] == 2
    assert "calc" in both(modes, "get", "agents")[0]
    both(modes, "get", "agent", "calc", "-o", "yaml")
    both(modes, "get", "tools", "-o", "json")
    assert both(modes, "get", "agent", "nope")[1] == 2
    assert "Used by:     agent/calc" in both(modes, "describe", "tool", "add")[0]

    # runs: a finished one, one waiting for approval
    out, code = both(modes, "run", "calc", "What is 2 + 3?")
    assert (out.strip(), code) == ("2 + 3 = 5", 0)
    assert both(modes, "run", "careful", "add them")[1] == 3
    assert both(modes, "run", "nope", "x")[1] == 2
    listed, _ = both(modes, "tasks", "list")
    assert listed.count("run_") == 2 and "waiting_approval" in listed
    assert (
        both(modes, "tasks", "list", "--agent", "calc", "--state", "succeeded")[0].count("run_")
        == 1
    )
    assert both(modes, "tasks", "list", "--state", "bogus")[1] == 2
    calc_here = ids(embedded("tasks", "list", "--agent", "calc").stdout, "run")[0]
    calc_there = ids(remote("tasks", "list", "--agent", "calc").stdout, "run")[0]
    same_task = [embedded("tasks", "get", calc_here), remote("tasks", "get", calc_there)]
    assert neutral(same_task[0].stdout) == neutral(same_task[1].stdout)
    for extra in ([], ["-o", "json"], ["--follow"]):
        here = embedded("logs", calc_here, *extra)
        there = remote("logs", calc_there, *extra)
        assert (neutral(there.stdout), there.returncode) == (neutral(here.stdout), 0)
        assert "2 + 3 = 5" in here.stdout
    assert both(modes, "logs", "run_nope")[1] == 2
    assert both(modes, "tasks", "get", "run_nope")[1] == 2
    # every format of the output layer, alike in both modes
    assert "ERROR" in both(modes, "tasks", "list", "-o", "wide")[0]
    assert "FAILURES" in both(modes, "get", "agents", "-o", "wide")[0]
    assert both(modes, "tasks", "list", "-o", "name")[0].count("task/run_") == 2
    both(modes, "tasks", "list", "-o", "yaml")
    described = [embedded("tasks", "describe", calc_here), remote("tasks", "describe", calc_there)]
    # (each mode's run took its own time)
    assert [_RUN_TIME.sub("Duration: <d>", neutral(d.stdout)) for d in described[:1]] == [
        _RUN_TIME.sub("Duration: <d>", neutral(d.stdout)) for d in described[1:]
    ]
    assert re.search(r"^Attempts: +1/3$", described[0].stdout, re.MULTILINE)
    assert both(modes, "tasks", "describe", "run_nope")[1] == 2

    # approvals
    pending, _ = both(modes, "approvals", "list")
    assert "add" in pending
    both(modes, "approvals", "list", "-o", "json")
    here_approval = ids(embedded("approvals", "list").stdout, "apr")[0]
    there_approval = ids(remote("approvals", "list").stdout, "apr")[0]
    decided = [
        embedded("approvals", "reject", here_approval, "--reason", "no"),
        remote("approvals", "reject", there_approval, "--reason", "no"),
    ]
    assert neutral(decided[0].stdout) == neutral(decided[1].stdout)
    assert "rejected" in decided[0].stdout
    for mode, approval in ((embedded, here_approval), (remote, there_approval)):
        [run_of] = [
            a["run_id"]
            for a in json.loads(mode("approvals", "list", "--all", "-o", "json").stdout)
            if a["id"] == approval
        ]
        shown = mode("tasks", "describe", run_of).stdout
        assert f"  {approval}:" in shown and re.search(r"\n    Decided: +by ", shown), mode.name
        assert re.search(r"\n    Decision Reason: +no\n", shown + "\n"), mode.name
    again = remote("approvals", "approve", there_approval)
    assert again.returncode == embedded("approvals", "approve", here_approval).returncode == 2
    assert "apr_" not in both(modes, "approvals", "list")[0]
    assert "rejected" in both(modes, "approvals", "list", "--all")[0]

    # submit, idempotency, cancel
    first, _ = both(modes, "submit", "calc", "later", "--delay", "3600", "--idempotency-key", "k")
    again_out, _ = both(
        modes, "submit", "calc", "later", "--delay", "3600", "--idempotency-key", "k"
    )
    assert first == again_out
    here_later = embedded("submit", "calc", "x", "--delay", "3600").stdout.strip()
    there_later = remote("submit", "calc", "x", "--delay", "3600").stdout.strip()
    cancelled = [embedded("tasks", "cancel", here_later), remote("tasks", "cancel", there_later)]
    assert neutral(cancelled[0].stdout) == neutral(cancelled[1].stdout)
    assert cancelled[0].stdout.strip().endswith("cancelled")

    # sessions
    for text in ("first", "second"):
        assert both(modes, "run", "chatty", text, "--session", "s-1")[1] == 0
    assert ["s-1", "chatty"] in [
        line.split()[:2] for line in both(modes, "sessions", "list")[0].splitlines()
    ]
    shown, _ = both(modes, "sessions", "show", "s-1")
    assert shown.splitlines() == [
        "[user] first",
        "[assistant] one",
        "[user] second",
        "[assistant] two",
    ]
    assert both(modes, "sessions", "delete", "s-1")[1] == 0
    assert both(modes, "sessions", "show", "s-1")[1] == 2

    # structured output
    shaped, code = both(modes, "prompt-object", "shaper", "2 + 3?", "--schema", str(schema))
    assert (json.loads(shaped), code) == ({"sum": 5}, 0)

    # delete: refused while referenced, then done
    assert both(modes, "delete", "modelendpoint", "scripted-add")[1] == 2
    assert both(modes, "delete", "agent", "calc")[0].strip() == "agent/calc deleted"

    # remote mode never touched a local store
    assert not (unused / "corral.db").exists()


@pytest.mark.parametrize(
    "args", [["worker"], ["gc", "--keep", "1"], ["token", "list"], ["serve", "--port", "0"]]
)
def test_store_only_commands_refuse_remote_mode(
    modes: tuple[Mode, Mode, Path], args: list[str]
) -> None:
    _, remote, unused = modes
    refused = remote(*args)
    assert refused.returncode == 2
    assert f"'corral {args[0]}' works on the store directly" in refused.stderr
    assert not (unused / "corral.db").exists()


def test_an_unreachable_server_fails_with_its_url(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = {**_base_env(tmp_path), "CORRAL_URL": url, "CORRAL_TOKEN": "t"}
    proc = Mode("remote", env)("tasks", "list")
    assert proc.returncode == 1
    assert f"cannot reach the Corral API at {url}" in proc.stderr


def test_session_ids_are_held_to_one_rule_by_the_cli_and_the_api(
    modes: tuple[Mode, Mode, Path], tmp_path: Path
) -> None:
    embedded, remote, _ = modes
    keeper = tmp_path / "keeper.yaml"
    keeper.write_text(agent("keeper", ["{text: kept}"]))
    (tmp_path / "calc.yaml").write_text(CALC)  # the add tool
    assert both(modes, "apply", "-f", str(tmp_path / "calc.yaml"), "-f", str(keeper))[1] == 0
    api = httpx.Client(
        base_url=remote.env["CORRAL_URL"],
        headers={"Authorization": f"Bearer {remote.env['CORRAL_TOKEN']}"},
    )
    with api:
        for bad in ("bad/id", "x" * 100, "tab\there", ""):
            for args in (
                ["submit", "keeper", "hi", "--session", bad],
                ["run", "keeper", "hi", "--session", bad],
                ["sessions", "show", bad],
                ["sessions", "delete", bad],
            ):
                for mode in (embedded, remote):
                    refused = mode(*args)
                    assert (refused.returncode, refused.stderr.splitlines()) == (
                        2,
                        [f"error: invalid session id: {SESSION_ID_RULE}"],
                    ), f"{mode.name}: corral {' '.join(args)}"
            # The API refuses the same ids with the same reason, in a body and in a path.
            submitted = api.post(
                "/v1/tasks", json={"agent": "keeper", "input": "hi", "session": bad}
            )
            assert submitted.status_code == 422
            assert [(e["field"], e["reason"]) for e in submitted.json()["errors"]] == [
                ("body.session", SESSION_ID_RULE)
            ]
            if bad.isalnum():  # (a slash or nothing makes another route; httpx refuses a tab)
                read = api.get(f"/v1/sessions/{bad}")
                assert read.status_code == 422
                assert [(e["field"], e["reason"]) for e in read.json()["errors"]] == [
                    ("path.session_id", SESSION_ID_RULE)
                ]
        assert embedded("sessions", "list").stdout == ""  # nothing was stored on the way


def test_a_session_with_an_unfinished_run_cannot_be_deleted(
    modes: tuple[Mode, Mode, Path], tmp_path: Path
) -> None:
    keeper = tmp_path / "busy.yaml"
    keeper.write_text(agent("busy", ["{text: later}"]))
    (tmp_path / "calc.yaml").write_text(CALC)  # the add tool
    assert both(modes, "apply", "-f", str(tmp_path / "calc.yaml"), "-f", str(keeper))[1] == 0
    for mode in modes[:2]:
        queued = mode("submit", "busy", "later", "--delay", "3600", "--session", "s-busy")
        run_id = queued.stdout.strip()
        refused = mode("sessions", "delete", "s-busy")
        assert refused.returncode == 2, refused.stderr
        [line] = refused.stderr.splitlines()
        assert f"its run {run_id} is queued" in line
        assert "s-busy" in mode("sessions", "list").stdout  # nothing deleted
        assert mode("tasks", "cancel", run_id).returncode == 0
        assert mode("sessions", "delete", "s-busy").returncode == 0


def test_run_wait_follows_a_remote_run_past_its_approval(
    modes: tuple[Mode, Mode, Path], tmp_path: Path
) -> None:
    _, remote, _ = modes
    waiter = tmp_path / "waiter.yaml"
    waiter.write_text(
        CALC.split("---")[1] + "---" + agent("waiter", [ADD, "{text: waited}"], approval="always")
    )
    assert remote("apply", "-f", str(waiter)).returncode == 0
    running = remote.start("run", "waiter", "add them", "--wait")
    process = running.process
    try:
        assert process.stderr is not None
        seen: list[str] = []
        for line in process.stderr:
            seen.append(line)
            found = re.search(r"approve: corral approvals approve (apr_\w+)", line)
            if found:
                break
        assert found is not None, "".join(seen)
        decided = remote("approvals", "approve", found[1])
        assert decided.returncode == 0 and "approved" in decided.stdout
        # the server's workers pick the run up (its bus wakes them): no hint to start one
        assert "no worker has picked it up" not in decided.stderr, decided.stderr
        stdout, rest = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, "".join(seen) + rest
    assert stdout.strip() == "waited"
    assert re.search(r"✓ add approved by token:\S+ .*at ", rest)
