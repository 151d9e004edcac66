"""kubectl habits of the run commands, embedded and remote alike: ``--state a,b``, unknown
values echoed, ``-l`` labels on runs and selectors on ``tasks list``, ``tasks cancel`` of a
finished run, ``prompt-object`` without a schema, progress on stderr, and ``-w``.

Commands run in this process (:func:`corral`, typer's runner) against an embedded store
or a real ``corral serve`` in a thread (:mod:`server_harness`); ``-w`` runs as a real
process, read line by line while another command changes what it watches.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from cli_harness import invoke
from server_harness import LiveServer
from test_cli_output import RESOURCES

CORRAL = [sys.executable, "-m", "corral"]
SRC = str(Path(__file__).parent.parent / "src")

SCHEMA_AGENT = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: json-model}
spec:
  provider: scripted
  script:
    - text: '{"answer": 5}'
---
apiVersion: corral/v1
kind: Agent
metadata: {name: structured}
spec:
  model: json-model
  output_schema:
    type: object
    properties: {answer: {type: integer}}
    required: [answer]
"""


@dataclass
class Mode:
    """One way the CLI reaches Corral: its environment (a home, or a server's URL)."""

    name: str
    env: dict[str, str]
    server: LiveServer | None = None

    def __call__(self, *args: str, check: int | None = 0) -> subprocess.CompletedProcess[str]:
        """``corral args`` in this process (:mod:`cli_harness`); stdout is not a terminal."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        done = invoke(list(args), {**env, **self.env})
        if check is not None:
            assert done.returncode == check, (
                f"corral {' '.join(args)} ({self.name}): exit {done.returncode}\n"
                f"{done.stdout}\n{done.stderr}"
            )
        assert "Traceback" not in done.stderr, done.stderr
        return done

    def process(self, *args: str) -> subprocess.Popen[str]:
        """``corral args`` as a real process, its output read as it comes."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        env = {**env, **self.env, "PYTHONPATH": SRC, "PYTHONUNBUFFERED": "1"}
        return subprocess.Popen(
            [*CORRAL, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def submit(self, *args: str) -> str:
        """A queued run that stays queued (due in an hour): its id."""
        return self("submit", "greeter", "hi", "--delay", "3600", *args).stdout.strip()

    def tasks(self, *args: str) -> list[dict[str, object]]:
        found: list[dict[str, object]] = json.loads(
            self("tasks", "list", "-o", "json", "--limit", "500", *args).stdout
        )
        return found


def _apply(mode: Mode, root: Path) -> Mode:
    resources = root / "resources.yaml"
    resources.write_text(RESOURCES + "---\n" + SCHEMA_AGENT)
    mode("apply", "-f", str(resources))
    return mode


@pytest.fixture(scope="module")
def remote_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("server"), workers=2) as live:
        yield live


@pytest.fixture(params=["embedded", "remote"])
def mode(
    request: pytest.FixtureRequest, tmp_path: Path, remote_server: LiveServer
) -> Iterator[Mode]:
    """A fresh namespace each test: a home of its own, or a namespace of its own on the server."""
    if request.param == "embedded":
        yield _apply(Mode("embedded", {"CORRAL_HOME": str(tmp_path / "home")}), tmp_path)
        return
    namespace = f"t{abs(hash(request.node.name)) % 10**8}"
    token = remote_server.mint(namespace, "admin")
    env = {
        "CORRAL_HOME": str(tmp_path / "unused"),
        "CORRAL_URL": remote_server.url,
        "CORRAL_TOKEN": token,
    }
    yield _apply(Mode("remote", env, remote_server), tmp_path)


# --------------------------------------------------------------------------- --state


def test_state_takes_commas_and_repeats(mode: Mode) -> None:
    queued = mode.submit()
    done = json.loads(mode("run", "greeter", "hi", "-o", "json").stdout)["id"]
    both = {queued, done}
    assert {t["id"] for t in mode.tasks("--state", "queued,succeeded")} == both
    assert {t["id"] for t in mode.tasks("--state", "queued", "--state", "succeeded")} == both
    assert {t["id"] for t in mode.tasks("--state", " queued , queued ")} == {queued}
    assert {t["id"] for t in mode.tasks("--state", "succeeded")} == {done}


@pytest.mark.parametrize(
    ("args", "echoed", "allowed"),
    [
        (["tasks", "list", "--state", "queued,runing"], "'runing'", "waiting_approval"),
        (["tasks", "list", "--state", "queued,,running"], "''", "dead_letter"),
        (["tasks", "list", "--state", "ünknown"], "'ünknown'", "queued"),
        (["tasks", "list", "--state", "x" * 10_000], "'" + "x" * 40 + "…'", "queued"),
        (["tasks", "list", "-o", "tabel"], "'tabel'", "wide, json, yaml or name"),
        (["approvals", "list", "--state", "pending,maybe"], "'maybe'", "rejected"),
        (["approvals", "list", "-o", "xml"], "'xml'", "table"),
    ],
)
def test_unknown_values_are_echoed_with_the_values_allowed(
    mode: Mode, args: list[str], echoed: str, allowed: str
) -> None:
    failed = mode(*args, check=2)
    message = " ".join(failed.stderr.split())
    assert "unknown" in message and echoed in message and allowed in message, message
    assert failed.stdout == ""


# --------------------------------------------------------------------------- labels


def test_labels_are_stored_shown_and_selected(mode: Mode) -> None:
    ml = mode.submit("-l", "team=ml", "-l", "équipe=café,env=prod")
    web = mode.submit("--label", "team=web", "-o", "json")
    web_id = json.loads(web)["id"]
    assert json.loads(web)["labels"] == {"team": "web"}
    bare = mode.submit()

    record = json.loads(mode("tasks", "get", ml, "-o", "json").stdout)
    assert record["labels"] == {"team": "ml", "équipe": "café", "env": "prod"}
    assert (
        yaml.safe_load(mode("tasks", "get", ml, "-o", "yaml").stdout)["labels"]["équipe"] == "café"
    )

    wide = mode("tasks", "list", "-o", "wide").stdout.splitlines()
    assert "LABELS" in wide[0].split()
    row = next(line for line in wide if ml in line)
    assert "env=prod,team=ml,équipe=café" in row
    assert "<none>" in next(line for line in wide if bare in line)
    assert "LABELS" not in mode("tasks", "list").stdout.splitlines()[0]

    described = mode("tasks", "describe", ml).stdout.splitlines()
    assert described[1].startswith("Namespace:")
    assert described[2].split() == ["Labels:", "env=prod,team=ml,équipe=café"]

    def picked(*selector: str) -> set[object]:
        return {t["id"] for t in mode.tasks(*selector)}

    assert picked("-l", "team=ml") == {ml}
    assert picked("-l", "team") == {ml, web_id}
    assert picked("-l", "!team") == {bare}
    assert picked("-l", "team!=ml") == {web_id, bare}
    assert picked("-l", "team=ml,env=prod") == {ml}
    assert picked("-l", "équipe=café") == {ml}
    assert picked("-l", "team=nobody") == set()
    names = mode("tasks", "list", "-l", "team==web", "-o", "name").stdout.split()
    assert names == [f"task/{web_id}"]


def test_labels_are_free_text_of_any_script(mode: Mode) -> None:
    run_id = mode.submit("-l", "nom d'équipe=café crème", "-l", "世界=こんにちは")
    [found] = mode.tasks("-l", "nom d'équipe=café crème,世界")
    assert found["id"] == run_id
    assert found["labels"] == {"nom d'équipe": "café crème", "世界": "こんにちは"}


def test_labels_on_run_and_prompt_object(mode: Mode) -> None:
    ran = json.loads(mode("run", "greeter", "hi", "-l", "via=run", "-o", "json").stdout)
    assert ran["labels"] == {"via": "run"}
    mode("prompt-object", "structured", "give", "-l", "via=prompt")
    [asked] = mode.tasks("-l", "via=prompt")
    assert asked["agent"] == "structured" and asked["labels"] == {"via": "prompt"}


@pytest.mark.parametrize(
    ("label", "reason"),
    [
        ("team", "is not key=value"),
        ("=ml", "may not be empty"),
        ("team=a=b", "contains '='"),
        ("team=a!b", "contains '!'"),
        (" team=ml", "begins or ends with a space"),
        ("team=ml ", "begins or ends with a space"),
        ("team=\x00", "control character"),
        ("team=m\nl", "control character"),
        ("team=\ud800", "not valid Unicode"),
        ("k" * 64 + "=v", "longer than 63"),
        ("team=" + "v" * 100_000, "longer than 63"),
        ("team=ml,team=web", "given twice"),
        ("team=ml,", "is not key=value"),
        (",".join(f"k{i}=v" for i in range(33)), "at most 32 labels"),
    ],
)
def test_hostile_labels_are_refused_and_nothing_is_stored(
    mode: Mode, label: str, reason: str
) -> None:
    failed = mode("submit", "greeter", "hi", "-l", label, check=2)
    assert reason in failed.stderr and len(failed.stderr) < 400, failed.stderr
    assert mode.tasks() == []


@pytest.mark.parametrize(
    "selector", ["=x", "a,,b", "!", ",".join(f"k{i}" for i in range(21)), "k=" + "v" * 2000]
)
def test_malformed_selectors_are_exit_2_naming_them(mode: Mode, selector: str) -> None:
    failed = mode("tasks", "list", "-l", selector, check=2)
    assert failed.stderr.startswith("error:") and "selector" in failed.stderr
    assert failed.stdout == "" and len(failed.stderr) < 600


def test_the_api_and_the_client_hold_labels_to_the_same_rule(remote_server: LiveServer) -> None:
    from corral.client import Client
    from corral.core.errors import UserError

    token = remote_server.mint("apilabels", "admin")
    with remote_server.client(token) as http:
        http.post(
            "/v1/resources",
            content=SCHEMA_AGENT,
            headers={"Content-Type": "application/yaml"},
        ).raise_for_status()
        for bad in ({"a,b": "x"}, {"k": "v" * 64}, {f"k{i}": "v" for i in range(33)}):
            answer = http.post(
                "/v1/tasks", json={"agent": "structured", "input": "x", "labels": bad}
            )
            assert answer.status_code == 422, answer.text
            assert answer.json()["errors"][0]["field"].endswith("labels")
        bad_selector = http.get("/v1/tasks", params={"selector": "=x"})
        assert bad_selector.status_code == 422
        assert bad_selector.json()["errors"][0]["field"] == "query.selector"
        huge = http.get("/v1/tasks", params={"selector": "k=" + "v" * 5000})
        assert huge.status_code == 422
    with Client(remote_server.url, token=token) as client:
        task = client.submit("structured", "x", labels={"team": "ml"}, delay_seconds=3600).task
        client.submit("structured", "y", labels={"team": "web"}, delay_seconds=3600)
        assert task.labels == {"team": "ml"}
        assert [t.id for t in client.list_tasks(selector="team=ml").items] == [task.id]
        assert [t.id for t in client.iter_tasks(selector="team=ml,!env")] == [task.id]
        with pytest.raises(UserError):
            client.list_tasks(selector="=1")


# --------------------------------------------------------------------------- cancel


def test_cancelling_a_finished_run_says_nothing_was_cancelled(mode: Mode) -> None:
    done = json.loads(mode("run", "greeter", "hi", "-o", "json").stdout)["id"]
    refused = mode("tasks", "cancel", done, check=2)
    assert f"task {done} already succeeded; nothing cancelled" in " ".join(refused.stderr.split())
    assert refused.stdout == ""
    assert json.loads(mode("tasks", "get", done, "-o", "json").stdout)["state"] == "succeeded"

    queued = mode.submit()
    assert mode("tasks", "cancel", queued).stdout.strip() == f"{queued} cancelled"
    again = mode("tasks", "cancel", queued, "-o", "json", check=2)
    assert "already cancelled; nothing cancelled" in again.stderr and again.stdout == ""

    missing = mode("tasks", "cancel", "run_nope", check=2)
    assert "not found" in missing.stderr


def test_the_api_answers_409_already_finished_for_a_finished_run(
    remote_server: LiveServer,
) -> None:
    token = remote_server.mint("apicancel", "admin")
    with remote_server.client(token) as http:
        http.post(
            "/v1/resources",
            content=RESOURCES.encode(),
            headers={"Content-Type": "application/yaml"},
        ).raise_for_status()
        task = http.post(
            "/v1/tasks", json={"agent": "greeter", "input": "x", "delay_seconds": 3600}
        ).json()
        first = http.post(f"/v1/tasks/{task['id']}/cancel")
        assert first.status_code == 200 and first.json()["state"] == "cancelled"
        second = http.post(f"/v1/tasks/{task['id']}/cancel")
        assert second.status_code == 409, second.text
        assert second.json()["code"] == "already_finished"
        assert "already cancelled; nothing cancelled" in second.json()["detail"]


# --------------------------------------------------------------------------- prompt-object


def test_prompt_object_without_any_schema_is_exit_2(mode: Mode) -> None:
    failed = mode("prompt-object", "greeter", "give me json", check=2)
    message = " ".join(failed.stderr.split())
    assert "agent 'greeter' has no output_schema" in message and "--schema" in message
    assert failed.stdout == "" and mode.tasks() == []  # nothing was run


def test_prompt_object_prints_only_the_json_on_stdout(mode: Mode) -> None:
    asked = mode("prompt-object", "structured", "give")
    assert json.loads(asked.stdout) == {"answer": 5}
    assert "succeeded" in asked.stderr  # its progress and final line, on stderr


def _flaky_endpoint(base_url: str) -> str:
    return f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: flaky}}
