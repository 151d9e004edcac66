"""kubectl habits of the resource commands, embedded and remote alike.

``apply -f -`` (stdin) and ``--dry-run``, ``delete -f`` and several names, ``get -A``,
``get -l`` label selectors, ``describe KIND`` without a name, ``gc --dry-run`` and
``get -w``. Each test runs once on a store of its own (embedded) and once against a
``corral serve`` with an admin token of a namespace of its own (remote); commands run
in this process (``CliRunner``) except ``get -w``, a real process a test interrupts.
"""

from __future__ import annotations

import itertools
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
from test_hostile_inputs import alias_bomb

CORRAL = [sys.executable, "-m", "corral"]

MODEL = """\
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: m}
spec: {provider: scripted, script: [{text: hi}]}
"""

AGENTS = """\
apiVersion: corral/v1
kind: Agent
metadata:
  name: x
  labels: {team: a, équipe: café}
spec: {model: m}
---
apiVersion: corral/v1
kind: Agent
metadata:
  name: y
  labels: {team: b}
spec: {model: m}
"""

ALL = MODEL + "---\n" + AGENTS


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str


@dataclass
class Cli:
    """``corral`` in one mode, working in namespace ``ns``."""

    mode: str
    env: dict[str, str | None]
    ns: str
    tmp: Path

    def __call__(
        self, *args: str, input: str | bytes | None = None, check: int | None = 0
    ) -> Result:
        result = invoke(args, self.process_env(), input=input)
        done = Result(result.returncode, result.stdout, result.stderr)
        assert check is None or done.exit_code == check, (
            f"corral {' '.join(args)} ({self.mode}): exit {done.exit_code}\n{done.stdout}\n"
            f"{done.stderr}"
        )
        assert "Traceback" not in done.stderr, done.stderr
        return done

    def file(self, name: str, text: str) -> str:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return str(path)

    def process_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        env.update({k: v for k, v in self.env.items() if v is not None})
        return env


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("server"), workers=0) as server:
        yield server


_NAMESPACES = itertools.count()


def _env(tmp: Path) -> dict[str, str | None]:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("CORRAL_")}
    env.update({"CORRAL_HOME": str(tmp / "home"), "XDG_CONFIG_HOME": str(tmp / "config")})
    return env


@pytest.fixture(params=["embedded", "remote"])
def cli(request: pytest.FixtureRequest, tmp_path: Path) -> Cli:
    ns = f"ns{next(_NAMESPACES)}-{os.getpid()}"
    env = _env(tmp_path)
    if request.param == "remote":
        live: LiveServer = request.getfixturevalue("live")
        env.update({"CORRAL_URL": live.url, "CORRAL_TOKEN": live.mint(ns, "admin")})
    return Cli(request.param, env, ns, tmp_path)


def rows(stdout: str) -> list[list[str]]:
    """A table's rows as lists of cells (header first)."""
    return [line.split() for line in stdout.splitlines() if line.strip()]


def names(stdout: str) -> list[str]:
    return [row[0] for row in rows(stdout)[1:]]


# --------------------------------------------------------------------------- apply -f -


def test_apply_reads_stdin(cli: Cli) -> None:
    done = cli("apply", "-n", cli.ns, "-f", "-", input=ALL)
    assert done.stdout.splitlines() == [
        "modelendpoint/m created",
        "agent/x created",
        "agent/y created",
    ]
    assert names(cli("get", "agents", "-n", cli.ns).stdout) == ["x", "y"]
    # stdin and a file together make one batch
    more = cli.file("z.yaml", AGENTS.replace("name: y", "name: z"))
    done = cli("apply", "-n", cli.ns, "-f", "-", "-f", more, input=MODEL)
    assert done.stdout.splitlines() == [
        "modelendpoint/m unchanged",
        "agent/x unchanged",
        "agent/z created",
    ]


