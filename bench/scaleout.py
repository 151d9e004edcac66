"""Section 6, scale-out: ``corral worker`` processes on PostgreSQL + NATS JetStream, beside SQLite.

``bench/run.py`` runs it as a section (:func:`run`). It also runs on its own,
with either venv (``.venv`` or ``bench/.venv``)::

    .venv/bin/python bench/scaleout.py                    # 1 round: SQLite, NATS x1, x2, x4
    .venv/bin/python bench/scaleout.py --tasks 300 --workers 1,2 --postgres-alone --json F

Configurations: SQLite with one worker process (the embedded mode's store; no
bus reaches another process there, so the worker polls the store every 10 ms),
PostgreSQL with one worker polling it every 10 ms (no NATS: the bus's share),
and PostgreSQL + NATS with 1, 2 and 4 worker processes (runs dispatched by
NATS, the store swept every 5 s). Each configuration of each round is a child
process (``scaleout.py --child ...``, the driver) that starts real ``corral
worker`` processes (``concurrency`` slots each) on a fresh store; rounds run
every configuration in turn, so a slow moment widens the spread rather than
reordering the rows. Measured by the driver:

- **Throughput.** ``tasks`` no-op tasks (an agent on the ``scripted`` provider:
  one text turn, no tools) are submitted by 16 concurrent callers *before* the
  workers start (``submits/s``: the driver's insert rate, for reference). Then
  the workers start, and once all are up the backlog is announced on NATS (the
  polling configurations find it in the store). ``tasks/s`` is taken from the
  store's own timestamps: the tasks finished between the moment every worker
  was up (or the first claim, if later) and the last finish, over that time;
  start-up and the driver's polling are not in it. Each task is a full durable
  run: dispatched, claimed under a lease, journaled, saved as succeeded. (A
  NATS worker's first sweep, at its start, claims up to ``concurrency`` runs
  straight from the store before the announcements; the workers log how many
  runs came each way, kept as ``via_bus`` and ``via_sweep``.)
- **Agent-loop overhead.** ``latency_runs`` runs of a tool-calling task (three
  calls to a Python ``add``, then an answer: four model turns on the scripted
  provider, so no model time at all), one at a time, after two untimed ones.
  From the stored record: *dispatch* is submit to first claim
  (``started_at - created_at``: the bus, or the poll, and the claim),
  *execution* is first claim to saved (``finished_at - started_at``: the loop,
  the tools and every journal write). p50 and p95 per round, in milliseconds.

PostgreSQL is a scratch database created beside ``CORRAL_BENCH_POSTGRES_URL``
(default ``postgresql://postgres@127.0.0.1:5432/test``) for each measurement
and dropped afterwards; NATS (``CORRAL_BENCH_NATS_URL``, default
``nats://127.0.0.1:4222``) streams live under a random prefix, deleted
afterwards. The parent creates and removes both, so a driver that times out
leaves nothing behind; its workers get SIGTERM when it dies. A server that does
not accept connections makes its rows say "not reachable". PostgreSQL, NATS, the
workers and the driver share the machine: compare rows of one run, not runs.
The worker processes, the scratch store and the rounds are :mod:`cluster`'s
(``sysruns.py`` measures system runs with them too).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import BENCH, emit, fmt, median, percentile, spread, table
from cluster import (
    Workers,
    availability,
    child_parser,
    measure_in_child,
    measure_rounds,
    reachable,
    server_urls,
    server_versions,
    wait_succeeded,
    without_password,
    worker_env,
    worker_options,
)

SUBMITTERS = 16
#: the polling configurations' ``--poll-seconds`` (NATS workers keep their default sweep, 5 s)
POLL_SECONDS = 0.01

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

#: what each store (+ bus) is called in the tables
LABELS = {
    "sqlite": "SQLite (poll 10 ms)",
    "postgres": "PostgreSQL (poll 10 ms)",
    "nats": "PostgreSQL + NATS",
}


@dataclass(frozen=True)
class Config:
    """How much to measure."""

    rounds: int = 3
    tasks: int = 1000
    latency_runs: int = 30
    workers: tuple[int, ...] = (1, 2, 4)
    concurrency: int = 32
    postgres_alone: bool = True
    postgres_url: str = ""
    nats_url: str = ""
    timeout: float = 300.0


def configurations(config: Config) -> list[tuple[str, str, int]]:
    """``(key, store, workers)`` of every configuration, in the order of a round."""
    found = [("sqlite-1", "sqlite", 1)]
    if config.postgres_alone:
        found.append(("postgres-1", "postgres", 1))
    found += [(f"nats-{n}", "nats", n) for n in config.workers]
    return found


# --------------------------------------------------------------------------- the driver (a child)


async def submit_all(submit_one: Callable[[int], Awaitable[object]], tasks: int) -> None:
    """Submit ``tasks`` tasks from :data:`SUBMITTERS` concurrent callers."""
    queue = iter(range(tasks))

    async def submitter() -> None:
        for i in queue:
            await submit_one(i)

    await asyncio.gather(*(submitter() for _ in range(SUBMITTERS)))


async def drive(args: argparse.Namespace) -> dict[str, Any]:
    """One configuration: the backlog, its drain by the workers, then the overhead runs."""
    from corral.bus.nats import NatsBus
    from corral.resources.loader import load_text
    from corral.runtime.operations import submit
    from corral.store import open_store

    deadline = time.monotonic() + args.within
    home = Path(args.home)
    env = worker_env(args)
    options = worker_options(args.concurrency)
    if args.store != "nats":
        options += ["--poll-seconds", str(POLL_SECONDS)]
    figures: dict[str, Any] = {}
    store = await open_store(args.db_url)
    bus = None
    try:
        await store.apply(load_text(RESOURCES, "scaleout.yaml"))
        if args.store == "nats":
            bus = await NatsBus.connect(args.nats_url, prefix=args.prefix)

        ids: list[str] = []

        async def one(i: int) -> None:
            record, _ = await submit(store, "noop", f"task {i}")
            ids.append(record.id)

        start = time.perf_counter()
        await submit_all(one, args.tasks)
        figures["submit_per_s"] = args.tasks / (time.perf_counter() - start)

        workers = Workers(home, env, args.workers, options)
        try:
            await workers.started()
            if bus is not None:
                await bus.announce_runnable(ids, mark="submitted")
            await wait_succeeded(store, args.tasks, deadline)
            runs = await store.list_runs("default", agent="noop", limit=args.tasks + 1)
            figures |= drain_rate(runs, workers.up_at())

            dispatch, execution = [], []
            for i in range(args.latency_runs + 2):  # the first two untimed
                record, _ = await submit(store, "adder", f"sums {i}", bus=bus)
                await wait_succeeded(store, args.tasks + i + 1, deadline)
                stored = await store.get_run(record.id)
                assert stored is not None and stored.started_at and stored.finished_at
                if i >= 2:
                    dispatch.append((stored.started_at - stored.created_at) * 1000)
                    execution.append((stored.finished_at - stored.started_at) * 1000)
        finally:
            workers.stop()
        if args.store == "nats":
            figures |= workers.deliveries()
    finally:
        if bus is not None:
            await bus.close()
        await store.close()
    figures["dispatch_ms"], figures["execution_ms"] = dispatch, execution
    for name, values in (("dispatch", dispatch), ("execution", execution)):
        figures[f"{name}_p50_ms"] = median(values) if values else None
        figures[f"{name}_p95_ms"] = percentile(values, 95) if values else None
    return figures


def drain_rate(runs: list[Any], all_up: float) -> dict[str, Any]:
    """Tasks per second from the runs' stored times, while every worker was up.

    The window opens when the last worker started (or at the first claim, if
    later) and closes at the last finish; the tasks finished in it, over its
    length. A backlog so small that the first workers ran most of it before the
    last one was up (a ``--quick`` run) is measured from the first claim instead.
    """
    first_claim = min(r.started_at for r in runs)
    last = max(r.finished_at for r in runs)
    start = max(all_up, first_claim)
    counted = sum(1 for r in runs if r.finished_at >= start)
    if counted < len(runs) / 2 or last - start <= 0:
        start, counted = first_claim, len(runs)
    return {
        "drain_per_s": counted / max(last - start, 1e-6),
        "drain_s": last - start,
        "drain_from": "first claim" if start == first_claim else "all workers up",
    }


def child_main(argv: list[str]) -> None:
    parser = child_parser(LABELS)
    parser.add_argument("--tasks", type=int, required=True)
    parser.add_argument("--latency-runs", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(BENCH))  # bench_tools (the workers find it by the tool's path)
    emit(asyncio.run(drive(args)))


# --------------------------------------------------------------------------- the parent


def measure_once(
    store: str, workers: int, config: Config, postgres_url: str, nats_url: str
) -> dict[str, Any]:
    """One configuration in a driver child of its own; its figures, or ``{"error": ...}``."""
    return measure_in_child(
        "scaleout.py",
        store,
        workers,
        postgres_url,
        nats_url,
        [
            f"--tasks={config.tasks}",
            f"--latency-runs={config.latency_runs}",
            f"--concurrency={config.concurrency}",
        ],
        timeout=config.timeout,
    )


def run(config: Config, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every configuration of ``config``, round after round; the raw figures of each."""
    postgres_url, nats_url = server_urls(config.postgres_url, config.nats_url)
    postgres_down = reachable(postgres_url, 5432)
    nats_down = reachable(nats_url, 4222)
    chosen = configurations(config)
    status = availability(chosen, postgres_down, nats_down)

    def shown(got: dict[str, Any]) -> str:
        said = f"{got['drain_per_s']:.0f} tasks/s, execution p50 {got['execution_p50_ms']:.1f} ms"
        if "via_bus" in got:
            said += f" ({got['via_bus']} runs from NATS, {got['via_sweep']} swept)"
        return said

    samples, errors = measure_rounds(
        chosen,
        config.rounds,
        status,
        lambda store, workers: measure_once(store, workers, config, postgres_url, nats_url),
        shown,
        log,
        "[scaleout] round",
    )
    up_postgres = None if postgres_down else postgres_url
    up_nats = None if nats_down or not config.workers else nats_url
    return {
        "rounds": config.rounds,
        "tasks": config.tasks,
        "latency_runs": config.latency_runs,
        "concurrency": config.concurrency,
        "submitters": SUBMITTERS,
        "configurations": [{"key": k, "store": s, "workers": w} for k, s, w in chosen],
        "postgres_url": without_password(postgres_url),
        "nats_url": without_password(nats_url),
        "servers": asyncio.run(server_versions(up_postgres, up_nats)),
        "status": status,
        "samples": samples,
        "errors": errors,
    }


