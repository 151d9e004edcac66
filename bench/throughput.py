"""Section 2, task throughput: durable no-op tasks from submit to succeeded.

Corral: ``tasks`` runs of an agent on the ``scripted`` provider (one text turn,
no tools) are submitted by ``submitters`` concurrent callers to a fresh store,
then drained by one in-process :class:`~corral.runtime.worker.Worker` with
``concurrency`` slots. Each task is a full durable run: queued, claimed under a
lease, journaled (``run.start``, the model's message, ``run.finish``) and saved
as succeeded. On SQLite a second figure replays only the store operations a
task makes, without the engine: the store's own ceiling.

- SQLite: a fresh file in a temporary directory (WAL, ``synchronous=FULL``).
- PostgreSQL: when ``CORRAL_BENCH_POSTGRES_URL`` (default
  ``postgresql://postgres@127.0.0.1:5432/test``) answers, a scratch database
  is created beside the one named, measured and dropped, so nobody's data is
  touched. When Corral cannot open a PostgreSQL store the row says so.
- DBOS: a queue on a fresh SQLite system database, ``tasks`` no-op workflows
  of one step each (the counterpart of Corral's one journaled model turn).

PostgreSQL + NATS needs worker processes of their own: ``scaleout.py`` (section 6).

Each measurement is a child process; rounds interleave the systems.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from _common import BENCH, emit, freeze_heap, run_child, spread, table

TARGET_PER_SECOND = 2000  # durable no-op tasks on SQLite (the target)
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"

RESOURCES = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: script}
spec:
  provider: scripted
  script:
    - {text: done}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: noop}
spec: {model: script}
"""


@dataclass(frozen=True)
class Config:
    """How much to measure."""

    rounds: int = 5
    tasks: int = 2000
    # the systems that do tens of tasks a second here get fewer tasks: as much said, in less time
    slow_tasks: int = 500
    concurrency: int = 256
    submitters: int = 16
    store_only: bool = True
    postgres_url: str = ""
    timeout: float = 600.0


# --------------------------------------------------------------------------- children


async def submit_all(
    submit_one: Callable[[int], Awaitable[object]], tasks: int, submitters: int
) -> None:
    """Submit ``tasks`` tasks from ``submitters`` concurrent callers."""
    import anyio

    async def submitter(first: int, count: int) -> None:
        for i in range(first, first + count):
            await submit_one(i)

    async with anyio.create_task_group() as group:
        share, extra = divmod(tasks, submitters)
        first = 0
        for n in range(submitters):
            count = share + (1 if n < extra else 0)
            group.start_soon(submitter, first, count)
            first += count


async def corral_once(
    url: str, home: Path, tasks: int, concurrency: int, submitters: int
) -> dict[str, float]:
    """``tasks`` no-op runs on a fresh store at ``url``, submitted while a worker runs.

    The worker is started first and every submit announces its run on the
    worker's bus, as an API server or an embedded program does: tasks are
    claimed and executed while the others are still being submitted (DBOS's
    queue is measured the same way). Timed from the first submit until every
    task has succeeded.
    """
    import anyio

    from corral.runtime.operations import submit
    from corral.runtime.worker import Worker

    store, settings = await _fresh_store(url, home)
    try:
        worker = Worker(store, settings, concurrency=concurrency, poll_seconds=0.05)
        stop = anyio.Event()
        async with anyio.create_task_group() as group:
            group.start_soon(worker.serve, stop)
            start = time.perf_counter()
            await submit_all(
                lambda i: submit(store, "noop", f"task {i}", bus=worker.bus), tasks, submitters
            )
            submitted = time.perf_counter()
            # A 2 ms tick (under 1 % of a measurement) costs the worker less than an
            # observer called for every event would.
            while worker.executed < tasks:  # noqa: ASYNC110
                await anyio.sleep(0.002)
            done = time.perf_counter()
            stop.set()
        await _check_succeeded(store, tasks)
    finally:
        await store.close()
    return {
        "submit_while_running_per_s": tasks / (submitted - start),
        "total_per_s": tasks / (done - start),
    }


