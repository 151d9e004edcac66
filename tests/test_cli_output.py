"""The CLI's one output layer as a user sees it: real ``corral`` processes on one store.

Every read command takes ``-o table|wide|json|yaml|name`` and each format parses;
JSON and YAML carry RFC 3339 times; piped tables never wrap or cut an id; a terminal
shortens free text, never an id; empty lists say so on stderr; an unknown format is
exit 2. Remote mode answers the same (tests/test_cli_remote.py).
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from cli_harness import invoke
from test_cli_run import TESTS

CORRAL = [sys.executable, "-m", "corral"]

RESOURCES = f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: scripted-add}}
spec:
  provider: scripted
  script:
    - tool_calls: [{{name: add, arguments: {{a: 2, b: 3}}}}]
    - text: "2 + 3 = 5"
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: greeter-model}}
spec:
  provider: scripted
  script:
    - text: "héllo 👋 世界"
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: add}}
spec:
  type: python
  python: {{function: "agent_tools:add", path: "{TESTS}"}}
---
apiVersion: corral/v1
kind: Agent
metadata:
  name: careful
  labels: {{équipe: café, team: 世界}}
spec:
  model: scripted-add
  tools: [add]
  approval: {{policy: always}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: broken}}
spec:
  model: scripted-add
  tools: [add]
  limits: {{max_steps: 1}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: greeter}}
spec:
  model: greeter-model
"""

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
NAME_LINE = re.compile(r"^[a-z]+/\S+$")
RUN_ID = re.compile(r"\brun_[0-9a-z]{20,32}\b")
FORMATS = ("table", "wide", "json", "yaml", "name")