# --------------------------------------------------------------------------- rendering


def label(configuration: dict[str, Any]) -> str:
    return LABELS[configuration["store"]]


def execution_vs_sqlite(result: dict[str, Any], key: str) -> list[float]:
    """Each round's execution p50 of ``key`` over SQLite's in the same round."""
    base = {s["round"]: s["execution_p50_ms"] for s in result["samples"].get("sqlite-1", [])}
    return [
        s["execution_p50_ms"] / base[s["round"]]
        for s in result["samples"].get(key, [])
        if base.get(s["round"])
    ]


def render(result: dict[str, Any]) -> str:
    """Two tables: no-op task throughput, then agent-loop overhead; medians (min-max)."""
    throughput_rows, overhead_rows = [], []
    for c in result["configurations"]:
        key, name, workers = c["key"], label(c), str(c["workers"])
        got = result["samples"].get(key) or []
        status = result["status"][key]
        if status != "ok" or not got:
            throughput_rows.append([name, workers, status, "", "", ""])
            overhead_rows.append([name, workers, status, "", "", "", "", ""])
            continue
        failures = f" ({len(result['errors'][key])} failed)" if result["errors"][key] else ""

        def col(field: str, digits: int, got: list[dict[str, Any]] = got) -> str:
            return spread([s[field] for s in got if s.get(field) is not None], digits)

        via = "polls the store"
        if c["store"] == "nats":
            via = " / ".join(fmt(median([s[f] for s in got]), 0) for f in ("via_bus", "via_sweep"))
        throughput_rows.append(
            [
                f"{name}{failures}",
                workers,
                f"{result['tasks']:,}",
                col("submit_per_s", 0),
                f"**{col('drain_per_s', 0)}**",
                via,
            ]
        )
        ratio = execution_vs_sqlite(result, key)
        overhead_rows.append(
            [
                f"{name}{failures}",
                workers,
                f"{result['latency_runs']:,}",
                col("dispatch_p50_ms", 1),
                col("dispatch_p95_ms", 1),
                col("execution_p50_ms", 1),
                col("execution_p95_ms", 1),
                "1 (the base)" if key == "sqlite-1" else spread(ratio, 2, "x"),
            ]
        )
    throughput = table(
        [
            "store + bus",
            "worker processes",
            "no-op tasks",
            "submits/s (driver)",
            "tasks/s (workers)",
            "runs from NATS / from the sweep",
        ],
        throughput_rows,
    )
    overhead = table(
        [
            "store + bus",
            "worker processes",
            "runs",
            "dispatch p50 ms",
            "dispatch p95 ms",
            "execution p50 ms",
            "execution p95 ms",
            "execution p50 x SQLite",
        ],
        overhead_rows,
    )
    return (
        f"No-op task throughput ({result['tasks']:,} tasks per measurement, "
        f"{result['concurrency']} slots per worker process):\n\n{throughput}\n\n"
        f"Agent-loop overhead ({result['latency_runs']} runs of 3 tool calls + 1 answer, one "
        f"at a time; dispatch = submit -> claim, execution = claim -> saved):\n\n{overhead}"
    )