async def corral_serial(
    url: str, home: Path, tasks: int, concurrency: int, submitters: int
) -> dict[str, float]:
    """``tasks`` no-op runs submitted to a fresh store, then drained by a worker started
    after the last submit: the two halves' rates apart (and their sum)."""
    import anyio

    from corral.runtime.operations import submit
    from corral.runtime.worker import Worker

    store, settings = await _fresh_store(url, home)
    try:
        start = time.perf_counter()
        await submit_all(lambda i: submit(store, "noop", f"task {i}"), tasks, submitters)
        submitted = time.perf_counter()
        worker = Worker(store, settings, concurrency=concurrency, poll_seconds=0.05)
        await worker.serve(anyio.Event(), until_idle=True)
        done = time.perf_counter()
        await _check_succeeded(store, tasks)
    finally:
        await store.close()
    return {
        "submit_per_s": tasks / (submitted - start),
        "drain_per_s": tasks / (done - submitted),
        "serial_per_s": tasks / (done - start),
    }


async def _fresh_store(url: str, home: Path) -> tuple[Any, Any]:
    from corral.core.settings import Settings
    from corral.resources.loader import load_text
    from corral.store import open_store

    store = await open_store(url)
    await store.apply(load_text(RESOURCES, "bench.yaml"))
    return store, Settings(home=home, db_url=url, secret_key=None)


async def _check_succeeded(store: Any, tasks: int) -> None:
    from corral.core.runs import RunState

    succeeded = await store.list_runs("default", limit=tasks + 1, states=[RunState.SUCCEEDED])
    if len(succeeded) != tasks:
        raise RuntimeError(f"{len(succeeded)} of {tasks} tasks succeeded")


