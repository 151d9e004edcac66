"""Scale-out: ``corral worker`` processes on PostgreSQL + NATS JetStream, beside SQLite.

Standalone (it is not a section of ``bench/run.py``); run it with Corral's own venv::

    .venv/bin/python bench/scaleout.py --postgres-alone   # 1, 2 and 4 workers, a few minutes
    .venv/bin/python bench/scaleout.py --tasks 300 --workers 1,2 --json /tmp/scaleout.json

Every configuration runs real ``corral worker`` processes (``--concurrency``
slots each) on a fresh store. Measured from this process:

- **Throughput.** ``tasks`` no-op tasks (an agent on the ``scripted`` provider:
  one text turn, no tools) are submitted by 16 concurrent callers *before* the
  workers start (``submits/s``: this process's insert rate, for reference).
  Then the workers start, and once all are up the backlog is announced on NATS
  (the polling configurations find it in the store). ``tasks/s`` is the number
  of tasks over the time from the first claim to the last finish, from the
  store's own timestamps: start-up and this process's polling are not in it.
  Each task is a full durable run: dispatched, claimed under a lease,
  journaled, saved as succeeded. (A NATS worker's first sweep, at its start,
  claims up to ``--concurrency`` runs straight from the store before the
  announcements; the workers log how many runs came each way, printed below
  each row.)
- **Agent-loop overhead.** ``latency_runs`` runs of a tool-calling task (three
  calls to a Python ``add``, then an answer: four model turns on the scripted
  provider, so no model time at all), one at a time. From the stored record:
  *dispatch* is submit to first claim (``started_at - created_at``: the bus, or
  the poll, and the claim), *execution* is first claim to saved
  (``finished_at - started_at``: the loop, the tools and every journal write).
  Medians and p95, in milliseconds.

Configurations: SQLite with one worker process (the embedded mode's store; no
bus reaches another process there, so the worker polls the store every 10 ms),
optionally (``--postgres-alone``) PostgreSQL with one polling worker, and
PostgreSQL + NATS with 1, 2 and 4 worker processes (runs dispatched by NATS,
the store swept every 5 s). PostgreSQL is a scratch database created
beside ``--postgres-url`` and dropped afterwards; NATS streams live under a
random prefix, deleted afterwards. Figures depend on the machine (a 2-core VM
shared with other work, in the runs quoted in docs/deploy.md): compare rows of
one run, not runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"

RESOURCES = f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: noop}}
spec:
  provider: scripted
  script:
    - {{text: done}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: noop}}
spec: {{model: noop}}
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: adder}}
spec:
  provider: scripted
  script:
    - {{tool_calls: [{{name: add, arguments: {{a: 1, b: 2}}}}]}}
    - {{tool_calls: [{{name: add, arguments: {{a: 3, b: 4}}}}]}}
    - {{tool_calls: [{{name: add, arguments: {{a: 5, b: 6}}}}]}}
    - {{text: "3, 7 and 11"}}
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: add}}
spec:
  type: python
  python: {{function: "bench_tools:add", path: "{BENCH}"}}
  idempotent: true
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: adder}}
spec:
  model: adder
  tools: [add]
"""


LABELS = {
    "sqlite": "SQLite (poll 10 ms)",
    "postgres": "PostgreSQL (poll 10 ms)",
    "nats": "PostgreSQL + NATS",
}


@dataclass
class Figures:
    """What one configuration measured."""

    name: str
    workers: int
    tasks: int
    submit_per_s: float = 0.0
    drain_per_s: float = 0.0
    dispatch_ms: list[float] = field(default_factory=list[float])
    execution_ms: list[float] = field(default_factory=list[float])
    error: str | None = None


# --------------------------------------------------------------------------- stores and buses


@asynccontextmanager
async def scratch_postgres(base_url: str) -> AsyncIterator[str]:
    """A new, empty PostgreSQL database beside ``base_url``'s; dropped afterwards."""
    import asyncpg
    import sqlalchemy as sa

    url = sa.make_url(base_url)
    name = "corral_bench_" + secrets.token_hex(5)
    admin_url = url.render_as_string(hide_password=False)
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        conn = await asyncpg.connect(admin_url)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