def test_apply_errors_from_stdin_keep_the_line(cli: Cli) -> None:
    broken = ALL.replace("spec: {model: m}\n---", "spec: {model: nowhere}\n---")
    done = cli("apply", "-n", cli.ns, "-f", "-", input=broken, check=2)
    assert "<stdin>:11, field 'spec.model': ModelEndpoint 'nowhere' not found" in done.stderr
    done = cli("apply", "-n", cli.ns, "-f", "-", input="kind: [unclosed\n", check=2)
    assert "<stdin>:" in done.stderr and "invalid YAML" in done.stderr
    assert cli("get", "agents", "-n", cli.ns).stderr.startswith("No resources found")


@pytest.mark.parametrize(
    ("stdin", "says"),
    [
        (alias_bomb(6), "document too complex"),
        (b"\xff\xfe garbage \x00", "<stdin>: not UTF-8 text"),
        ("\x00\x01\x02", "<stdin>:1: invalid YAML"),
        ("", "no resources found"),
        ("x" * (1024 * 1024 + 10), "max_bytes"),
    ],
    ids=["alias-bomb", "not-utf8", "control-chars", "empty", "oversized"],
)
def test_hostile_stdin_is_refused_with_a_reason(cli: Cli, stdin: str | bytes, says: str) -> None:
    started = time.monotonic()
    done = cli("apply", "-n", cli.ns, "-f", "-", input=stdin, check=2)
    assert says in done.stderr
    assert time.monotonic() - started < 10


def test_stdin_is_read_once(cli: Cli) -> None:
    done = cli("apply", "-f", "-", "-f", "-", input=ALL, check=2)
    assert "-f - (standard input) can be given once" in done.stderr


# --------------------------------------------------------------------------- --dry-run


def test_apply_dry_run_says_what_would_happen_and_changes_nothing(cli: Cli) -> None:
    done = cli("apply", "-n", cli.ns, "-f", "-", "--dry-run", input=ALL)
    assert done.stdout.splitlines() == [
        "modelendpoint/m created (dry run)",
        "agent/x created (dry run)",
        "agent/y created (dry run)",
    ]
    assert cli("get", "agents", "-n", cli.ns).stdout == ""
    cli("apply", "-n", cli.ns, "-f", "-", input=ALL)
    changed = ALL.replace("labels: {team: b}", "labels: {team: c}")
    done = cli("apply", "-n", cli.ns, "-f", "-", "--dry-run", "-o", "json", input=changed)
    outcomes = [(o["name"], o["action"], o["generation"]) for o in yaml.safe_load(done.stdout)]
    assert outcomes == [("m", "unchanged", 1), ("x", "unchanged", 1), ("y", "configured", 2)]
    got = cli("get", "agent", "y", "-n", cli.ns, "-o", "yaml").stdout
    assert yaml.safe_load(got)["metadata"]["labels"] == {"team": "b"}
    # a dry run checks references as an apply does
    orphan = AGENTS.replace("model: m}", "model: gone}")
    done = cli("apply", "-n", cli.ns, "-f", "-", "--dry-run", input=orphan, check=2)
    assert "<stdin>:6, field 'spec.model': ModelEndpoint 'gone' not found" in done.stderr


def test_gc_dry_run_deletes_nothing(tmp_path: Path) -> None:
    cli = Cli("embedded", _env(tmp_path), "default", tmp_path)
    cli("apply", "-f", "-", input=ALL)
    cli("run", "x", "hello", check=None)
    assert cli("tasks", "list", "-o", "name").stdout.count("task/") == 1
    done = cli("gc", "--keep", "0", "--dry-run")
    assert done.stdout.strip() == (
        "would delete 1 finished runs with their events and approvals (dry run: nothing deleted)"
    )
    assert cli("tasks", "list", "-o", "name").stdout.count("task/") == 1
    assert cli("gc", "--keep", "0").stdout.strip() == "deleted 1 finished runs"


# --------------------------------------------------------------------------- delete