def environment(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    return {**env, "CORRAL_HOME": str(home), **extra}


def corral(
    home: Path, *args: str, check: int | None = 0, **env: str
) -> subprocess.CompletedProcess[str]:
    """``corral args`` in this process (its start-up would dominate a test of formats);
    stdout is not a terminal, as when piped."""
    done = invoke(args, environment(home, **env))
    if check is not None:
        assert done.returncode == check, (
            f"corral {' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def together(
    home: Path, commands: Sequence[Sequence[str]], *, check: int | None = 0, **env: str
) -> list[subprocess.CompletedProcess[str]]:
    return [corral(home, *c, check=check, **env) for c in commands]


@dataclass
class Home:
    """A store with one run of each kind: failed, waiting for approval, in a session."""

    path: Path
    failed: str
    waiting: str
    greeted: str
    approval: str
    token: str


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Home:
    root = tmp_path_factory.mktemp("output")
    path = root / "home"
    resources = root / "resources.yaml"
    resources.write_text(RESOURCES)
    corral(path, "apply", "-f", str(resources))
    failed = corral(path, "run", "broken", "fail, s'il vous plaît", "-o", "json", check=1)
    waiting = corral(path, "run", "careful", "2 + 3 ≟", "-o", "json", check=3)
    greeted = corral(path, "run", "greeter", "grüß dich", "--session", "s-1", "-o", "json")
    approvals = json.loads(corral(path, "approvals", "list", "-o", "json").stdout)
    created = corral(path, "token", "create", "-n", "default", "--role", "viewer", "--name", "ü")
    [token] = json.loads(corral(path, "token", "list", "-o", "json").stdout)
    assert created.stdout.strip()
    return Home(
        path,
        json.loads(failed.stdout)["id"],
        json.loads(waiting.stdout)["id"],
        json.loads(greeted.stdout)["id"],
        approvals[0]["id"],
        token["id"],
    )


def read_commands(home: Home) -> list[list[str]]:
    return [
        ["get", "agents"],
        ["get", "agent", "careful"],
        ["get", "modelendpoints"],
        ["tasks", "list"],
        ["tasks", "get", home.failed],
        ["approvals", "list", "--all"],
        ["token", "list"],
        ["sessions", "list"],
        ["sessions", "show", "s-1"],
    ]


def test_every_read_command_prints_every_format_and_each_parses(home: Home) -> None:
    commands = read_commands(home)
    runs = together(home.path, [[*c, "-o", f] for c in commands for f in FORMATS])
    for index, command in enumerate(commands):
        table, wide, as_json, as_yaml, names = runs[index * 5 : index * 5 + 5]
        what = " ".join(command)
        for shown in (table, wide):
            header = shown.stdout.splitlines()[0]
            assert header == header.upper() and header.split()[0] in ("ID", "NAME", "SEQ"), what
            assert "─" not in shown.stdout and "\t" not in shown.stdout, what
        assert len(wide.stdout.splitlines()[0]) > len(table.stdout.splitlines()[0]), what
        data = json.loads(as_json.stdout)
        one = command[:2] in (["get", "agent"], ["tasks", "get"])
        if command == ["get", "agents"] or command == ["get", "modelendpoints"]:
            assert list(yaml.safe_load_all(as_yaml.stdout)) == data, what  # apply -f takes it
        else:
            assert yaml.safe_load(as_yaml.stdout) == data, what
        items = [data] if one else data
        assert items and len(table.stdout.splitlines()) == len(items) + 1, what
        lines = names.stdout.splitlines()
        assert len(lines) == len(items) and all(NAME_LINE.match(n) for n in lines), what
    by_command = {" ".join(c): runs[i * 5 + 4].stdout.split() for i, c in enumerate(commands)}
    assert by_command[f"tasks get {home.failed}"] == [f"task/{home.failed}"]
    assert set(by_command["tasks list"]) == {
        f"task/{r}" for r in (home.failed, home.waiting, home.greeted)
    }
    assert by_command["get agent careful"] == ["agent/careful"]
    assert by_command["approvals list --all"] == [f"approval/{home.approval}"]
    assert by_command["token list"] == [f"token/{home.token}"]
    assert by_command["sessions list"] == ["session/s-1"]


def test_json_and_yaml_show_rfc3339_times_where_the_api_has_epoch_seconds(home: Home) -> None:
    task, approvals, tokens, sessions, messages, events, task_yaml = (
        r.stdout
        for r in together(
            home.path,
            [
                ["tasks", "get", home.failed, "-o", "json"],
                ["approvals", "list", "-o", "json"],
                ["token", "list", "-o", "json"],
                ["sessions", "list", "-o", "json"],
                ["sessions", "show", "s-1", "-o", "json"],
                ["logs", home.failed, "-o", "json"],
                ["tasks", "get", home.failed, "-o", "yaml"],
            ],
        )
    )
    record = json.loads(task)
    stamps = [record[k] for k in ("created_at", "started_at", "finished_at", "not_before")]
    [approval] = json.loads(approvals)
    stamps.append(approval["requested_at"])
    [token] = json.loads(tokens)
    stamps.append(token["created_at"])
    [session] = json.loads(sessions)
    stamps += [session["created_at"], session["updated_at"]]
    stamps += [m["created_at"] for m in json.loads(messages)]
    stamps += [json.loads(line)["ts"] for line in events.splitlines()]
    assert stamps and all(isinstance(s, str) and RFC3339.match(s) for s in stamps), stamps
    times = [datetime.fromisoformat(s) for s in stamps[:3]]
    assert times == sorted(times)  # created, started, finished
    assert yaml.safe_load(task_yaml)["created_at"] == record["created_at"]
    assert record["lease_expires_at"] is None and token["revoked_at"] is None
    assert record["input"] == "fail, s'il vous plaît"


def test_piped_tables_never_wrap_or_cut_ids_however_narrow_columns_is(home: Home) -> None:
    for shown in together(
        home.path,
        [
            ["tasks", "list", "-o", "wide"],
            ["approvals", "list", "-o", "wide"],
            ["get", "agents", "-o", "wide"],
        ],
        COLUMNS="20",
    ):
        lines = shown.stdout.splitlines()
        assert len(lines) == 1 + {"tasks": 3, "approvals": 1, "get": 3}[shown.args[0]]
        assert all(" …" not in line and not line.endswith("…") for line in lines)
    [tasks] = together(home.path, [["tasks", "list", "-o", "wide"]], COLUMNS="20")
    assert set(RUN_ID.findall(tasks.stdout)) == {home.failed, home.waiting, home.greeted}
    failed_line = next(line for line in tasks.stdout.splitlines() if home.failed in line)
    # the whole error, with its code, on the run's one line
    assert failed_line.endswith(
        "budget_exceeded: the run reached its limit of 1 steps without a final answer"
    )


def test_a_terminal_shortens_free_text_to_its_width_but_never_an_id(home: Home) -> None:
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [*CORRAL, "tasks", "list", "-o", "wide"],
        stdout=terminal,
        stderr=subprocess.PIPE,
        env=environment(home.path, COLUMNS="140"),
    )
    os.close(terminal)
    chunks = []
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the terminal's other end is closed: all was read
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    assert process.wait(timeout=120) == 0
    lines = b"".join(chunks).decode().replace("\r\n", "\n").splitlines()
    assert len(lines) == 4 and all(len(line) <= 140 for line in lines), lines
    assert set(RUN_ID.findall("\n".join(lines))) == {home.failed, home.waiting, home.greeted}
    failed_line = next(line for line in lines if home.failed in line)
    assert "budget_exceeded: the run" in failed_line and failed_line.endswith("…")


def test_empty_lists_say_so_on_stderr_and_print_empty_documents(tmp_path: Path) -> None:
    empty = tmp_path / "home"
    lists = [
        ["tasks", "list"],
        ["approvals", "list"],
        ["sessions", "list"],
        ["get", "agents"],
        ["token", "list", "-n", "default"],
    ]
    commands = [[*c, "-o", f] for c in lists for f in FORMATS]
    for command, shown in zip(commands, together(empty, commands), strict=True):
        what = " ".join(command)
        if command[-1] == "json":
            assert json.loads(shown.stdout) == [], what
        elif command[-1] == "yaml" and command[0] != "get":
            assert yaml.safe_load(shown.stdout) == [], what
        else:
            assert shown.stdout == "", what
            assert shown.stderr == "No resources found in default namespace.\n", what
    everywhere = corral(empty, "token", "list")
    assert (everywhere.stdout, everywhere.stderr) == ("", "No resources found.\n")


