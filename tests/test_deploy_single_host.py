"""The single-host recipe of docs/deploy.md, run as far as a test machine can.

- The systemd units under ``deploy/systemd/`` pass ``systemd-analyze verify``.
  verify insists that ``ExecStart``'s program exists; ``/opt/corral/venv/bin/corral``
  does not on a test machine, so the units are verified as shipped (the only finding
  allowed is that missing program) and again with the path pointing at this
  checkout's ``corral``. Their ``corral`` arguments are checked by ``corral`` itself.
- The backup commands run against real stores: ``sqlite3 .backup`` of a live SQLite
  store and ``pg_dump``/``pg_restore`` of a PostgreSQL one; ``corral`` reads the copy.

``systemd-analyze``, ``sqlite3`` and ``pg_dump`` come with the machine (``.ci/run``
installs what is missing); a missing one fails the test rather than skipping it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from databases import PostgresServer
from test_cli_run import CALC

ROOT = Path(__file__).parent.parent
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
SHIPPED_CORRAL = "/opt/corral/venv/bin/corral"
CORRAL = [sys.executable, "-m", "corral"]


def _tool(name: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} is not installed (.ci/run installs it)"
    return found


def _corral_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_URL"] = ""  # the local store, whatever context the user's config names
    env.update(extra)
    return env


def _corral(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CORRAL, *args], capture_output=True, text=True, env=_corral_env(**env), timeout=120
    )


def test_the_units_are_the_serve_and_worker_units() -> None:
    assert [unit.name for unit in UNITS] == ["corral-serve.service", "corral-worker.service"]


def test_the_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = _tool("systemd-analyze")
    shipped = subprocess.run(
        [analyze, "verify", *map(str, UNITS)], capture_output=True, text=True, timeout=120
    )
    findings = [line for line in shipped.stderr.splitlines() if line.strip()]
    assert findings, "verify found the shipped ExecStart program: is this a deployed host?"
    assert all(f"Command {SHIPPED_CORRAL} is not executable" in line for line in findings), (
        shipped.stderr
    )

    program = tmp_path / "corral"
    program.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m corral "$@"\n')
    program.chmod(0o755)
    local = []
    for unit in UNITS:
        text = unit.read_text()
        assert text.count(SHIPPED_CORRAL) == 1
        copy = tmp_path / unit.name
        copy.write_text(text.replace(SHIPPED_CORRAL, str(program)))
        local.append(str(copy))
    verified = subprocess.run(
        [analyze, "verify", *local], capture_output=True, text=True, timeout=120
    )
    assert (verified.returncode, verified.stderr) == (0, "")


@pytest.mark.parametrize("unit", UNITS, ids=lambda unit: unit.name)
def test_the_units_corral_arguments_are_ones_corral_takes(unit: Path) -> None:
    [exec_start] = [
        line.split("=", 1)[1]
        for line in unit.read_text().splitlines()
        if line.startswith("ExecStart=")
    ]
    program, *arguments = shlex.split(exec_start)
    assert program == SHIPPED_CORRAL
    # --help after the arguments: click rejects an unknown option or value type first
    done = _corral(*arguments, "--help")
    assert done.returncode == 0, done.stderr


def test_sqlite_backup_is_a_store_corral_reads(tmp_path: Path) -> None:
    sqlite3 = _tool("sqlite3")
    home = tmp_path / "home"
    calc = tmp_path / "calc.yaml"
    calc.write_text(CALC)
    assert _corral("apply", "-f", str(calc), CORRAL_HOME=str(home)).returncode == 0
    submitted = _corral("submit", "calc", "What is 2 + 3?", CORRAL_HOME=str(home))
    assert submitted.returncode == 0, submitted.stderr
    backup = tmp_path / "backups" / "corral-backup.db"
    backup.parent.mkdir()
    # the command of docs/deploy.md, on the live store (WAL mode: readers keep reading)
    done = subprocess.run(
        [sqlite3, str(home / "corral.db"), f".backup '{backup}'"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stderr) == (0, "")
    check = subprocess.run(
        [sqlite3, str(backup), "PRAGMA integrity_check"], capture_output=True, text=True
    )
    assert check.stdout.strip() == "ok"

    restored_home = tmp_path / "restored"
    restored = {"CORRAL_HOME": str(restored_home), "CORRAL_DB_URL": f"sqlite:///{backup}"}
    assert "calc" in _corral("get", "agents", **restored).stdout
    assert "queued" in _corral("tasks", "list", **restored).stdout


def test_pg_dump_backup_restores_into_a_store_corral_reads(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    pg_dump, pg_restore = _tool("pg_dump"), _tool("pg_restore")
    source, target = postgres.create(migrated=False), postgres.create(migrated=False)
    try:
        home = tmp_path / "home"
        calc = tmp_path / "calc.yaml"
        calc.write_text(CALC)
        env = {"CORRAL_HOME": str(home), "CORRAL_DB_URL": postgres.url(source)}
        applied = _corral("apply", "-f", str(calc), **env)
        assert applied.returncode == 0, applied.stderr
        dump = tmp_path / "corral.dump"
        # the commands of docs/deploy.md
        subprocess.run(
            [pg_dump, "--format=custom", f"--file={dump}", postgres.url(source)],
            check=True,
            timeout=120,
        )
        subprocess.run(
            [pg_restore, "--no-owner", f"--dbname={postgres.url(target)}", str(dump)],
            check=True,
            timeout=120,
        )
        restored = _corral("get", "agents", **{**env, "CORRAL_DB_URL": postgres.url(target)})
        assert restored.returncode == 0, restored.stderr
        assert "calc" in restored.stdout
    finally:
        postgres.drop(source)
        postgres.drop(target)