async def store_only(url: str, tasks: int, concurrency: int) -> float:
    """Tasks per second for the store operations of no-op tasks alone, without the engine.

    What the worker asks of the store for each task, ``concurrency`` tasks at a
    time: claims in batches, one read of the resources' fingerprint per batch
    (the runs of a claim share it), and the final save with the run's five
    journal events (``run.start`` ... ``run.finish``: a no-op run writes nothing
    before it). The store's ceiling for a drain.
    """
    import anyio

    from corral.core.events import (
        Event,
        MessageCreateData,
        RunFinishData,
        RunStartData,
        StepFinishData,
        StepStartData,
    )
    from corral.core.runs import Lease, RunRecord, RunState
    from corral.runtime.operations import submit

    store, _ = await _fresh_store(url, Path(url.removeprefix("sqlite:///")).parent)
    # the five events of a no-op run, their data as small as each type allows
    payloads = [
        RunStartData(agent="noop", input=""),
        StepStartData(step=1),
        MessageCreateData(step=1, message={}),
        StepFinishData(step=1),
        RunFinishData(state="succeeded"),
    ]
    try:
        for i in range(tasks):
            await submit(store, "noop", f"task {i}")
        slots = anyio.Semaphore(concurrency)

        async def one(record: RunRecord, lease: Lease) -> None:
            try:
                record.state = RunState.SUCCEEDED
                events = [Event(record.id, seq, data) for seq, data in enumerate(payloads, 1)]
                await store.save_run(record, lease, events=events)
            finally:
                slots.release()

        start = time.perf_counter()
        async with anyio.create_task_group() as group:
            claimed = 0
            while claimed < tasks:
                batch_size = max(1, concurrency // 8)
                for _ in range(batch_size):
                    await slots.acquire()
                batch = await store.claim_runs("bench", 60.0, batch_size)
                await store.resources_fingerprint("default")
                claimed += len(batch)
                for _ in range(batch_size - len(batch)):
                    slots.release()
                for record, lease in batch:
                    group.start_soon(one, record, lease)
        return tasks / (time.perf_counter() - start)
    finally:
        await store.close()


async def corral_child(args: argparse.Namespace) -> None:
    """One measurement of Corral on SQLite (``--db-url sqlite``) or PostgreSQL."""
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        home = Path(tmp)
        os.environ["CORRAL_HOME"] = tmp
        warm = min(args.tasks, 50)
        shape = (args.tasks, args.concurrency, args.submitters)
        if args.db_url == "sqlite":
            figures = {}
            await corral_once(
                f"sqlite:///{home / 'warm.db'}", home, warm, args.concurrency, args.submitters
            )
            freeze_heap()
            if args.store_only:
                figures["store_only_per_s"] = await store_only(
                    f"sqlite:///{home / 'ops.db'}", args.tasks, args.concurrency
                )
            figures |= await corral_serial(f"sqlite:///{home / 'serial.db'}", home, *shape)
            figures |= await corral_once(f"sqlite:///{home / 'corral.db'}", home, *shape)
            emit(figures)
            return
        async with ScratchDatabase(args.db_url) as (warm_url, url):
            if (why := await cannot_open(warm_url)) is not None:
                emit({"unsupported": why})
                return
            await corral_once(warm_url, home, warm, args.concurrency, args.submitters)
            freeze_heap()
            figures = await corral_once(url, home, *shape)
        async with ScratchDatabase(args.db_url) as (_, url):
            figures |= await corral_serial(url, home, *shape)
        emit(figures)


async def cannot_open(url: str) -> str | None:
    """Why Corral cannot open a store at ``url`` (its support is being built), or ``None``."""
    from corral.store import open_store

    try:
        store = await open_store(url)
    except Exception as exc:  # noqa: BLE001 - any failure to open means "not supported (yet)"
        return f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
    await store.close()
    return None


class ScratchDatabase:
    """Two fresh PostgreSQL databases next to the one ``url`` names, dropped afterwards.

    Measuring in the named database itself could collide with other users of
    it (integration tests run there); a database of our own cannot. A server
    that refuses is a failure of the measurement.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.names = [f"corral_bench_{os.getpid()}_{n}" for n in ("warm", "run")]

    def _url(self, name: str) -> str:
        parts = urlsplit(self.url)
        return urlunsplit(parts._replace(path=f"/{name}"))

    async def _admin(self, statements: list[str]) -> None:
        import asyncpg  # Corral's PostgreSQL driver

        conn = await asyncpg.connect(self.url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    async def __aenter__(self) -> tuple[str, str]:
        await self._admin([f'DROP DATABASE IF EXISTS "{n}"' for n in self.names])
        await self._admin([f'CREATE DATABASE "{n}"' for n in self.names])
        return self._url(self.names[0]), self._url(self.names[1])

    async def __aexit__(self, *exc: object) -> None:
        await self._admin([f'DROP DATABASE IF EXISTS "{n}" WITH (FORCE)' for n in self.names])


async def dbos_child(args: argparse.Namespace) -> None:
    """One measurement of a DBOS queue on SQLite: enqueue no-op workflows, await them all."""
    from dbos import DBOS
    from peers import dbos_queue

    with tempfile.TemporaryDirectory(prefix="dbos-bench-") as tmp:
        DBOS(
            config={
                "name": "corral-bench-queue",
                "system_database_url": f"sqlite:///{Path(tmp) / 'dbos.sqlite'}",
                "log_level": "WARNING",
            }
        )
        DBOS.launch()
        try:
            queue = await DBOS.register_queue_async(
                "bench", worker_concurrency=args.concurrency, polling_interval_sec=0.05
            )
            await dbos_queue.enqueue_and_wait(queue, min(args.tasks, 20), args.submitters)
            freeze_heap()
            start = time.perf_counter()
            submit_seconds = await dbos_queue.enqueue_and_wait(queue, args.tasks, args.submitters)
            total = time.perf_counter() - start
        finally:
            DBOS.destroy()
    emit(
        {
            "submit_while_running_per_s": args.tasks / submit_seconds,
            "total_per_s": args.tasks / total,
        }
    )


def child_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("system", choices=["corral", "dbos"])
    parser.add_argument("--db-url", default="sqlite")
    parser.add_argument("--tasks", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--submitters", type=int, required=True)
    parser.add_argument("--store-only", action="store_true")
    args = parser.parse_args(argv)
    asyncio.run(corral_child(args) if args.system == "corral" else dbos_child(args))


# --------------------------------------------------------------------------- the parent


def reachable(url: str) -> bool:
    """Whether something accepts TCP connections where ``url`` points."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5432), 2):
            return True
    except OSError:
        return False


def postgres_status(url: str) -> str | None:
    """Why Corral on PostgreSQL cannot be measured here, or ``None`` when it can be tried."""
    if not reachable(url):
        return f"not reachable ({urlsplit(url).netloc})"
    if importlib.util.find_spec("asyncpg") is None:
        return "not supported yet (no PostgreSQL driver installed with Corral)"
    return None


def nats_status() -> str:
    """This section does not measure NATS (it runs in-process workers): say where it is."""
    try:
        found = importlib.util.find_spec("corral.bus.nats") is not None
    except ModuleNotFoundError:  # no corral.bus package at all
        found = False
    if not found:
        return "not built (Corral has no NATS JetStream bus yet)"
    return "see 6. Scale-out (worker processes)"


def run(config: Config, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure every system of ``config``, interleaved; the raw rates per round."""
    from peers import missing

    systems: dict[str, list[str] | None] = {
        "corral-sqlite": ["corral", "--db-url=sqlite"]
        + (["--store-only"] if config.store_only else []),
        "corral-postgres": None,
        "dbos-sqlite": None if missing("dbos") else ["dbos"],
    }
    status = {
        "corral-sqlite": "ok",
        "corral-postgres": "ok",
        "corral-postgres-nats": nats_status(),
        "dbos-sqlite": "ok" if systems["dbos-sqlite"] else "not installed (dbos)",
    }
    pg_url = config.postgres_url or os.environ.get(
        "CORRAL_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL
    )
    if (why := postgres_status(pg_url)) is None:
        systems["corral-postgres"] = ["corral", f"--db-url={pg_url}"]
    else:
        status["corral-postgres"] = why
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    errors: dict[str, list[str]] = {name: [] for name in systems}
    for round_no in range(config.rounds):
        for name, args in systems.items():
            if args is None:
                continue
            tasks = config.tasks if name == "corral-sqlite" else config.slow_tasks
            result = run_child(
                [
                    str(BENCH / "throughput.py"),
                    "--child",
                    *args,
                    f"--tasks={tasks}",
                    f"--concurrency={config.concurrency}",
                    f"--submitters={config.submitters}",
                ],
                timeout=config.timeout,
            )
            if result.ok and "unsupported" in result.data:
                status[name] = f"not supported yet ({result.data['unsupported']})"
                systems[name] = None
                shown = status[name]
            elif result.ok:
                samples[name].append(result.data)
                shown = f"{result.data['total_per_s']:.0f} tasks/s"
            else:
                errors[name].append(result.error or "")
                shown = result.error or ""
            log(f"[throughput] round {round_no + 1}/{config.rounds} {name}: {shown}")
    for name in systems:
        if status.get(name) == "ok" and not samples[name]:
            status[name] = f"failed: {errors[name][0]}"
    return {
        "tasks": {
            name: config.tasks if name == "corral-sqlite" else config.slow_tasks for name in systems
        },
        "concurrency": config.concurrency,
        "submitters": config.submitters,
        "rounds": config.rounds,
        "postgres_url": pg_url,
        "target_per_s": TARGET_PER_SECOND,
        "status": status,
        "samples": samples,
        "errors": errors,
    }


LABELS = {
    "corral-sqlite": "Corral, SQLite",
    "corral-postgres": "Corral, PostgreSQL (no NATS)",
    "corral-postgres-nats": "Corral, PostgreSQL + NATS JetStream",
    "dbos-sqlite": "DBOS queue, SQLite",
}


def render(result: dict[str, Any]) -> str:
    """Tasks per second, median (min-max) over the rounds."""
    rows = []
    for name, label in LABELS.items():
        status = result["status"][name]
        target = f">= {result['target_per_s']:,}/s" if name == "corral-sqlite" else ""
        got = result["samples"].get(name) or []
        if status != "ok" or not got:
            rows.append([label, status, "", "", "", "", "", target])
            continue

        def col(key: str, got: list[dict[str, Any]] = got) -> str:
            values = [s[key] for s in got if key in s]
            return spread(values, 0) if values else "-"

        tasks = result["tasks"][name]
        failures = f" ({len(result['errors'][name])} failed)" if result["errors"][name] else ""
        rows.append(
            [
                f"{label}{failures}",
                f"{tasks:,}",
                f"**{col('total_per_s')}**",
                col("submit_while_running_per_s"),
                col("submit_per_s"),
                col("drain_per_s"),
                col("serial_per_s"),
                target,
            ]
        )
        if "store_only_per_s" in got[0]:
            rows.append(
                [
                    "  the same store operations alone, no engine",
                    f"{tasks:,}",
                    "",
                    "",
                    "",
                    col("store_only_per_s"),
                    "",
                    "",
                ]
            )
    return (
        table(
            [
                "system",
                "tasks",
                "submit -> succeeded /s",
                "(its submits /s)",
                "submit alone /s",
                "drain alone /s",
                "submit, then drain /s",
                "target",
            ],
            rows,
        )
        + "\n\nThe first figure is the section's result: the worker (DBOS: its queue) runs "
        "while tasks are submitted, as in a deployment. The last three come from a second "
        "measurement in the same child, where every task is submitted before the worker "
        "starts: the rate of each half apart."
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child_main(sys.argv[2:])
    else:
        sys.exit("run the benchmark with bench/run.py (this module is one of its sections)")