async def delete_streams(nats_url: str, prefix: str) -> None:
    import nats
    import nats.js.errors

    client = await nats.connect(nats_url, allow_reconnect=False)
    try:
        for stream in (f"{prefix}_runnable", f"{prefix}_dead"):
            with suppress(nats.js.errors.NotFoundError):
                await client.jetstream().delete_stream(stream)
    finally:
        await client.close()


# --------------------------------------------------------------------------- workers


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
                        [sys.executable, "-m", "corral", "worker", *options],
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

    def summaries(self) -> list[str]:
        """What each worker said about where its runs came from (logged when it stops)."""
        lines = [line for log in self.logs for line in log.read_text(errors="replace").splitlines()]
        return [line.split(" INFO ", 1)[-1] for line in lines if "deliveries" in line]

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


# --------------------------------------------------------------------------- measuring


async def submit_all(submit_one: Callable[[int], Awaitable[object]], tasks: int) -> None:
    """Submit ``tasks`` tasks from 16 concurrent callers."""
    queue = iter(range(tasks))

    async def submitter() -> None:
        for i in queue:
            await submit_one(i)

    await asyncio.gather(*(submitter() for _ in range(16)))


async def wait_succeeded(store: Any, count: int, within: float) -> None:
    """Until ``count`` runs succeeded (at most ``within`` seconds); a run that ended
    otherwise is an error."""
    from corral.core.runs import RunState

    deadline = time.monotonic() + within
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
            raise RuntimeError(f"only {succeeded} of {count} runs succeeded in {within:g} s")
        await asyncio.sleep(0.02)


async def submit_backlog(figures: Figures, store: Any) -> list[str]:
    """Submit the no-op tasks before any worker runs (announced later); their ids."""
    from corral.runtime.local import submit

    ids: list[str] = []

    async def one(i: int) -> None:
        record, _ = await submit(store, "noop", f"task {i}")
        ids.append(record.id)

    start = time.perf_counter()
    await submit_all(one, figures.tasks)
    figures.submit_per_s = figures.tasks / (time.perf_counter() - start)
    return ids


async def drain(figures: Figures, store: Any, bus: Any, ids: list[str], within: float) -> None:
    """Announce the backlog (on NATS) and wait until the workers have run it all.

    The rate is taken from the store's own timestamps: tasks divided by the time from
    the first claim to the last finish, so neither the workers' start-up nor this
    process's polling is in it.
    """
    if bus is not None:
        await bus.announce_runnable(ids, mark="submitted")
    await wait_succeeded(store, figures.tasks, within)
    runs = await store.list_runs("default", agent="noop", limit=figures.tasks + 1)
    first = min(r.started_at for r in runs if r.started_at)
    last = max(r.finished_at for r in runs if r.finished_at)
    figures.drain_per_s = figures.tasks / (last - first)


async def overhead(
    figures: Figures, store: Any, bus: Any, latency_runs: int, within: float
) -> None:
    """A tool-calling task, one at a time (two untimed first): dispatch and execution."""
    from corral.runtime.local import submit

    for i in range(latency_runs + 2):
        record, _ = await submit(store, "adder", f"sums {i}", bus=bus)
        await wait_succeeded(store, figures.tasks + i + 1, within)
        stored = await store.get_run(record.id)
        assert stored is not None and stored.started_at and stored.finished_at
        if i >= 2:
            figures.dispatch_ms.append((stored.started_at - stored.created_at) * 1000)
            figures.execution_ms.append((stored.finished_at - stored.started_at) * 1000)


