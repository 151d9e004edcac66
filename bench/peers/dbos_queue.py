"""DBOS's queue, for the throughput section: no-op workflows of one recorded step each.

One step per workflow mirrors Corral's no-op task, whose one model turn (a
scripted text) is journaled; a DBOS workflow with no step at all would record
less than Corral does.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
from dbos import DBOS


@DBOS.step()
async def noop_step(index: int) -> int:
    """A step whose result DBOS records, like Corral's journaled model turn."""
    return index


@DBOS.workflow()
async def noop_workflow(index: int) -> int:
    """The no-op task."""
    return await noop_step(index)


async def enqueue_and_wait(queue: Any, tasks: int, submitters: int) -> float:
    """Enqueue ``tasks`` workflows from ``submitters`` callers, wait for all; the enqueue time."""
    handles: list[Any] = []

    async def submitter(first: int, count: int) -> None:
        for index in range(first, first + count):
            handles.append(await queue.enqueue_async(noop_workflow, index))

    start = time.perf_counter()
    async with anyio.create_task_group() as group:
        share, extra = divmod(tasks, submitters)
        first = 0
        for n in range(submitters):
            count = share + (1 if n < extra else 0)
            group.start_soon(submitter, first, count)
            first += count
    submitted = time.perf_counter() - start
    results = [await handle.get_result() for handle in handles]
    if sorted(results) != list(range(tasks)):
        raise RuntimeError(f"{len(results)} of {tasks} workflows returned what they should")
    return submitted