def test_delete_several_names_reports_each_and_fails_on_a_missing_one(cli: Cli) -> None:
    cli("apply", "-n", cli.ns, "-f", "-", input=ALL)
    done = cli("delete", "agent", "x", "nope", "y", "-n", cli.ns, check=2)
    assert done.stdout.splitlines() == ["agent/x deleted", "agent/y deleted"]
    assert "Agent 'nope' not found" in done.stderr
    assert cli("get", "agents", "-n", cli.ns).stdout == ""
    # a model and the agent that uses it, named in either order
    cli("apply", "-n", cli.ns, "-f", "-", input=ALL)
    done = cli("delete", "modelendpoint", "m", "-n", cli.ns, check=2)
    assert "it is referenced by Agent 'x'" in done.stderr
    cli("delete", "agents", "x", "y", "-n", cli.ns)
    cli("delete", "modelendpoint", "m", "-n", cli.ns)


def test_delete_from_files_stdin_and_directories(cli: Cli) -> None:
    cli("apply", "-n", cli.ns, "-f", "-", input=ALL)
    # the model first: it is deleted once the agents that use it are gone
    done = cli("delete", "-n", cli.ns, "-f", cli.file("all.yaml", ALL))
    assert done.stdout.splitlines() == [
        "modelendpoint/m deleted",
        "agent/x deleted",
        "agent/y deleted",
    ]
    done = cli("delete", "-n", cli.ns, "-f", "-", input=ALL, check=2)
    assert done.stderr.count("not found") == 3
    cli.file("dir/model.yaml", MODEL)
    cli.file("dir/agents.yaml", AGENTS)
    cli("apply", "-n", cli.ns, "-f", str(cli.tmp / "dir"))
    done = cli("delete", "-n", cli.ns, "-f", str(cli.tmp / "dir"))
    assert sorted(done.stdout.splitlines()) == [
        "agent/x deleted",
        "agent/y deleted",
        "modelendpoint/m deleted",
    ]


MUTUAL = (
    MODEL
    + """\
---
apiVersion: corral/v1
kind: Agent
metadata: {name: a}
spec: {model: m, links: [b]}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: b}
spec: {model: m, links: [a]}
"""
)


def test_agents_that_link_each_other_are_deleted_together_not_alone(cli: Cli) -> None:
    cli("apply", "-n", cli.ns, "-f", "-", input=MUTUAL)
    alone = cli("delete", "agent", "a", "-n", cli.ns, check=2)
    assert "it is referenced by Agent 'b' (spec.links[0])" in alone.stderr
    done = cli("delete", "agent", "a", "b", "-n", cli.ns)
    assert done.stdout.splitlines() == ["agent/a deleted", "agent/b deleted"]
    assert cli("get", "agents", "-n", cli.ns).stdout == ""
    # from a file, with the model both use
    cli("apply", "-n", cli.ns, "-f", "-", input=MUTUAL)
    done = cli("delete", "-n", cli.ns, "-f", cli.file("mutual.yaml", MUTUAL))
    assert done.stdout.splitlines() == [
        "modelendpoint/m deleted",
        "agent/a deleted",
        "agent/b deleted",
    ]
    # one still referenced from outside the group stays, with its reason
    cli("apply", "-n", cli.ns, "-f", "-", input=MUTUAL + "---\n" + AGENTS)
    partial = cli("delete", "-n", cli.ns, "-f", cli.file("mutual.yaml", MUTUAL), check=2)
    assert partial.stdout.splitlines() == ["agent/a deleted", "agent/b deleted"]
    assert "referenced by Agent 'x'" in partial.stderr
    assert names(cli("get", "agents", "-n", cli.ns).stdout) == ["x", "y"]
    assert names(cli("get", "modelendpoints", "-n", cli.ns).stdout) == ["m"]


def linked(links: dict[str, list[str]]) -> str:
    """The model and one agent per entry of ``links``, linking the agents it names."""
    agents = [
        f"apiVersion: corral/v1\nkind: Agent\nmetadata: {{name: {name}}}\n"
        f"spec: {{model: m, links: [{', '.join(to)}]}}\n"
        for name, to in links.items()
    ]
    return "---\n".join([MODEL, *agents])


RING = 150  # more than one POST /v1/resources/delete takes (MAX_DELETED_TOGETHER)