def test_an_unknown_output_format_is_bad_input_named_in_the_error(home: Home) -> None:
    commands = [
        *read_commands(home),
        ["apply", "-f", str(home.path / "nowhere.yaml")],
        ["submit", "greeter", "hi"],
        ["tasks", "cancel", home.waiting],
        ["approvals", "approve", home.approval],
        ["approvals", "reject", home.approval],
    ]
    for shown in together(home.path, [[*c, "-o", "xml"] for c in commands], check=2):
        assert shown.stdout == ""
        assert "unknown output format 'xml'" in shown.stderr, shown.args
    # a change is json, yaml or name: not a table
    assert (
        "unknown output format 'table'"
        in corral(home.path, "submit", "greeter", "hi", "-o", "table", check=2).stderr
    )
    assert corral(home.path, "tasks", "list", "-o", "wide").returncode == 0  # nothing changed


def test_changes_print_what_they_did_as_json_yaml_or_names(tmp_path: Path) -> None:
    path = tmp_path / "home"
    resources = tmp_path / "resources.yaml"
    resources.write_text(RESOURCES)
    applied = json.loads(corral(path, "apply", "-f", str(resources), "-o", "json").stdout)
    assert [(a["kind"], a["name"], a["action"]) for a in applied][:2] == [
        ("ModelEndpoint", "scripted-add", "created"),
        ("ModelEndpoint", "greeter-model", "created"),
    ]
    again = corral(path, "apply", "-f", str(resources), "-o", "name").stdout.splitlines()
    assert again[-3:] == ["agent/careful", "agent/broken", "agent/greeter"]
    submitted = json.loads(
        corral(path, "submit", "greeter", "später", "--delay", "60", "-o", "json").stdout
    )
    assert (submitted["state"], submitted["input"]) == ("queued", "später")
    assert RFC3339.match(submitted["not_before"])
    other = corral(path, "submit", "greeter", "x", "--delay", "60", "-o", "name").stdout
    assert RUN_ID.fullmatch(other.strip().removeprefix("task/"))
    cancelled = yaml.safe_load(
        corral(path, "tasks", "cancel", submitted["id"], "-o", "yaml").stdout
    )
    assert (cancelled["id"], cancelled["state"]) == (submitted["id"], "cancelled")
    corral(path, "run", "careful", "add", check=3)
    [approval] = json.loads(corral(path, "approvals", "list", "-o", "json").stdout)
    decided = json.loads(
        corral(path, "approvals", "approve", approval["id"], "--reason", "oui", "-o", "json").stdout
    )
    assert (decided["state"], decided["decision_reason"]) == ("approved", "oui")
    assert RFC3339.match(decided["decided_at"])


def test_tasks_describe_says_why_a_run_failed_and_who_decided_its_approvals(
    home: Home, tmp_path: Path
) -> None:
    failed, waiting = (
        r.stdout
        for r in together(
            home.path, [["tasks", "describe", home.failed], ["tasks", "describe", home.waiting]]
        )
    )
    fields = dict(
        (key.strip(), value.strip())
        for key, _, value in (line.partition(":") for line in failed.splitlines())
    )
    assert fields["State"] == "failed" and fields["Agent"] == "broken"
    assert fields["Attempts"] == "1/3" and fields["Input"] == "fail, s'il vous plaît"
    assert fields["Code"] == "budget_exceeded"
    assert fields["Reason"] == "the run reached its limit of 1 steps without a final answer"
    assert fields["Limit"] == "max_steps" and fields["Approvals"] == "<none>"
    assert fields["Steps"] == "1" and "Finished" in fields and "Duration" in fields
    assert f"  {home.approval}:" in waiting and "State:" in waiting and "pending" in waiting
    missing = corral(home.path, "tasks", "describe", "run_nope", check=2)
    assert missing.stderr == "error: task 'run_nope' not found\n"


def test_get_agents_wide_counts_each_agents_runs_and_failures(home: Home) -> None:
    table = corral(home.path, "get", "agents", "-o", "wide").stdout.splitlines()
    header = re.split(r" {3,}", table[0])
    rows = {r.split()[0]: dict(zip(header, re.split(r" {3,}", r), strict=True)) for r in table[1:]}
    assert header[:3] == ["NAME", "NAMESPACE", "MODEL"]
    assert (rows["broken"]["RUNS"], rows["broken"]["FAILURES"]) == ("1", "1")
    assert rows["broken"]["LAST RUN"].endswith("ago (failed)")
    assert rows["careful"]["LAST RUN"].endswith("(waiting_approval)")
    assert rows["careful"]["FAILURES"] == "0"
    assert rows["careful"]["LABELS"] == "team=世界,équipe=café"
