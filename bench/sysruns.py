"""Section 8, multi-agent (continued): system-run throughput, SQLite beside PostgreSQL + NATS.

One small ``AgentSystem`` on the ``scripted`` provider (no model time in any
figure): ``planner`` fans out to ``researcher`` and ``critic``, which join
(``join: all``) into ``writer``. One system run is the system run itself (its
coordinator: a task like any other) and 4 node runs, each a durable run.

Each configuration is a driver child process (``sysruns.py --child``) on a
fresh store:

- **SQLite**: one in-process :class:`~corral.runtime.worker.Worker` (32 slots,
  the in-process bus), as embedded mode runs it.
- **PostgreSQL + NATS**: ``corral worker`` processes (1, then 2; 32 slots each)
  on a scratch database and a NATS prefix of their own (``cluster.py``, scale-out's
  set-up: rows say "not reachable" without those servers). System runs, node
  runs and woken system runs reach the workers as NATS deliveries; agent
  messages reach the node agents through the workers' inbox consumers.

Measured, in this order, after two untimed system runs:

- **alone**: ``latency_runs`` system runs one at a time, each from its submit
  until the driver sees it succeeded (a watch of its events, woken by the
  commit of its outcome; re-checked every 10 ms); p50 and p95.
- **throughput**: ``systems`` system runs submitted at once (concurrent
  submits), drained; completed system runs per second from the store's own
  timestamps: the first submit (``created_at``) to the last finish.

On SQLite the driver also counts the store's transactions during the runs
alone (the store's write and read methods wrapped; writes are the commits, an
fsync each at ``synchronous=FULL``): ``writes_per_system`` and
``reads_per_system``, with the writes by operation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import BENCH, emit, median, percentile, spread, table
from cluster import (
    Workers,
    availability,
    child_parser,
    measure_in_child,
    measure_rounds,
    reachable,
    server_urls,
    wait_succeeded,
    without_password,
    worker_env,
    worker_options,
)

#: node runs per system run (planner, researcher, critic, writer)
NODES = 4
SLOTS = 32


@dataclass(frozen=True)
class Config:
    """How much to measure."""

    rounds: int = 3
    systems: int = 200  # system runs submitted at once per measurement
    latency_runs: int = 30  # system runs one at a time per measurement
    workers: tuple[int, ...] = (1, 2)  # corral worker processes on PostgreSQL + NATS
    postgres_url: str = ""
    nats_url: str = ""
    timeout: float = 300.0


def resources() -> str:
    """The system and its agents, as a user would write them (JSON is YAML)."""
    docs: list[dict[str, Any]] = []
    for name, answer in (
        ("planner", "the plan"),
        ("researcher", "the facts"),
        ("critic", "the doubts"),
        ("writer", "the report"),
    ):
        docs.append(
            {
                "kind": "ModelEndpoint",
                "metadata": {"name": f"{name}-model"},
                "spec": {"provider": "scripted", "script": [{"text": answer}]},
            }
        )
        docs.append(
            {"kind": "Agent", "metadata": {"name": name}, "spec": {"model": f"{name}-model"}}
        )
    docs.append(
        {
            "kind": "AgentSystem",
            "metadata": {"name": "team"},
            "spec": {
                "entry": "planner",
                "graph": {
                    "planner": {"next": ["researcher", "critic"]},
                    "researcher": {"next": ["writer"]},
                    "critic": {"next": ["writer"]},
                    "writer": {"join": "all"},
                },
            },
        }
    )
    return "\n---\n".join(json.dumps({"apiVersion": "corral/v1", **doc}) for doc in docs)


def configurations(config: Config) -> list[tuple[str, str, int]]:
    """``(key, store, workers)`` of every configuration, in the order of a round."""
    return [("sqlite-1", "sqlite", 1)] + [(f"nats-{n}", "nats", n) for n in config.workers]


# --------------------------------------------------------------------------- the driver (a child)


#: run and message ids in an operation's name (counted as one operation)
IDS = re.compile(r"\b[a-z]+_[0-9a-z]{16,}\b")


class Transactions:
    """Counts a SQLite store's writes: the write operations (by name: the fast path's
    lane and the SQLAlchemy path) and the commits that wrote (each an fsync: one per
    batch of the writer lane that changed a row, the lane group-committing the
    operations queued meanwhile; one per SQLAlchemy write); and the read operations."""

    def __init__(self, store: Any) -> None:
        self.writes: Counter[str] = Counter()
        self.commits = 0
        self.reads = 0
        self.counting = False

        def wrap(name: str, tally: Any) -> None:
            method = getattr(store, name)

            def counted(action: str, body: Any) -> Any:
                if self.counting:
                    tally(IDS.sub("<id>", action))
                return method(action, body)

            setattr(store, name, counted)

        def write(action: str) -> None:
            self.writes[action] += 1

        def sqlalchemy_write(action: str) -> None:
            self.writes[action] += 1
            self.commits += 1

        def read(action: str) -> None:
            self.reads += 1

        wrap("_write", sqlalchemy_write)
        wrap("_read", read)
        if hasattr(store, "_lane_write"):  # the SQLite fast path
            wrap("_lane_write", write)
            wrap("_lane_read", read)
            lane = store._writer_lane
            commit = lane._commit

            def counted_commit(batch: Any) -> None:
                before = lane._conn.total_changes
                commit(batch)
                # a batch that changed no row (a claim that found nothing) writes no
                # page: its COMMIT costs no fsync
                if self.counting and lane._conn.total_changes > before:
                    self.commits += 1

            lane._commit = counted_commit


async def wait_finished(store: Any, bus: Any, run_id: str, deadline: float) -> Any:
    """The run once finished (a watch of its events, re-checked every 10 ms)."""
    async with bus.watch_events(run_id) as watch:
        while True:
            stored = await store.get_run(run_id)
            if stored is not None and stored.state.finished:
                return stored
            if time.monotonic() > deadline:
                raise RuntimeError(f"system run {run_id} did not finish in time")
            await watch.wait(0.01)


async def measure(
    store: Any, bus: Any, args: argparse.Namespace, deadline: float
) -> dict[str, Any]:
    """The runs alone, then the burst; the figures."""
    from corral.core.runs import RunState
    from corral.runtime.system_runs import submit_system

    counter = Transactions(store) if args.store == "sqlite" else None
    latency: list[float] = []
    done = 0
    for i in range(args.latency_runs + 2):  # the first two untimed
        if counter is not None:
            counter.counting = i >= 2
        started = time.perf_counter()
        record, _ = await submit_system(store, "team", f"topic {i}", bus=bus)
        stored = await wait_finished(store, bus, record.id, deadline)
        took = 1000 * (time.perf_counter() - started)
        if stored.state is not RunState.SUCCEEDED:
            raise RuntimeError(f"a system run ended {stored.state.value}: {stored.error}")
        done += 1
        if i >= 2:
            latency.append(took)
    figures: dict[str, Any] = {}
    if counter is not None:
        counter.counting = False
        figures["writes_per_system"] = sum(counter.writes.values()) / args.latency_runs
        figures["commits_per_system"] = counter.commits / args.latency_runs
        figures["reads_per_system"] = counter.reads / args.latency_runs
        figures["writes_by_action"] = {
            action: n / args.latency_runs for action, n in counter.writes.most_common()
        }
    await wait_succeeded(store, done * (1 + NODES), deadline)

    records = await asyncio.gather(
        *(submit_system(store, "team", f"burst {i}", bus=bus) for i in range(args.systems))
    )
    await wait_succeeded(store, (done + args.systems) * (1 + NODES), deadline)
    stored = [await store.get_run(record.id) for record, _ in records]
    first = min(r.created_at for r in stored)
    last = max(r.finished_at for r in stored)
    figures |= {
        "systems_per_s": args.systems / max(last - first, 1e-6),
        "burst_s": last - first,
        "latency_ms": latency,
        "p50_ms": median(latency) if latency else None,
        "p95_ms": percentile(latency, 95) if latency else None,
    }
    return figures


async def drive(args: argparse.Namespace) -> dict[str, Any]:
    """One configuration: the store, its worker(s), the measurement."""
    import anyio

    from corral.core.settings import Settings
    from corral.resources.loader import load_text
    from corral.runtime.worker import Worker
    from corral.store import open_store

    deadline = time.monotonic() + args.within
    home = Path(args.home)
    os.environ["CORRAL_HOME"] = str(home)
    store = await open_store(args.db_url)
    try:
        await store.apply(load_text(resources(), "team.yaml"))
        if args.store == "sqlite":
            settings = Settings(home=home, db_url=args.db_url, secret_key=None)
            worker = Worker(store, settings, concurrency=SLOTS, poll_seconds=0.5)
            stop = anyio.Event()
            figures: dict[str, Any] = {}
            async with anyio.create_task_group() as group:
                group.start_soon(worker.serve, stop)
                figures = await measure(store, worker.bus, args, deadline)
                stop.set()
            return figures
        return await drive_workers(store, args, deadline)
    finally:
        await store.close()


async def drive_workers(store: Any, args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    """PostgreSQL + NATS: ``args.workers`` ``corral worker`` processes."""
    from corral.bus.nats import NatsBus

    bus = await NatsBus.connect(args.nats_url, prefix=args.prefix)
    try:
        workers = Workers(Path(args.home), worker_env(args), args.workers, worker_options(SLOTS))
        try:
            await workers.started()
            figures = await measure(store, bus, args, deadline)
        finally:
            workers.stop()
        return figures | workers.deliveries()
    finally:
        await bus.close()


def child_main(argv: list[str]) -> None:
    parser = child_parser(("sqlite", "nats"))
    parser.add_argument("--systems", type=int, required=True)
    parser.add_argument("--latency-runs", type=int, required=True)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(BENCH))
    emit(asyncio.run(drive(args)))


# --------------------------------------------------------------------------- the parent


def measure_once(
    store: str, workers: int, config: Config, postgres_url: str, nats_url: str
) -> dict[str, Any]:
    """One configuration in a driver child of its own; its figures, or ``{"error": ...}``."""
    return measure_in_child(
        "sysruns.py",
        store,
        workers,
        postgres_url,
        nats_url,
        [f"--systems={config.systems}", f"--latency-runs={config.latency_runs}"],
        timeout=config.timeout,
        env={"PYTHONPATH": str(BENCH) + os.pathsep + os.environ.get("PYTHONPATH", "")},
    )


def run(config: Config, log: Any = print) -> dict[str, Any]:
    """Every configuration, round after round; the raw figures of each."""
    postgres_url, nats_url = server_urls(config.postgres_url, config.nats_url)
    postgres_down, nats_down = reachable(postgres_url, 5432), reachable(nats_url, 4222)
    chosen = configurations(config)
    status = availability(chosen, postgres_down, nats_down)

    def shown(got: dict[str, Any]) -> str:
        said = f"{got['systems_per_s']:.1f} system runs/s, alone p50 {got['p50_ms']:.1f} ms"
        if "writes_per_system" in got:
            said += (
                f", {got['writes_per_system']:.1f} write operations, "
                f"{got['commits_per_system']:.1f} commits each"
            )
        return said

    samples, errors = measure_rounds(
        chosen,
        config.rounds,
        status,
        lambda store, workers: measure_once(store, workers, config, postgres_url, nats_url),
        shown,
        log,
        "[multiagent] systems round",
    )
    return {
        "rounds": config.rounds,
        "systems": config.systems,
        "latency_runs": config.latency_runs,
        "slots": SLOTS,
        "nodes": NODES,
        "configurations": [{"key": k, "store": s, "workers": w} for k, s, w in chosen],
        "postgres_url": without_password(postgres_url),
        "nats_url": without_password(nats_url),
        "status": status,
        "samples": samples,
        "errors": errors,
    }


# --------------------------------------------------------------------------- rendering

LABELS = {"sqlite": "SQLite (embedded worker)", "nats": "PostgreSQL + NATS (corral worker)"}


def render(result: dict[str, Any]) -> str:
    """One table: throughput and one system run alone per configuration; medians (min-max)."""
    rows = []
    for c in result["configurations"]:
        key, name, workers = c["key"], LABELS[c["store"]], str(c["workers"])
        got = result["samples"].get(key) or []
        status = result["status"][key]
        if status != "ok" or not got:
            rows.append([name, workers, status, "", "", ""])
            continue
        failures = f" ({len(result['errors'][key])} failed)" if result["errors"][key] else ""

        def col(field: str, digits: int, got: list[dict[str, Any]] = got) -> str:
            return spread([s[field] for s in got if s.get(field) is not None], digits)

        writes = ""
        if c["store"] == "sqlite":
            writes = f"{col('writes_per_system', 1)} / {col('commits_per_system', 1)}"
        rows.append(
            [
                f"{name}{failures}",
                workers,
                f"**{col('systems_per_s', 1)}**",
                col("p50_ms", 1),
                col("p95_ms", 1),
                writes,
            ]
        )
    text = table(
        [
            "store + bus",
            "worker processes",
            "system runs/s",
            "alone p50 ms",
            "alone p95 ms",
            "write operations / commits per system run",
        ],
        rows,
    )
    return (
        f"System runs (planner -> researcher + critic -> writer, join all: "
        f"{result['nodes']} node runs each; {result['systems']:,} submitted at once, "
        f"{result['latency_runs']} one at a time; {result['slots']} slots per worker):\n\n{text}"
    )


def writes_by_action(result: dict[str, Any]) -> dict[str, float]:
    """The median over rounds of SQLite's write transactions per system run, by operation."""
    got = [s["writes_by_action"] for s in result["samples"].get("sqlite-1", [])]
    actions = {a for g in got for a in g}
    return dict(
        sorted(
            ((a, median([g.get(a, 0.0) for g in got])) for a in actions),
            key=lambda pair: -pair[1],
        )
    )