def test_a_ring_of_more_agents_than_one_request_deletes_goes_whole_or_stays_with_a_hint(
    cli: Cli,
) -> None:
    """Each agent of the ring is referenced by the one before it: none goes alone, and
    the ring goes in one transaction or not at all. Embedded, the store takes it whole;
    the server takes at most 100 at once, so the remote CLI deletes nothing and says
    what to do."""
    ring = {f"r{n}": [f"r{(n + 1) % RING}"] for n in range(RING)}
    cli("apply", "-n", cli.ns, "-f", "-", input=linked(ring))
    asked = ["delete", "agents", *ring, "-n", cli.ns]
    if cli.mode == "embedded":
        assert len(cli(*asked).stdout.splitlines()) == RING
        assert cli("get", "agents", "-n", cli.ns).stdout == ""
        return
    done = cli(*asked, check=2)
    assert done.stdout == ""
    assert done.stderr.count("remove some of the references among them") == RING
    assert "one of 150 resources refused alone, more than the 100" in done.stderr
    assert "r0' in namespace" in done.stderr and "referenced by Agent 'r149'" in done.stderr
    assert len(names(cli("get", "agents", "-n", cli.ns).stdout)) == RING


def test_more_linked_pairs_than_one_request_deletes_are_all_deleted(cli: Cli) -> None:
    pairs: dict[str, list[str]] = {}
    for n in range(RING // 2):
        pairs |= {f"a{n}": [f"b{n}"], f"b{n}": [f"a{n}"]}
    cli("apply", "-n", cli.ns, "-f", "-", input=linked(pairs))
    done = cli("delete", "agents", *pairs, "-n", cli.ns)
    assert sorted(done.stdout.splitlines()) == sorted(f"agent/{name} deleted" for name in pairs)
    assert cli("get", "agents", "-n", cli.ns).stdout == ""


def test_delete_says_what_it_needs(cli: Cli) -> None:
    assert "say what to delete" in cli("delete", check=2).stderr
    assert "name what to delete" in cli("delete", "agent", check=2).stderr
    both = cli("delete", "agent", "x", "-f", cli.file("a.yaml", ALL), check=2)
    assert "not both" in both.stderr
    bad = cli("delete", "-f", cli.file("bad.yaml", "kind: Agent\n"), check=2)
    assert "bad.yaml:1" in bad.stderr


def test_remote_delete_from_a_file_of_another_namespace_is_refused(
    live: LiveServer, tmp_path: Path
) -> None:
    env = {**_env(tmp_path), "CORRAL_URL": live.url, "CORRAL_TOKEN": live.mint("mine", "admin")}
    cli = Cli("remote", env, "mine", tmp_path)
    cli("apply", "-f", "-", input=ALL)
    other = ALL.replace("metadata: {name: m}", "metadata: {name: m, namespace: theirs}")
    done = cli("delete", "-f", "-", input=other, check=2)
    assert "not found in namespace 'theirs': the token works in namespace 'mine' only" in (
        done.stderr
    )
    assert names(cli("get", "modelendpoints").stdout) == ["m"]


# --------------------------------------------------------------------------- get -A


def test_get_all_namespaces_shows_a_namespace_column(tmp_path: Path) -> None:
    cli = Cli("embedded", _env(tmp_path), "default", tmp_path)
    for ns in ("zeta", "alpha"):
        cli("apply", "-n", ns, "-f", "-", input=ALL)
    table = rows(cli("get", "agents", "-A").stdout)
    assert table[0][:2] == ["NAMESPACE", "NAME"]
    assert [row[:2] for row in table[1:]] == [
        ["alpha", "x"],
        ["alpha", "y"],
        ["zeta", "x"],
        ["zeta", "y"],
    ]
    assert cli("get", "agents", "--all-namespaces", "-o", "name").stdout.count("agent/x") == 2
    # an agent's runs are its namespace's, whatever another namespace's agent is called
    cli("run", "x", "hello", "-n", "alpha")
    header, *lines = cli("get", "agents", "-A", "-o", "wide").stdout.splitlines()
    at = header.index(" RUNS ") + 1  # columns line up: the cell under the header
    assert [(*line.split()[:2], line[at:].split()[0]) for line in lines] == [
        ("alpha", "x", "1"),
        ("alpha", "y", "0"),
        ("zeta", "x", "0"),
        ("zeta", "y", "0"),
    ]
    assert "across all namespaces" in cli("get", "agent", "x", "-A", check=2).stderr
    assert cli("get", "tools", "-A").stderr.strip() == "No resources found."


def test_get_all_namespaces_remote_is_what_the_token_may_see(
    live: LiveServer, tmp_path: Path
) -> None:
    admin = {**_env(tmp_path), "CORRAL_URL": live.url}
    for ns in ("blue", "green"):
        Cli("remote", {**admin, "CORRAL_TOKEN": live.mint(ns, "admin")}, ns, tmp_path)(
            "apply", "-f", "-", input=ALL
        )
    viewer = Cli("remote", {**admin, "CORRAL_TOKEN": live.mint("blue", "viewer")}, "blue", tmp_path)
    table = rows(viewer("get", "agents", "-A").stdout)
    assert table[0][:2] == ["NAMESPACE", "NAME"]
    assert [row[:2] for row in table[1:]] == [["blue", "x"], ["blue", "y"]]


# --------------------------------------------------------------------------- get -l


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("team=a", ["x"]),
        ("team==a", ["x"]),
        ("team!=a", ["y"]),
        ("team", ["x", "y"]),
        ("!équipe", ["y"]),
        ("équipe=café", ["x"]),
        ("team=a,équipe=café", ["x"]),
        ("team=a,équipe!=café", []),
    ],
)
def test_get_filters_by_label_selector(cli: Cli, selector: str, expected: list[str]) -> None:
    cli("apply", "-n", cli.ns, "-f", "-", input=ALL)
    done = cli("get", "agents", "-n", cli.ns, "-l", selector)
    assert names(done.stdout) == expected
    listed = cli("get", "agents", "-n", cli.ns, "--selector", selector, "-o", "yaml").stdout
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(listed) if d] == expected


