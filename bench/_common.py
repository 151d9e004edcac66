"""What every part of the benchmark shares: statistics, tables, child processes, the machine.

Every measurement runs in a child process of its own (``python bench/X.py --child ...``),
so its peak RSS and import costs belong to one framework only and a crash of one
peer leaves the rest of the run standing. A child prints exactly one line starting
with :data:`RESULT_MARK` followed by a JSON object; :func:`run_child` reads it back.
"""

from __future__ import annotations

import gc
import json
import math
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULT_MARK = "BENCH-RESULT "


# --------------------------------------------------------------------------- statistics


def median(values: Sequence[float]) -> float:
    """The median of ``values``."""
    return statistics.median(values)


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct`` percentile of ``values`` (nearest rank, so it is always a measured value)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(pct / 100 * len(ordered))))
    return ordered[rank - 1]


def fmt(value: float, digits: int) -> str:
    """``value`` rounded to ``digits``, with thousands separators when it is large."""
    return f"{value:,.{digits}f}"


def spread(values: Sequence[float], digits: int = 2, unit: str = "") -> str:
    """``median (min-max)`` of ``values``; a single value is shown alone."""
    if not values:
        return "-"
    mid = fmt(median(values), digits) + unit
    if len(values) == 1:
        return mid
    return f"{mid} ({fmt(min(values), digits)}-{fmt(max(values), digits)})"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain Markdown table, padded so it also reads well in a terminal."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


# --------------------------------------------------------------------------- child processes


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def freeze_heap() -> None:
    """Collect, then freeze (``gc.freeze``) what a child's start-up and warm-up left alive.

    Every measuring child calls it, whatever it measures, once its framework is
    built and warm: the import-time heap (tens of thousands of objects for the
    larger frameworks) then stays out of the collections of the timed part, as
    in a long-running service - ``corral worker`` and ``corral serve`` freeze
    theirs at start-up.
    """
    gc.collect()
    gc.freeze()


def emit(result: dict[str, Any]) -> None:
    """Hand a child's result to the parent (with the child's peak RSS added)."""
    result.setdefault("rss_mb", peak_rss_mb())
    print(RESULT_MARK + json.dumps(result), flush=True)


