"""Contexts, shell completion and ``--version``: real ``corral`` processes, a real server.

Each test has a config directory of its own (``XDG_CONFIG_HOME``); the remote
tests share one ``corral serve`` subprocess, whose admin token works in namespace
``default`` and a second token in ``team-a``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from cli_harness import invoke
from corral import __version__
from test_cli_run import CALC

CORRAL = [sys.executable, "-m", "corral"]


@dataclass
class Cli:
    """``corral`` with a config directory and a store of its own, and no CORRAL_ settings."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "xdg" / "corral" / "config.yaml"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        env.update(XDG_CONFIG_HOME=str(self.root / "xdg"), CORRAL_HOME=str(self.root / "home"))
        env.update(extra)
        return env

    def __call__(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        done = invoke(args, self.env(**env))
        assert "Traceback" not in done.stderr, done.stderr
        return done


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


@dataclass
class Server:
    url: str
    admin: str  # namespace default
    team_a: str  # namespace team-a


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("server")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(CORRAL_HOME=str(home), XDG_CONFIG_HOME=str(home / "xdg"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [*CORRAL, "serve", "--port", str(port), "--workers", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "corral serve did not start"
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        made = subprocess.run(
            [*CORRAL, "token", "create", "-n", "team-a", "--role", "admin"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        admin = (home / "admin.token").read_text().strip()
        yield Server(url, admin, made.stdout.strip().splitlines()[-1])
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def _unreachable_url() -> str:
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


# --------------------------------------------------------------------------- precedence


def test_the_server_comes_from_the_flag_then_the_environment_then_the_context(cli: Cli) -> None:
    from_context, from_env, from_flag = (_unreachable_url() for _ in range(3))
    assert cli("context", "set", "far", "--url", from_context).returncode == 0

    def reached(*args: str, **env: str) -> str:
        done = cli(*args, "get", "agents", **env)
        assert done.returncode == 1, done.stderr
        return done.stderr

    assert f"cannot reach the Corral API at {from_context}" in reached()
    assert f"at {from_env}" in reached(CORRAL_URL=from_env)
    assert f"at {from_flag}" in reached("--url", from_flag, CORRAL_URL=from_env)
    # CORRAL_URL set but empty: the local store, whatever the context says
    assert cli("get", "agents", CORRAL_URL="").returncode == 0


def test_the_token_comes_from_the_flag_then_the_environment_then_the_context(
    cli: Cli, server: Server, tmp_path: Path
) -> None:
    token_file = tmp_path / "admin.token"
    token_file.write_text(server.admin + "\n")
    token_file.chmod(0o600)
    set_up = cli("context", "set", "prod", "--url", server.url, "--token-file", str(token_file))
    assert set_up.returncode == 0
    assert cli("get", "agents").returncode == 0  # the context's token
    refused = cli("get", "agents", CORRAL_TOKEN="corral_bogus_bogus")
    assert refused.returncode == 2 and "token" in refused.stderr  # the environment's
    assert cli("--token", server.admin, "get", "agents", CORRAL_TOKEN="corral_x_y").returncode == 0
    # the context's token is never sent to a server the context did not name
    assert cli("get", "agents", CORRAL_URL=server.url).returncode == 2


def test_the_namespace_comes_from_the_flag_then_the_context(cli: Cli, tmp_path: Path) -> None:
    calc = tmp_path / "calc.yaml"
    calc.write_text(CALC)
    assert cli("context", "set", "dev", "-n", "dev").returncode == 0  # no url: the local store
    assert cli("apply", "-f", str(calc)).returncode == 0
    assert "calc" in cli("get", "agents").stdout
    assert "calc" in cli("get", "agents", "-n", "dev").stdout
    assert "calc" not in cli("get", "agents", "-n", "default").stdout
    assert "calc" not in cli("get", "agents", CORRAL_URL="", CORRAL_HOME=str(tmp_path / "x")).stdout


def test_a_context_named_by_the_flag_wins_over_the_current_one(cli: Cli) -> None:
    far = _unreachable_url()
    assert cli("context", "set", "far", "--url", far).returncode == 0
    assert cli("context", "set", "here").returncode == 0
    assert cli("context", "current").stdout.strip() == "far"  # the first one set
    assert cli("--context", "here", "get", "agents").returncode == 0
    unknown = cli("--context", "nope", "get", "agents")
    assert unknown.returncode == 2
    assert "no context 'nope'" in unknown.stderr and "far, here" in unknown.stderr


# --------------------------------------------------------------------------- remote -n


def test_a_namespace_the_token_cannot_work_in_is_exit_2(
    cli: Cli, server: Server, tmp_path: Path
) -> None:
    env = {"CORRAL_URL": server.url, "CORRAL_TOKEN": server.team_a}
    assert cli("get", "agents", "-n", "team-a", **env).returncode == 0
    assert cli("get", "agents", **env).returncode == 0  # no -n: the token's namespace
    calc = tmp_path / "calc.yaml"
    calc.write_text(CALC)
    assert cli("apply", "-f", str(calc), **env).returncode == 0  # into team-a
    assert "calc" in cli("get", "agents", "-n", "team-a", **env).stdout
    assert cli("apply", "-f", str(calc), "-n", "default", **env).returncode == 2
    refused = cli("get", "agents", "-n", "default", **env)
    assert refused.returncode == 2
    assert "namespace 'default' (from -n) is not the token's" in refused.stderr
    assert "'team-a'" in refused.stderr
    assert cli("tasks", "list", "-n", "other", **env).returncode == 2
    assert cli("run", "calc", "hi", "-n", "other", **env).returncode == 2
    # a context's namespace is checked the same way
    cli("context", "set", "a", "--url", server.url, "--token", server.team_a, "-n", "default")
    from_context = cli("get", "agents")
    assert from_context.returncode == 2 and "from context 'a'" in from_context.stderr


def test_remote_apply_problems_name_the_file_and_line(
    cli: Cli, server: Server, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        "apiVersion: corral/v1\nkind: Tool\nmetadata: {name: fine}\n"
        "spec: {type: python, python: {function: 'operator:add'}}\n---\n"
        "apiVersion: corral/v1\nkind: Agent\nmetadata: {name: lost}\nspec:\n"
        "  model: nowhere\n  tools: [fine, missing]\n"
    )
    for env in ({}, {"CORRAL_URL": server.url, "CORRAL_TOKEN": server.admin}):
        done = cli("apply", "-f", str(broken), **env)
        assert done.returncode == 2, done.stderr
        assert f"{broken}:10, field 'spec.model'" in done.stderr, env
        assert f"{broken}:11, field 'spec.tools[1]'" in done.stderr, env


def test_store_commands_refuse_a_context_with_a_server(cli: Cli) -> None:
    assert cli("context", "set", "far", "--url", _unreachable_url()).returncode == 0
    refused = cli("token", "list")
    assert refused.returncode == 2 and "context 'far' names the server" in refused.stderr
    assert cli("token", "list", CORRAL_URL="").returncode == 0


# --------------------------------------------------------------------------- context commands


def test_contexts_are_written_0600_and_listed(cli: Cli) -> None:
    done = cli("context", "set", "prod", "--url", "https://corral.example.com/", "-n", "team-a")
    assert done.returncode == 0 and "created (current)" in done.stdout
    assert stat.S_IMODE(cli.config.stat().st_mode) == 0o600
    assert stat.S_IMODE(cli.config.parent.stat().st_mode) == 0o700
    assert cli("context", "set", "dev", "--token", "corral_a_b").returncode == 0
    lines = cli("context", "list").stdout.splitlines()
    assert lines[0].split() == ["CURRENT", "NAME", "URL", "NAMESPACE", "TOKEN"]
    assert lines[1].split() == ["dev", "(local", "store)", "default", "inline"]
    assert lines[2].split() == ["*", "prod", "https://corral.example.com", "team-a", "-"]
    listed = json.loads(cli("context", "list", "-o", "json").stdout)
    assert [(c["name"], c["current"], c["token"]) for c in listed] == [
        ("dev", False, "inline"),
        ("prod", True, "-"),
    ]
    as_yaml = cli("context", "list", "-o", "yaml").stdout
    assert yaml.safe_load(as_yaml) == listed and "corral_a_b" not in as_yaml
    assert cli("context", "list", "-o", "name").stdout.split() == ["context/dev", "context/prod"]
    assert cli("context", "use", "dev").stdout.strip() == "current context: dev"
    assert cli("context", "current").stdout.strip() == "dev"
    assert cli("context", "delete", "dev").returncode == 0
    none = cli("context", "current")
    assert none.returncode == 1 and "no current context" in none.stderr


def test_unicode_context_names_round_trip(cli: Cli) -> None:
    assert cli("context", "set", "生产-é").returncode == 0
    assert cli("context", "set", "δοκιμή").returncode == 0
    assert cli("context", "use", "δοκιμή").returncode == 0
    assert cli("context", "current").stdout.strip() == "δοκιμή"
    assert "生产-é" in cli("context", "list").stdout
    assert cli("--context", "生产-é", "get", "agents").returncode == 0
    for bad in ("with space", "tab\there", "", "x" * 129):
        refused = cli("context", "set", bad)
        assert refused.returncode == 2, bad


def test_context_set_refuses_bad_values(cli: Cli) -> None:
    assert cli("context", "set", "a", "--url", "ftp://x").returncode == 2
    assert cli("context", "set", "a", "--url", "not a url").returncode == 2
    assert cli("context", "set", "a", "-n", "Bad_NS").returncode == 2
    assert cli("context", "set", "a", "--token", "t", "--token-file", "f").returncode == 2
    assert cli("context", "use", "nope").returncode == 2
    assert cli("context", "delete", "nope").returncode == 2
    plain = cli("context", "set", "a", "--url", "http://corral.example.com")
    assert plain.returncode == 0 and "plain HTTP" in plain.stderr
    assert "plain HTTP" not in cli("context", "set", "b", "--url", "http://127.0.0.1:1").stderr


# --------------------------------------------------------------------------- hostile config


def _write_config(cli: Cli, text: str | bytes, mode: int = 0o600) -> None:
    cli.config.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, str):
        text = text.encode()
    cli.config.write_bytes(text)
    cli.config.chmod(mode)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("contexts: {a: [unclosed\n", "invalid YAML"),
        ("contexts:\n  a:\n    url: x\n   bad: indent\n", "invalid YAML"),
        (
            "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
            "c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\ncontexts: {}\n",
            "aliases (*name) are not allowed",
        ),
        ("contexts: " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper than"),
        ("- a list\n", "expected a mapping"),
        ("contexts: {a: {urll: x}}\n", "unknown field 'urll'"),
        ("current-context: [a]\n", "current-context must be"),
        ("contexts: {a: {url: 5}}\n", "url must be text"),
        ("contexts: {a: {token: t, token-file: f}}\n", "not both"),
        (b"contexts: {\xff: {}}\n", "not UTF-8"),
        ("current-context: gone\ncontexts: {}\n", "no context 'gone'"),
        ("contexts: {a: 1}\n" + "#" * 70_000, "larger than"),
    ],
)
def test_a_bad_config_file_is_one_line_and_exit_2(cli: Cli, text: str | bytes, says: str) -> None:
    _write_config(cli, text)
    done = cli("get", "agents")
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    if "no context" in says:  # the file is fine: only the current context is missing
        assert cli("context", "list").returncode == 0
    else:
        assert str(cli.config) in done.stderr
        assert cli("context", "list").returncode == 2


def test_a_config_others_may_read_is_refused(cli: Cli) -> None:
    _write_config(cli, "contexts: {a: {token: corral_x_y}}\n", mode=0o644)
    done = cli("context", "list")
    assert done.returncode == 2
    assert "may be read by others (mode 0644)" in done.stderr
    assert f"chmod 600 {cli.config}" in done.stderr
    cli.config.chmod(0o600)
    assert cli("context", "list").returncode == 0


def test_a_missing_or_empty_token_file_is_exit_2(cli: Cli, tmp_path: Path) -> None:
    missing = tmp_path / "missing.token"
    cli("context", "set", "a", "--url", _unreachable_url(), "--token-file", str(missing))
    done = cli("get", "agents")
    assert done.returncode == 2
    assert f"token file '{missing}' does not exist" in done.stderr
    missing.write_text("\n")
    missing.chmod(0o600)
    assert "is empty" in cli("get", "agents").stderr
    missing.write_text("corral_a_b\n")
    missing.chmod(0o644)
    readable = cli("get", "agents")
    assert readable.returncode == 1  # used (the server is unreachable), with a warning
    assert "readable by others" in readable.stderr


def test_flags_and_environment_that_settle_everything_skip_a_broken_config(cli: Cli) -> None:
    _write_config(cli, "contexts: [\n")
    assert cli("--version").returncode == 0
    assert cli("completion", "bash").returncode == 0
    done = cli("get", "agents", CORRAL_URL=_unreachable_url())
    assert done.returncode == 1 and "cannot reach" in done.stderr


# --------------------------------------------------------------------------- shell integration


def test_version_flag_prints_the_version(cli: Cli) -> None:
    done = cli("--version")
    assert (done.returncode, done.stdout) == (0, f"corral {__version__}\n")
    assert cli("version").stdout == done.stdout


@pytest.mark.parametrize(
    ("shell", "marker"),
    [
        ("bash", "complete -o default -F _corral_completion corral"),
        ("zsh", "compdef _corral_completion corral"),
        ("fish", "complete --command corral"),
    ],
)
def test_completion_scripts_are_printed_for_each_shell(cli: Cli, shell: str, marker: str) -> None:
    done = cli("completion", shell)
    assert done.returncode == 0, done.stderr
    assert marker in done.stdout
    assert f"_CORRAL_COMPLETE=complete_{shell}" in done.stdout


def test_completion_of_an_unknown_shell_is_exit_2(cli: Cli) -> None:
    done = cli("completion", "tcsh")
    assert done.returncode == 2 and "tcsh" in done.stderr


def test_the_bash_script_completes_commands_and_context_names(cli: Cli, tmp_path: Path) -> None:
    # the script calls `corral` by name: a `corral` on PATH that is this checkout's
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "corral"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m corral "$@"\n')
    wrapper.chmod(0o755)
    assert cli("context", "set", "staging").returncode == 0
    assert cli("context", "set", "stable").returncode == 0
    script = tmp_path / "corral.bash"
    script.write_text(cli("completion", "bash").stdout)

    def complete(*words: str) -> list[str]:
        program = (
            f"source {script}; COMP_WORDS=(corral {' '.join(words)}); "
            f"COMP_CWORD={len(words)}; _corral_completion corral; printf '%s\\n' \"${{COMPREPLY[@]}}\""
        )
        env = cli.env(PATH=f"{bin_dir}:{os.environ['PATH']}")
        done = subprocess.run(
            ["bash", "-c", program], capture_output=True, text=True, env=env, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert complete("cont") == ["context"]
    assert complete("context", "u") == ["use"]
    assert sorted(complete("context", "use", "sta")) == ["stable", "staging"]
    assert sorted(complete("--context", "sta")) == ["stable", "staging"]