spec:
  provider: openai
  model: m
  base_url: "{base_url}"
  retry: {{max_attempts: 3, initial_backoff_seconds: 0.01}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: flaky-json}}
spec:
  model: flaky
  output_schema: {{type: object, required: [answer]}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: flaky-text}}
spec: {{model: flaky}}
"""


def test_model_retries_go_to_stderr_and_stdout_stays_the_answer(mode: Mode, tmp_path: Path) -> None:
    from corral.testing.fake_openai import FakeOpenAIServer, FakeReply

    with FakeOpenAIServer() as fake:
        path = tmp_path / "flaky.yaml"
        path.write_text(_flaky_endpoint(fake.base_url))
        mode("apply", "-f", str(path))

        fake.fail(503, times=1, message="overloaded")
        fake.add_reply(FakeReply(text='{"answer": 42}'))
        asked = mode("prompt-object", "flaky-json", "give")
        assert json.loads(asked.stdout) == {"answer": 42}
        assert "retry 2/3 in" in asked.stderr and "overloaded" in asked.stderr

        fake.fail(503, times=1, message="overloaded")
        fake.add_reply(FakeReply(text="forty-two"))
        ran = mode("run", "flaky-text", "say it")
        assert ran.stdout.strip() == "forty-two"
        assert "retry 2/3 in" in ran.stderr and "overloaded" in ran.stderr


# --------------------------------------------------------------------------- -w


class Watching:
    """A ``corral ... -w`` process, its stdout read line by line by a thread of its own."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stdout: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def until(self, wanted: str, seconds: float = 30.0) -> list[str]:
        """The next lines, up to the first that contains ``wanted``."""
        got: list[str] = []
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no line with {wanted!r} in {seconds} s: {got}"
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            assert line is not None, f"stdout ended before {wanted!r}: {got}\n{self.stderr()}"
            got.append(line)
            self.stdout.append(line)
            if wanted in line:
                return got

    def rest(self) -> list[str]:
        """The lines after those read, once the process has ended."""
        self._reader.join(30)
        got: list[str] = []
        while (line := self.lines.get_nowait()) is not None:
            got.append(line)
        return got

    def wait(self) -> tuple[int, str]:
        """The exit code and stderr of the process, once it ends (30 s at most)."""
        try:
            code = self.process.wait(timeout=30)
        finally:
            if self.process.poll() is None:
                self.process.kill()
        return code, self.stderr()

    def stderr(self) -> str:
        if self.process.poll() is None:
            self.process.kill()
        return self.process.stderr.read() if self.process.stderr else ""