async def configuration(
    name: str, workers: int, args: argparse.Namespace, log: Callable[[str], None]
) -> Figures:
    """Measure one configuration: ``sqlite`` (one worker) or ``nats`` (``workers`` workers)."""
    from corral.bus.nats import NatsBus
    from corral.resources.loader import load_text
    from corral.store import open_store

    figures = Figures(name, workers, args.tasks)
    home = Path(tempfile.mkdtemp(prefix="corral-scaleout-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_HOME"] = str(home)
    options = ["--concurrency", str(args.concurrency), "--grace-seconds", "5"]
    prefix = "bench_" + secrets.token_hex(4)
    bus = None
    try:
        async with _database(name, home, args.postgres_url) as url:
            env["CORRAL_DB_URL"] = url
            store = await open_store(url)
            try:
                await store.apply(load_text(RESOURCES, "scaleout.yaml"))
                if name == "nats":
                    env.update(CORRAL_NATS_URL=args.nats_url, CORRAL_NATS_PREFIX=prefix)
                    bus = await NatsBus.connect(args.nats_url, prefix=prefix)
                else:
                    options += ["--poll-seconds", "0.01"]
                ids = await submit_backlog(figures, store)
                running = Workers(home, env, workers, options)
                try:
                    await running.started()
                    log(f"  {name} x{workers}: measuring")
                    await drain(figures, store, bus, ids, args.timeout)
                    await overhead(figures, store, bus, args.latency_runs, args.timeout)
                finally:
                    running.stop()
                    for line in running.summaries():
                        log(f"    {line}")
            finally:
                if bus is not None:
                    await bus.close()
                await store.close()
    except Exception as exc:  # noqa: BLE001 - one configuration failing is a row, not a failed run
        figures.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        if name == "nats":
            try:
                await delete_streams(args.nats_url, prefix)
            except Exception as exc:  # noqa: BLE001 - cleanup only: say so and go on
                log(f"  (streams of {prefix} not deleted: {exc})")
        shutil.rmtree(home, ignore_errors=True)
    return figures


@asynccontextmanager
async def _database(name: str, home: Path, postgres_url: str) -> AsyncIterator[str]:
    if name == "sqlite":
        yield f"sqlite:///{home / 'corral.db'}"
    else:
        async with scratch_postgres(postgres_url) as url:
            yield url


# --------------------------------------------------------------------------- reporting


def _ms(values: list[float], pct: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    index = min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))
    return f"{ordered[index]:.1f}"


def render(results: list[Figures], args: argparse.Namespace) -> str:
    header = (
        "| store + bus | workers | submits/s (this process) | tasks/s (workers) | "
        "dispatch ms p50 / p95 | execution ms p50 / p95 |"
    )
    lines = [header, "| --- | --- | --- | --- | --- | --- |"]
    for f in results:
        label = LABELS[f.name]
        if f.error:
            lines.append(f"| {label} | {f.workers} | failed: {f.error} | | | |")
            continue
        lines.append(
            f"| {label} | {f.workers} | {f.submit_per_s:.0f} | {f.drain_per_s:.0f} | "
            f"{_ms(f.dispatch_ms, 50)} / {_ms(f.dispatch_ms, 95)} | "
            f"{_ms(f.execution_ms, 50)} / {_ms(f.execution_ms, 95)} |"
        )
    lines.append("")
    lines.append(
        f"{args.tasks} no-op tasks per row, {args.concurrency} slots per worker; "
        f"{args.latency_runs} tool-calling runs (3 tool calls, 4 scripted turns) one at a "
        f"time for the overhead; {os.cpu_count()} CPUs; Python {sys.version.split()[0]}."
    )
    if all(not f.error for f in results):
        ratio = [f.execution_ms for f in results]
        lines.append(
            "Execution medians relative to SQLite: "
            + ", ".join(
                f"{f.name} x{f.workers} {statistics.median(r) / statistics.median(ratio[0]):.2f}"
                for f, r in zip(results, ratio, strict=True)
            )
        )
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> list[Figures]:
    sys.path.insert(0, str(BENCH))  # bench_tools, for the workers' python tool (by path too)
    results = [await configuration("sqlite", 1, args, print)]
    if args.postgres_alone:
        results.append(await configuration("postgres", 1, args, print))
    for count in args.workers:
        results.append(await configuration("nats", count, args, print))
    print(render(results, args))
    return results


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--latency-runs", type=int, default=30)
    parser.add_argument(
        "--workers", type=lambda s: [int(n) for n in s.split(",")], default=[1, 2, 4]
    )
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("CORRAL_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL),
    )
    parser.add_argument(
        "--nats-url", default=os.environ.get("CORRAL_BENCH_NATS_URL", DEFAULT_NATS_URL)
    )
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--postgres-alone",
        action="store_true",
        help="also one worker on PostgreSQL without NATS (polling), to tell the bus's share",
    )
    parser.add_argument("--json", help="also write the raw figures here")
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse(sys.argv[1:])
    measured = asyncio.run(main(arguments))
    if arguments.json:
        Path(arguments.json).write_text(json.dumps([asdict(f) for f in measured], indent=2))
