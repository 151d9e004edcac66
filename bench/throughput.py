"""Durable no-op task throughput on SQLite: submit to succeeded.

``--tasks`` runs of an agent on the ``scripted`` provider (one text turn, no
tools) are submitted to a fresh SQLite store, then drained by one in-process
:class:`~corral.runtime.worker.Worker` with concurrency ``--concurrency``. Each
task is a full durable run: queued, claimed under a lease, journaled
(``run.start``, the model's message, ``run.finish``) and saved as succeeded,
every write committed with ``synchronous=FULL``.

    .venv/bin/python bench/throughput.py [--runs 5] [--tasks 2000] [--concurrency 256]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, spread, table

from corral.core.events import Event, EventType
from corral.core.runs import Lease, RunRecord, RunState
from corral.core.settings import Settings
from corral.resources.loader import load_text
from corral.runtime.local import submit
from corral.runtime.worker import Worker
from corral.store import open_store

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


async def once(tasks: int, concurrency: int, submitters: int) -> tuple[float, float, float]:
    """Seconds to submit ``tasks``, to drain them, and the two together."""
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        home = Path(tmp)
        url = f"sqlite:///{home / 'corral.db'}"
        settings = Settings(home=home, db_url=url, secret_key=None)
        store = await open_store(url)
        try:
            await store.apply(load_text(RESOURCES, "bench.yaml"))
            start = time.perf_counter()

            async def submitter(count: int) -> None:
                for i in range(count):
                    await submit(store, "noop", f"task {i}")

            async with anyio.create_task_group() as group:
                share, extra = divmod(tasks, submitters)
                for n in range(submitters):
                    group.start_soon(submitter, share + (1 if n < extra else 0))
            submitted = time.perf_counter()
            worker = Worker(store, settings, concurrency=concurrency, poll_seconds=0.05)
            await worker.serve(anyio.Event(), until_idle=True)
            done = time.perf_counter()
            succeeded = await store.list_runs(
                "default", limit=tasks + 1, states=[RunState.SUCCEEDED]
            )
            if len(succeeded) != tasks:
                raise RuntimeError(f"{len(succeeded)} of {tasks} tasks succeeded")
            return submitted - start, done - submitted, done - start
        finally:
            await store.close()


async def store_only(tasks: int, concurrency: int) -> float:
    """Seconds for the store operations of ``tasks`` no-op tasks, without the engine.

    The same reads and writes the worker makes for each task (claim in batches,
    read the journal and the agent's resources, two journal writes, the approvals
    read, the final save), ``concurrency`` tasks at a time: the store's ceiling.
    """
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        store = await open_store(f"sqlite:///{Path(tmp) / 'corral.db'}")
        try:
            await store.apply(load_text(RESOURCES, "bench.yaml"))
            for i in range(tasks):
                await submit(store, "noop", f"task {i}")
            start = time.perf_counter()

            slots = anyio.Semaphore(concurrency)

            async def one(record: RunRecord, lease: Lease) -> None:
                try:
                    await steps(record, lease)
                finally:
                    slots.release()

            async def steps(record: RunRecord, lease: Lease) -> None:
                await store.list_events(record.id)
                await store.get_resource("default", "Agent", "noop")
                await store.get_resource("default", "ModelEndpoint", "script")
                await store.append_events([Event(record.id, 1, EventType.RUN_START)], lease)
                later = [Event(record.id, seq, EventType.STEP_START) for seq in range(2, 6)]
                await store.append_events(later, lease)
                await store.list_approvals(run_id=record.id)
                record.state = RunState.SUCCEEDED
                await store.save_run(record, lease)

            async with anyio.create_task_group() as group:
                claimed = 0
                while claimed < tasks:
                    batch_size = max(1, concurrency // 8)
                    for _ in range(batch_size):
                        await slots.acquire()
                    batch = await store.claim_runs("bench", 60.0, batch_size)
                    claimed += len(batch)
                    for _ in range(batch_size - len(batch)):
                        slots.release()
                    for record, lease in batch:
                        group.start_soon(one, record, lease)
            return time.perf_counter() - start
        finally:
            await store.close()


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="repetitions")
    parser.add_argument("--tasks", type=int, default=2000, help="tasks per repetition")
    parser.add_argument("--concurrency", type=int, default=256, help="the worker's concurrency")
    parser.add_argument("--submitters", type=int, default=16, help="concurrent submitting tasks")
    args = parser.parse_args(argv)
    await once(min(args.tasks, 50), args.concurrency, args.submitters)  # warm-up, untimed
    submit_rate: list[float] = []
    drain_rate: list[float] = []
    total_rate: list[float] = []
    store_rate: list[float] = []
    for _ in range(args.runs):
        store_rate.append(args.tasks / await store_only(args.tasks, args.concurrency))
        submit_s, drain_s, total_s = await once(args.tasks, args.concurrency, args.submitters)
        submit_rate.append(args.tasks / submit_s)
        drain_rate.append(args.tasks / drain_s)
        total_rate.append(args.tasks / total_s)
    print(
        f"durable no-op throughput: {args.tasks} tasks, worker concurrency {args.concurrency}, "
        f"{args.submitters} submitters, {machine()}"
    )
    print(f"{args.runs} runs: median (min-max)\n")
    print(
        table(
            ["measure", "tasks/s"],
            [
                ["submit (queued)", spread(submit_rate, 0)],
                ["drain (claimed -> succeeded)", spread(drain_rate, 0)],
                ["submit -> succeeded", spread(total_rate, 0)],
                ["store operations of a task alone", spread(store_rate, 0)],
            ],
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