def test_tasks_list_watch_sees_a_run_change_state_until_its_timeout(mode: Mode) -> None:
    run_id = mode.submit("-l", "watched=yes")
    mode.submit()  # not selected
    watching = Watching(
        mode.process(
            "tasks",
            "list",
            "-l",
            "watched",
            "-w",
            "--watch-timeout",
            "8",
            "--watch-interval",
            "0.2",
        )
    )
    first = watching.until(run_id)
    assert first[0].split()[:3] == ["ID", "AGENT", "STATE"] and "queued" in first[1]
    assert len(first) == 2
    mode("tasks", "cancel", run_id)
    changed = watching.until("cancelled")
    assert len(changed) == 1  # a row, without the header again
    assert changed[0].split()[:3] == [run_id, "greeter", "cancelled"]
    code, stderr = watching.wait()  # the timeout ends it
    assert code == 0, stderr
    assert watching.rest() == [] and "Traceback" not in stderr


def test_approvals_list_watch_sees_a_decision_as_json_lines(mode: Mode) -> None:
    mode("run", "careful", "2 + 3?", check=3)
    [pending] = json.loads(mode("approvals", "list", "-o", "json").stdout)
    watching = Watching(
        mode.process(
            "approvals",
            "list",
            "-w",
            "-o",
            "json",
            "--watch-timeout",
            "8",
            "--watch-interval",
            "0.2",
        )
    )
    first = watching.until(pending["id"])
    assert [json.loads(line)["state"] for line in first] == ["pending"]
    mode("approvals", "approve", pending["id"], "--reason", "fine")
    [decided] = [json.loads(line) for line in watching.until('"approved"')]
    assert (decided["id"], decided["state"]) == (pending["id"], "approved")
    assert decided["decision_reason"] == "fine"
    code, stderr = watching.wait()
    assert code == 0, stderr
    assert watching.rest() == []  # decided once, shown once


def test_ctrl_c_ends_a_watch_with_exit_0(mode: Mode) -> None:
    mode.submit()
    watching = Watching(mode.process("tasks", "list", "-w"))
    watching.until("queued")
    watching.process.send_signal(signal.SIGINT)
    code, stderr = watching.wait()
    assert code == 0, stderr
    assert "Traceback" not in stderr and "interrupted" not in stderr


def test_an_empty_watch_says_so_and_ends_at_its_timeout(mode: Mode) -> None:
    watched = mode("tasks", "list", "-w", "--watch-timeout", "0.3", "-l", "nothing=here")
    assert watched.stdout == "" and "No resources found" in watched.stderr
