"""A long system run: how a coordinator pass's cost grows with the run's history.

A ping-pong ``AgentSystem`` on the ``scripted`` provider (no model time): ``ping``
sends to ``pong`` and ``pong`` back to ``ping`` until ``limits.max_hops`` (``--hops``,
default 200) stops it (``budget_exceeded``: a scripted agent answers the same every
run, so nothing else ends the cycle). The run makes ``hops + 1`` node runs and as
many coordinator passes, one after another: its wall time grows linearly with the
hops when a pass costs what changed, quadratically when each pass rereads the run.

One in-process :class:`~corral.runtime.worker.Worker` (8 slots) on a fresh SQLite
store, as embedded mode runs it. Also counts the rows the store's reads of the run's
history return (``list_agent_messages``, ``list_children``, ``list_events``).

    .venv/bin/python bench/syshops.py [--hops 200] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any


def resources(hops: int) -> str:
    """The system and its agents (JSON is YAML)."""
    docs: list[dict[str, Any]] = []
    for name in ("ping", "pong"):
        script = [{"text": name, "input_tokens": 10, "output_tokens": 2}]
        docs.append(
            {
                "kind": "ModelEndpoint",
                "metadata": {"name": f"{name}-model"},
                "spec": {"provider": "scripted", "script": script},
            }
        )
        docs.append(
            {"kind": "Agent", "metadata": {"name": name}, "spec": {"model": f"{name}-model"}}
        )
    docs.append(
        {
            "kind": "AgentSystem",
            "metadata": {"name": "rally"},
            "spec": {
                "entry": "ping",
                "graph": {"ping": {"next": ["pong"]}, "pong": {"next": ["ping"]}},
                "output": "pong",
                "limits": {"max_hops": hops, "max_messages": hops + 2},
            },
        }
    )
    return "\n---\n".join(json.dumps({"apiVersion": "corral/v1", **d}) for d in docs)


def timed_passes(coordinator: Any) -> list[float]:
    """Time each pass of ``coordinator`` (the journal read the executor asks it for, and
    the pass): the list the times go to, in pass order."""
    times: list[float] = []
    run = coordinator.run
    journal = getattr(coordinator, "journal", None)  # (a coordinator that reads it itself)
    began: list[float] = []

    async def timed_journal(*args: Any) -> Any:
        began.append(time.perf_counter())
        return await journal(*args)

    async def timed_run(*args: Any) -> Any:
        if journal is None:
            began.append(time.perf_counter())
        try:
            return await run(*args)
        finally:
            times.append(time.perf_counter() - began.pop())

    if journal is not None:
        coordinator.journal = timed_journal
    coordinator.run = timed_run
    return times


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


async def measure(hops: int) -> dict[str, Any]:
    from corral.core.runs import RunState
    from corral.core.settings import Settings
    from corral.resources.loader import load_text
    from corral.runtime import system_runs
    from corral.runtime.worker import Worker
    from corral.store import open_store

    with tempfile.TemporaryDirectory() as home:
        settings = Settings(home=Path(home), db_url=f"sqlite:///{home}/corral.db", secret_key=None)
        store = await open_store(settings.db_url)
        rows = {"list_agent_messages": 0, "list_children": 0, "list_events": 0}
        for name in rows:
            original = getattr(store, name)

            def counted(*args: Any, _name: str = name, _original: Any = original, **kw: Any) -> Any:
                async def call() -> Any:
                    found = await _original(*args, **kw)
                    rows[_name] += len(found)
                    return found

                return call()

            setattr(store, name, counted)
        try:
            await store.apply(load_text(resources(hops), "rally.yaml"))
            run, _ = await system_runs.submit_system(store, "rally", "serve")
            worker = Worker(store, settings, concurrency=8, poll_seconds=0.01)
            passes = timed_passes(worker.executor.systems)
            started = time.perf_counter()
            await worker.serve(asyncio.Event(), until_idle=True)  # type: ignore[arg-type]
            wall = time.perf_counter() - started
            done = await store.get_run(run.id)
            assert done is not None and done.state is RunState.FAILED, done
            assert done.error is not None and done.error.get("limit") == "max_hops", done.error
            children = await store.list_children(run.id)
            return {
                "hops": hops,
                "node_runs": len(children),
                "seconds": round(wall, 2),
                "ms_per_hop": round(1000 * wall / hops, 1),
                # a pass: its journal read and the pass itself, in ms, at the run's start
                # and at its end (a pass that rereads the run grows from one to the other)
                "pass_ms_first_tenth": round(1000 * median(passes[: len(passes) // 10]), 1),
                "pass_ms_last_tenth": round(1000 * median(passes[-(len(passes) // 10) :]), 1),
                "rows_read": rows,
            }
        finally:
            await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hops", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    for _ in range(args.rounds):
        print(json.dumps(asyncio.run(measure(args.hops))))


if __name__ == "__main__":
    main()