def method(result: dict[str, Any]) -> str:
    """The page's paragraph on how the system-run rows measure."""
    return (
        f"- **Multi-agent, system runs** (`bench/sysruns.py`). One `AgentSystem` on the "
        f"`scripted` provider: `planner` fans out to `researcher` and `critic`, which join "
        f"(`join: all`) into `writer`: the system run (its coordinator) and {result['nodes']} "
        f"node runs, each durable. On SQLite one in-process worker ({result['slots']} slots, "
        f"the in-process bus: the coordinator delivers its messages itself); on PostgreSQL + "
        f"NATS 1 or 2 `corral worker` processes ({result['slots']} slots each) on a scratch "
        f"database and NATS prefix (as in scale-out), system runs, node runs and agent messages "
        f"reaching them as NATS deliveries. After two untimed system runs, "
        f"{result['latency_runs']} run one at a time (submit until the driver sees it "
        f"succeeded: *alone* p50/p95), then {result['systems']:,} are submitted at once and "
        f"drained: *system runs/s* is their number over the time from the first submit to the "
        f"last finish (the store's timestamps). On SQLite the store's transactions during the "
        f"runs alone are counted (its write and read methods wrapped): *write operations / "
        f"commits per system run*, the writer's group commit sharing one commit (an fsync) "
        f"between the operations queued together. {result['rounds']} rounds, each "
        f"configuration a driver child process of its own."
    )