@pytest.mark.parametrize("selector", ["=a", "team=a=b", "a,,b", "team!", "x" * 2000, "t\x01"])
def test_a_malformed_selector_is_exit_2(cli: Cli, selector: str) -> None:
    done = cli("get", "agents", "-n", cli.ns, "-l", selector, check=2)
    assert "label selector" in done.stderr


def test_a_selector_and_a_name_do_not_go_together(cli: Cli) -> None:
    assert "cannot go together" in cli("get", "agent", "x", "-l", "a=b", check=2).stderr


def test_the_api_filters_by_selector(live: LiveServer) -> None:
    token = live.mint("api-selector", "admin")
    with live.client(token) as client:
        client.post(
            "/v1/resources", content=ALL, headers={"Content-Type": "application/yaml"}
        ).raise_for_status()
        listed = client.get("/v1/resources", params={"kind": "agents", "selector": "équipe=café"})
        assert [r["metadata"]["name"] for r in listed.json()["items"]] == ["x"]
        paged = client.get("/v1/resources", params={"selector": "team", "limit": 1})
        assert [r["metadata"]["name"] for r in paged.json()["items"]] == ["x"]
        cursor = paged.json()["next_cursor"]
        rest = client.get("/v1/resources", params={"selector": "team", "cursor": cursor})
        assert [r["metadata"]["name"] for r in rest.json()["items"]] == ["y"]
        bad = client.get("/v1/resources", params={"selector": "team=a=b"})
        assert bad.status_code == 422
        assert bad.json()["errors"][0]["field"] == "query.selector"
        dry = client.post(
            "/v1/resources",
            params={"dry_run": "true"},
            content=ALL.replace("team: b", "team: c"),
            headers={"Content-Type": "application/yaml"},
        )
        assert [o["action"] for o in dry.json()["outcomes"]] == [
            "unchanged",
            "unchanged",
            "configured",
        ]
        stored = client.get("/v1/resources/agent/y").json()
        assert stored["metadata"]["labels"] == {"team": "b"}


