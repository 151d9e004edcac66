"""``corral worker`` processes on a scratch store: what ``scaleout.py`` and ``sysruns.py`` share.

Both sections measure real worker processes on SQLite and on PostgreSQL + NATS
JetStream, each configuration of each round in a driver child of its own
(``X.py --child ...``) on a fresh store. What differs is only what the driver
submits and times; this module is the rest, once:

- the parent: the servers' URLs (``CORRAL_BENCH_POSTGRES_URL``,
  ``CORRAL_BENCH_NATS_URL``), whether they accept connections (a row that cannot
  run says "not reachable"), a :func:`scratch` database and NATS prefix per
  measurement (dropped and deleted whatever the driver did), the driver child
  (:func:`measure_in_child`) and the rounds over every configuration
  (:func:`measure_rounds`);
- the driver: its common arguments (:func:`child_parser`), the environment and
  options of its workers (:func:`worker_env`, :func:`worker_options`), the
  :class:`Workers` themselves (they get SIGTERM when the driver dies) and
  :func:`wait_succeeded`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from _common import BENCH, run_child, scratch_database

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"

#: a worker process started so that it gets SIGTERM when its parent (the driver) dies
LAUNCHER = (
    "import ctypes, os, signal, sys; "
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM); "  # PR_SET_PDEATHSIG
    "os.getppid() == int(sys.argv[1]) or sys.exit('the driver is gone'); "
    "os.execv(sys.executable, [sys.executable, '-m', 'corral', 'worker', *sys.argv[2:]])"
)

#: ``(key, store, workers)``: one configuration of a section (store: sqlite, postgres, nats)
Configuration = tuple[str, str, int]


# --------------------------------------------------------------------------- the driver (a child)


def child_parser(stores: Sequence[str]) -> argparse.ArgumentParser:
    """The arguments every driver child takes (:func:`measure_in_child` passes them); a
    section adds its own."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", choices=sorted(stores), required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--nats-url", default="")
    parser.add_argument("--prefix", default="")
    parser.add_argument("--home", required=True)
    parser.add_argument("--within", type=float, required=True)
    return parser


def worker_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment of the driver's workers: none of the driver's own ``CORRAL_*``,
    the scratch store, and on ``nats`` the bus and its prefix."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(CORRAL_HOME=args.home, CORRAL_DB_URL=args.db_url)
    if args.store == "nats":
        env.update(CORRAL_NATS_URL=args.nats_url, CORRAL_NATS_PREFIX=args.prefix)
    return env


def worker_options(concurrency: int) -> list[str]:
    """``corral worker``'s options: ``concurrency`` slots, a short drain when stopped."""
    return ["--concurrency", str(concurrency), "--grace-seconds", "5"]