# --------------------------------------------------------------------------- standalone


def standalone_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per configuration and round (a configuration that could not run: one row)."""
    rows = []
    for c in result["configurations"]:
        base = {"name": c["store"], "workers": c["workers"], "tasks": result["tasks"]}
        got = result["samples"][c["key"]]
        for sample in got:
            rows.append({**base, **sample, "error": None})
        for error in result["errors"][c["key"]]:
            rows.append({**base, "error": error})
        if not got and not result["errors"][c["key"]]:
            rows.append({**base, "error": result["status"][c["key"]]})
    return rows


def standalone_text(result: dict[str, Any]) -> str:
    """A compact table, one line per configuration and round."""
    lines = [
        "| store + bus | workers | submits/s (driver) | tasks/s (workers) | "
        "dispatch ms p50 / p95 | execution ms p50 / p95 |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in standalone_rows(result):
        name = LABELS[row["name"]]
        if row["error"]:
            lines.append(f"| {name} | {row['workers']} | {row['error']} | | | |")
            continue
        lines.append(
            f"| {name} | {row['workers']} | {row['submit_per_s']:.0f} | {row['drain_per_s']:.0f} | "
            f"{row['dispatch_p50_ms']:.1f} / {row['dispatch_p95_ms']:.1f} | "
            f"{row['execution_p50_ms']:.1f} / {row['execution_p95_ms']:.1f} |"
        )
    lines.append("")
    lines.append(
        f"{result['tasks']} no-op tasks per row, {result['concurrency']} slots per worker; "
        f"{result['latency_runs']} tool-calling runs (3 tool calls, 4 scripted turns) one at a "
        f"time for the overhead; {os.cpu_count()} CPUs; Python {sys.version.split()[0]}."
    )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tasks", type=int, default=Config.tasks)
    parser.add_argument("--latency-runs", type=int, default=Config.latency_runs)
    parser.add_argument(
        "--workers", type=lambda s: tuple(int(n) for n in s.split(",")), default=Config.workers
    )
    parser.add_argument("--concurrency", type=int, default=Config.concurrency)
    parser.add_argument("--postgres-url", default="")
    parser.add_argument("--nats-url", default="")
    parser.add_argument("--timeout", type=float, default=Config.timeout)
    parser.add_argument(
        "--postgres-alone",
        action="store_true",
        help="also one worker on PostgreSQL without NATS (polling), to tell the bus's share",
    )
    parser.add_argument("--json", help="also write the raw figures here, one row per measurement")
    args = parser.parse_args(argv)
    config = Config(
        rounds=args.rounds,
        tasks=args.tasks,
        latency_runs=args.latency_runs,
        workers=args.workers,
        concurrency=args.concurrency,
        postgres_alone=args.postgres_alone,
        postgres_url=args.postgres_url,
        nats_url=args.nats_url,
        timeout=args.timeout,
    )
    result = run(config, lambda line: print(line, file=sys.stderr, flush=True))
    print(standalone_text(result))
    if args.json:
        Path(args.json).write_text(json.dumps(standalone_rows(result), indent=2) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child_main(sys.argv[2:])
    else:
        main(sys.argv[1:])