@dataclass
class ChildResult:
    """What a child process reported, or why it reported nothing."""

    data: dict[str, Any] = field(default_factory=dict[str, Any])
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def run_child(
    args: Sequence[str], *, timeout: float, env: dict[str, str] | None = None
) -> ChildResult:
    """Run ``python ARGS`` in this interpreter's environment and read its result line.

    A child that exits non-zero, times out or prints no result becomes an error
    (its last stderr line, which is where a traceback ends); the tail of its
    stderr is echoed to ours so that a failure can be read after the run.
    """
    try:
        proc = subprocess.run(
            [sys.executable, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
            cwd=REPO,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return ChildResult(error=f"timed out after {timeout:g} s")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            data = json.loads(line[len(RESULT_MARK) :])
            if proc.returncode == 0:
                return ChildResult(data)
            break
    tail = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    if tail:
        print("\n".join(tail[-15:]), file=sys.stderr)
    # the last line of a traceback names the error; an exception group draws boxes around it
    meaningful = [t.strip().strip("|").strip() for t in tail if set(t) - set("+-| ")]
    reason = meaningful[-1] if meaningful else f"exit code {proc.returncode}"
    return ChildResult(error=reason[:200])


# --------------------------------------------------------------------------- the fake model server


class FakeServerProcess:
    """The fake OpenAI-compatible server (``bench/fake_server.py``) in a process of its own.

    One server serves every framework of a section in turn, so its CPU cost per
    model call is the same for all of them, and it never shares a GIL with the
    client being measured. It stops when its standard input closes.
    """

    def __init__(self, calls: int, delay: float = 0.0) -> None:
        self.calls = calls
        self.delay = delay
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""

    def __enter__(self) -> FakeServerProcess:
        args = [
            str(BENCH / "fake_server.py"),
            "--calls",
            str(self.calls),
            "--delay",
            str(self.delay),
        ]
        self.proc = subprocess.Popen(
            [sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.base_url = self.proc.stdout.readline().strip()
        if not self.base_url:
            self.__exit__()
            raise RuntimeError("the fake server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def server_stats(base_url: str) -> dict[str, int]:
    """The fake server's counters: requests ``served`` and ``max_in_flight`` (then reset)."""
    import httpx

    root = base_url.removesuffix("/v1")
    return dict(httpx.post(f"{root}/bench/stats", timeout=10).json())


# --------------------------------------------------------------------------- the machine


def machine() -> dict[str, str]:
    """Where the figures were taken: CPU, cores, memory, OS, Python, SQLite."""
    import sqlite3

    cpu = platform.processor() or platform.machine()
    memory = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    except OSError:
        pass
    system = platform.system()
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                system = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return {
        "cpu": f"{cpu} ({platform.machine()})",
        "cores": str(os.cpu_count()),
        "memory": memory or "unknown",
        "os": f"{system}, kernel {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "sqlite": sqlite3.sqlite_version,
        "host": socket.gethostname(),
    }


#: Every distribution whose version the report names (absent ones say "not installed").
VERSIONED = (
    "corral",
    "openai",
    "httpx",
    "anyio",
    "pydantic",
    "sqlalchemy",
    "uvicorn",
    "langgraph",
    "langgraph-prebuilt",
    "langchain-openai",
    "langchain-core",
    "openai-agents",
    "pydantic-ai-slim",
    "dbos",
    "asyncpg",
    "nats-py",
)


def versions(names: Sequence[str] = VERSIONED) -> dict[str, str]:
    """The installed version of each distribution in ``names``."""
    found: dict[str, str] = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def git_commit() -> str:
    """The commit being measured, and whether the work tree differs from it (read-only git)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "diff-index", "--quiet", "HEAD", "--"],
            cwd=REPO,
            capture_output=True,
            check=False,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" with uncommitted changes" if dirty.returncode else "")


def sqlite_commits_per_second(seconds: float = 1.0) -> float:
    """One-row write transactions per second on a fresh SQLite file (WAL, ``synchronous=FULL``).

    Every durable figure here waits for fsyncs, so this is the disk's floor under
    them at the time of the run; it is measured at the start and at the end.
    """
    import sqlite3
    import tempfile

    with tempfile.TemporaryDirectory(prefix="corral-bench-disk-") as tmp:
        db = sqlite3.connect(Path(tmp) / "probe.db", isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("CREATE TABLE t (x INTEGER)")
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                db.execute("BEGIN")
                db.execute("INSERT INTO t VALUES (?)", (count,))
                db.execute("COMMIT")
                count += 1
            return count / (time.perf_counter() - start)
        finally:
            db.close()


class LoadMonitor:
    """How busy the machine was while the benchmark ran, apart from the benchmark itself.

    It samples the 1-minute load average, and compares the CPU time the whole
    machine spent (``/proc/stat``) with what this process and its children spent
    (``getrusage``): the rest is other people's work, which is what makes a
    shared machine's figures noisy.
    """

    def __init__(self, interval: float = 5.0) -> None:
        self.interval = interval
        self.loads: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="load-monitor", daemon=True)
        self._start = (0.0, 0.0, 0.0)

    @staticmethod
    def _machine_busy_seconds() -> float:
        try:
            fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        except OSError:
            return 0.0
        ticks = [int(f) for f in fields]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
        # guest time is already counted in user time
        busy = sum(ticks[:8]) - idle
        return busy / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own_seconds() -> float:
        total = 0.0
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            usage = resource.getrusage(who)
            total += usage.ru_utime + usage.ru_stime
        return total

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.loads.append(os.getloadavg()[0])

    def __enter__(self) -> LoadMonitor:
        self.loads.append(os.getloadavg()[0])
        self._start = (time.monotonic(), self._machine_busy_seconds(), self._own_seconds())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.loads.append(os.getloadavg()[0])
        wall = time.monotonic() - self._start[0]
        busy = self._machine_busy_seconds() - self._start[1]
        own = self._own_seconds() - self._start[2]
        capacity = wall * (os.cpu_count() or 1)
        self.summary = {
            "wall_seconds": wall,
            "load_min": min(self.loads),
            "load_median": median(self.loads),
            "load_max": max(self.loads),
            "others_cpu_share": max(0.0, busy - own) / capacity if capacity else 0.0,
            "bench_cpu_share": own / capacity if capacity else 0.0,
        }

    summary: dict[str, float]


@asynccontextmanager
async def scratch_database(postgres_url: str, name: str) -> AsyncIterator[str]:
    """A PostgreSQL database ``name`` created beside ``postgres_url``'s for one
    measurement; its URL. Dropped afterwards, whatever the measurement did."""
    import asyncpg
    import sqlalchemy as sa

    base = sa.make_url(postgres_url)
    admin = base.render_as_string(hide_password=False)
    conn = await asyncpg.connect(admin, timeout=10)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        conn = await asyncpg.connect(admin, timeout=10)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()