class Workers:
    """``count`` ``corral worker`` processes on one store (and bus), logs in ``home``."""

    def __init__(self, home: Path, env: dict[str, str], count: int, options: list[str]) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        for n in range(count):
            log = home / f"worker-{n}.log"
            with log.open("wb") as out:
                self.processes.append(
                    subprocess.Popen(
                        [sys.executable, "-c", LAUNCHER, str(os.getpid()), *options],
                        env=env,
                        cwd=home,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
            self.logs.append(log)

    async def started(self, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        while not all("started" in log.read_text(errors="replace") for log in self.logs):
            for process, log in zip(self.processes, self.logs, strict=True):
                if process.poll() is not None:
                    raise RuntimeError(f"a worker exited: {log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not start in time")
            await asyncio.sleep(0.05)

    def up_at(self) -> float:
        """When the last of the workers said it started (its log line's time, as
        ``time.time()``); 0 when a log line does not say it in the expected form."""
        stamps = []
        for log in self.logs:
            for line in log.read_text(errors="replace").splitlines():
                if " started (runs from " in line:
                    try:
                        when = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                    except ValueError:
                        return 0.0  # the window then opens at the first claim
                    stamps.append(when.timestamp())  # logging's asctime is local time
                    break
        return max(stamps, default=0.0)

    def deliveries(self) -> dict[str, int]:
        """Where the workers' runs came from, as they logged it when they stopped (NATS only)."""
        said = re.compile(r"(\d+) runs taken from bus deliveries, (\d+) found by the store sweep")
        found = {"via_bus": 0, "via_sweep": 0}
        for log in self.logs:
            for match in said.finditer(log.read_text(errors="replace")):
                found["via_bus"] += int(match[1])
                found["via_sweep"] += int(match[2])
        return found

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def wait_succeeded(store: Any, count: int, deadline: float) -> None:
    """Until ``count`` runs succeeded (until ``deadline``, monotonic); a run that ended
    otherwise is an error."""
    from corral.core.runs import RunState

    while True:
        counts = await store.count_runs()
        succeeded = counts.by_state.get(("default", RunState.SUCCEEDED), 0)
        failed = sum(
            n
            for (_, state), n in counts.by_state.items()
            if state.finished and state.value != "succeeded"
        )
        if failed:
            raise RuntimeError(f"{failed} runs did not succeed")
        if succeeded >= count:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {succeeded} of {count} runs succeeded in time")
        await asyncio.sleep(0.02)


# --------------------------------------------------------------------------- the parent


def server_urls(postgres_url: str = "", nats_url: str = "") -> tuple[str, str]:
    """The PostgreSQL and NATS URLs a section measures against: those given, else
    ``CORRAL_BENCH_POSTGRES_URL`` / ``CORRAL_BENCH_NATS_URL``, else the local defaults."""
    return (
        postgres_url or os.environ.get("CORRAL_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL),
        nats_url or os.environ.get("CORRAL_BENCH_NATS_URL", DEFAULT_NATS_URL),
    )


def first_server(url: str, default_port: int) -> tuple[str, int]:
    """Host and port of the first server ``url`` names (a NATS URL may list several)."""
    parts = urlsplit(url.split(",")[0].strip())
    return parts.hostname or "127.0.0.1", parts.port or default_port


def without_password(url: str) -> str:
    """``url`` as the page may show it: any password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))


def reachable(url: str, default_port: int) -> str | None:
    """``None`` when something accepts TCP connections where ``url`` points, else why not."""
    host, port = first_server(url, default_port)
    try:
        with socket.create_connection((host, port), 2):
            return None
    except OSError:
        return f"not reachable ({host}:{port})"


async def server_versions(postgres_url: str | None, nats_url: str | None) -> dict[str, str]:
    """The versions the servers report (for the page's method)."""
    found: dict[str, str] = {}
    with suppress(Exception):
        if postgres_url:
            import asyncpg

            conn = await asyncpg.connect(postgres_url, timeout=5)
            try:
                found["postgresql"] = str(await conn.fetchval("SHOW server_version")).split()[0]
            finally:
                await conn.close()
    with suppress(Exception):
        if nats_url:
            import nats

            client = await nats.connect(nats_url, allow_reconnect=False, connect_timeout=2)
            try:
                version = client.connected_server_version
                found["nats"] = f"{version.major}.{version.minor}.{version.patch}"
            finally:
                await client.close()
    return found


@asynccontextmanager
async def scratch(store: str, postgres_url: str, nats_url: str) -> AsyncIterator[tuple[str, str]]:
    """A fresh store (and NATS prefix) for one measurement: ``(db_url, prefix)``; the
    PostgreSQL database is created beside ``postgres_url``'s and dropped, the prefix's
    streams deleted, whatever the driver did."""
    token = secrets.token_hex(4)
    prefix = f"bench_{token}" if store == "nats" else ""
    if store == "sqlite":
        yield "", prefix
        return
    async with scratch_database(postgres_url, f"corral_bench_scaleout_{token}") as db_url:
        try:
            yield db_url, prefix
        finally:
            if prefix:
                await delete_streams(nats_url, prefix)


async def delete_streams(nats_url: str, prefix: str) -> None:
    """Delete the streams a bus with ``prefix`` made (whichever exist)."""
    import nats
    import nats.js.errors

    client = await nats.connect(nats_url, allow_reconnect=False, connect_timeout=2)
    try:
        for stream in (f"{prefix}_runnable", f"{prefix}_dead"):
            with suppress(nats.js.errors.NotFoundError):
                await client.jetstream().delete_stream(stream)
    finally:
        await client.close()


def measure_in_child(
    script: str,
    store: str,
    workers: int,
    postgres_url: str,
    nats_url: str,
    more: list[str],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the bench ``script``'s driver child (``--child``, then ``more`` arguments) on a
    :func:`scratch` store with ``workers``; its figures, or ``{"error": ...}``."""

    async def go() -> dict[str, Any]:
        home = Path(tempfile.mkdtemp(prefix=f"corral-bench-{Path(script).stem}-"))
        try:
            async with scratch(store, postgres_url, nats_url) as (db_url, prefix):
                args = [
                    str(BENCH / script),
                    "--child",
                    f"--store={store}",
                    f"--workers={workers}",
                    f"--db-url={db_url or 'sqlite:///' + str(home / 'corral.db')}",
                    f"--nats-url={nats_url}",
                    f"--prefix={prefix}",
                    f"--home={home}",
                    *more,
                    # the driver gives up (and says why) a little before it would be killed
                    f"--within={timeout * 0.9:g}",
                ]
                result = await asyncio.to_thread(run_child, args, timeout=timeout, env=env)
        finally:
            shutil.rmtree(home, ignore_errors=True)
        return result.data if result.ok else {"error": result.error or "failed"}

    try:
        return asyncio.run(go())
    except Exception as exc:  # noqa: BLE001 - a server refusing the scratch set-up is a row
        return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:200]}


def availability(
    chosen: Sequence[Configuration], postgres_down: str | None, nats_down: str | None
) -> dict[str, str]:
    """``"ok"`` for each configuration whose servers accept connections, else why not:
    every store but SQLite needs PostgreSQL, ``nats`` NATS too."""
    status: dict[str, str] = {}
    for key, store, _ in chosen:
        if store != "sqlite" and postgres_down:
            status[key] = f"PostgreSQL {postgres_down}"
        elif store == "nats" and nats_down:
            status[key] = f"NATS {nats_down}"
        else:
            status[key] = "ok"
    return status


def measure_rounds(
    chosen: Sequence[Configuration],
    rounds: int,
    status: dict[str, str],
    measure_once: Callable[[str, int], dict[str, Any]],
    shown: Callable[[dict[str, Any]], str],
    log: Callable[[str], None],
    tag: str,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[str]]]:
    """Every configuration that ``status`` says can run, round after round, in turn (a
    slow moment widens the spread rather than reordering the rows): ``measure_once(store,
    workers)`` each, logged as ``{tag} {round}/{rounds} {key}: ...``. The samples and the
    errors by key; a configuration with no sample left gets its first error as status."""
    samples: dict[str, list[dict[str, Any]]] = {key: [] for key, _, _ in chosen}
    errors: dict[str, list[str]] = {key: [] for key, _, _ in chosen}
    for round_no in range(1, rounds + 1):
        for key, store, workers in chosen:
            if status[key] != "ok":
                continue
            got = measure_once(store, workers)
            if "error" in got:
                errors[key].append(got["error"])
                said = got["error"]
            else:
                samples[key].append({"round": round_no, **got})
                said = shown(got)
            log(f"{tag} {round_no}/{rounds} {key}: {said}")
    for key in status:
        if status[key] == "ok" and not samples[key]:
            status[key] = f"failed: {errors[key][0]}"
    return samples, errors