def reading(result: dict[str, Any], disk_commits_per_s: list[float]) -> list[str]:
    """What the system-run figures say."""
    said = []
    sqlite = result["samples"].get("sqlite-1") or []
    if sqlite:
        writes = median([s["writes_per_system"] for s in sqlite])
        commits = median([s["commits_per_system"] for s in sqlite])
        reads = median([s["reads_per_system"] for s in sqlite])
        p50 = median([s["p50_ms"] for s in sqlite])
        top = ", ".join(f"{a} {n:g}" for a, n in list(writes_by_action(result).items())[:6])
        line = (
            f"One system run of {result['nodes']} node runs alone took {p50:.0f} ms (p50) on "
            f"SQLite and asked for {writes:.0f} write operations ({reads:.0f} reads), which "
            f"the writer's group commit made {commits:.0f} commits; by operation: {top}"
        )
        if disk_commits_per_s:
            fsync = 1000 / median(disk_commits_per_s)
            line += (
                f". At {fsync:.1f} ms a commit on this disk the commits alone are about "
                f"{commits * fsync:.0f} ms of it (an empty claim, finding nothing, costs no "
                f"fsync); the rest is the coordinator's passes and the worker's loop"
            )
        said.append(line + ".")
    nats = [c["key"] for c in result["configurations"] if c["store"] == "nats"]
    got = {k: result["samples"].get(k) or [] for k in nats}
    if sqlite and all(got.values()) and got:
        parts = [
            f"{k.split('-')[1]} worker(s) {median([s['systems_per_s'] for s in v]):.1f}/s, "
            f"alone {median([s['p50_ms'] for s in v]):.0f} ms"
            for k, v in got.items()
        ]
        said.append(
            "On PostgreSQL + NATS: " + "; ".join(parts) + " (against SQLite's "
            f"{median([s['systems_per_s'] for s in sqlite]):.1f}/s). There each message to a "
            "node agent goes through NATS to a worker's inbox consumer, and the coordinator's "
            "pass waits for the delivery by reading the store."
        )
    return said


if __name__ == "__main__":
    sys.path.insert(0, str(BENCH))
    if sys.argv[1:2] == ["--child"]:
        child_main(sys.argv[2:])
    else:
        parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        parser.add_argument("--rounds", type=int, default=1)
        parser.add_argument("--systems", type=int, default=Config.systems)
        parser.add_argument("--latency-runs", type=int, default=Config.latency_runs)
        parser.add_argument(
            "--workers",
            type=lambda s: tuple(int(n) for n in s.split(",") if n),
            default=Config.workers,
        )
        cli = parser.parse_args()
        found = run(
            Config(
                rounds=cli.rounds,
                systems=cli.systems,
                latency_runs=cli.latency_runs,
                workers=cli.workers,
            ),
            lambda line: print(line, file=sys.stderr, flush=True),
        )
        print(render(found))
        print("\n".join(reading(found, [])))
        print(json.dumps(writes_by_action(found), indent=1))