# --------------------------------------------------------------------------- describe KIND


def test_describe_a_kind_describes_each_resource(cli: Cli) -> None:
    cli("apply", "-n", cli.ns, "-f", "-", input=ALL)
    done = cli("describe", "agents", "-n", cli.ns)
    blocks = done.stdout.strip().split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == ["Name:        x", "Name:        y"]
    assert "Labels:      team=a, équipe=café" in blocks[0]
    used = cli("describe", "modelendpoint", "-n", cli.ns).stdout
    assert "Used by:     agent/x (spec.model), agent/y (spec.model)" in used
    only = cli("describe", "agents", "-n", cli.ns, "-l", "team=b").stdout
    assert only.startswith("Name:        y") and "Name:        x" not in only
    empty = cli("describe", "tools", "-n", cli.ns)
    assert empty.stdout == "" and empty.stderr.startswith("No resources found")


# --------------------------------------------------------------------------- get -w


class Watching:
    """A running ``corral get -w``: its stdout lines as they come."""

    def __init__(self, cli: Cli, *args: str) -> None:
        self.process = subprocess.Popen(
            [*CORRAL, "get", *args, "-w", "--watch-interval", "0.1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli.process_env(),
        )
        self.lines: queue.Queue[str] = queue.Queue()
        assert self.process.stdout is not None
        stdout = self.process.stdout
        threading.Thread(
            target=lambda: [self.lines.put(line) for line in stdout], daemon=True
        ).start()

    def until(self, name: str, wanted: str = "", timeout: float = 30.0) -> list[str]:
        """The lines read until the row of ``name`` (one containing ``wanted``)."""
        seen: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.process.kill()
                raise AssertionError(f"no row of {name} with {wanted!r} in {seen}") from None
            seen.append(line.rstrip("\n"))
            if line.split()[:1] == [name] and wanted in line:
                return seen

    def interrupt(self) -> tuple[int, str]:
        self.process.send_signal(signal.SIGINT)
        _, stderr = self.process.communicate(timeout=30)
        return self.process.returncode, stderr


def test_get_watch_prints_a_change_as_it_happens(cli: Cli) -> None:
    cli("apply", "-n", cli.ns, "-f", "-", input=ALL)
    watching = Watching(cli, "agents", "-n", cli.ns, "-o", "wide")
    first = watching.until("y")
    assert first[0].split()[:3] == ["NAME", "NAMESPACE", "MODEL"]
    cli("apply", "-n", cli.ns, "-f", "-", input=ALL.replace("team: b", "team: c"))
    changed = watching.until("y", "team=c")
    assert changed[-1].split()[0] == "y"
    assert "NAME" not in "".join(changed)  # rows only, under the first header
    cli("apply", "-n", cli.ns, "-f", "-", input=ALL.replace("name: y", "name: w"))
    assert watching.until("w")[-1].split()[0] == "w"
    cli("delete", "agent", "w", "-n", cli.ns)  # gone: its last row, once
    assert watching.until("w", "team=b")[-1].split()[0] == "w"
    code, stderr = watching.interrupt()
    assert code == 0, stderr
    assert "Traceback" not in stderr


def test_get_watch_ends_at_its_timeout(cli: Cli) -> None:
    done = cli(
        "get", "agents", "-n", cli.ns, "-w", "--watch-timeout", "0.2", "--watch-interval", "0.05"
    )
    assert done.stdout == "" and done.stderr.startswith("No resources found")


def test_the_client_sends_selectors_and_dry_runs(live: LiveServer) -> None:
    from corral.client import Client

    with Client(live.url, live.mint("client-kubectl", "admin")) as client:
        planned = client.apply(ALL, dry_run=True)
        assert [o.action for o in planned.outcomes] == ["created"] * 3
        assert client.list_resources().items == []
        client.apply(ALL)
        chosen = client.list_resources("agents", selector="team!=a")
        assert [r.metadata.name for r in chosen.items] == ["y"]
        walked = client.iter_resources(selector="équipe", page_size=1)
        assert [r.metadata.name for r in walked] == ["x"]
