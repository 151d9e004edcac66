"""Section 3, scale of concurrency: 1,000 runs in flight at once on one Corral worker.

A fake server (its own process) answers every model call ``delay`` seconds
late, so the runs pile up: one worker with ``runs`` slots claims them all, and
every run waits on its model at the same time. The delay has to outlast the
worker's ramp (claiming, building and starting 1,000 runs); the server reports
the most requests it held at once, so "all in flight" is checked, not assumed.
Each run is the benchmark task with ``calls`` tool calls, journaled on a fresh
SQLite store.

Measured in the worker's process (a child): its peak RSS (``getrusage``), its
RSS once warm and idle (after one run against a second, undelayed fake server:
interpreter, Corral, an open store, lazy imports done), and each step's latency
from its journal (``step.finish`` minus ``step.start``), reported as the excess
over the model's fixed ``delay``: what the worker itself added while 1,000 runs
competed for one process.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import (
    BENCH,
    FakeServerProcess,
    emit,
    freeze_heap,
    median,
    peak_rss_mb,
    percentile,
    run_child,
    spread,
    table,
)

TARGET_RSS_MB = 300  # 1,000 in-flight runs on one worker (the target)


@dataclass(frozen=True)
class Config:
    """How much to measure."""

    rounds: int = 3
    runs: int = 1000
    calls: int = 1
    # longer than the worker's ramp to 1,000 runs on a busy 2-core machine (about 11 s seen)
    delay: float = 20.0
    timeout: float = 600.0


# --------------------------------------------------------------------------- the child


def current_rss_mb() -> float:
    """This process's resident set size now, in MiB."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 1024 / 1024


async def measure(warm_url: str, base_url: str, runs: int, calls: int, delay: float) -> None:
    import anyio
    import httpx
    from peers._base import Setup, prompt
    from peers.corral_durable import resources

    from corral.core.events import StepFinishData, StepStartData
    from corral.core.runs import RunState
    from corral.core.settings import Settings
    from corral.resources.loader import load_text
    from corral.runtime.operations import submit
    from corral.runtime.worker import Worker
    from corral.store import open_store

    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        os.environ["CORRAL_HOME"] = tmp
        url = f"sqlite:///{Path(tmp) / 'corral.db'}"
        settings = Settings(home=Path(tmp), db_url=url, secret_key=None)
        store = await open_store(url)
        try:
            # one run against the undelayed server first, then point the endpoint at the
            # delayed one (an ordinary re-apply): lazy imports and first-use costs are done
            warm = Setup(base_url=warm_url, calls=calls, concurrency=1)
            await store.apply(load_text(resources(warm), "bench.yaml"))
            await submit(store, "calculator", prompt(-1))
            await Worker(store, settings, concurrency=1).serve(anyio.Event(), until_idle=True)
            freeze_heap()
            setup = Setup(base_url=base_url, calls=calls, concurrency=runs)
            await store.apply(load_text(resources(setup), "bench.yaml"))
            idle = current_rss_mb()

            stats_url = base_url.removesuffix("/v1") + "/bench/stats"
            async with httpx.AsyncClient() as http:
                await http.post(stats_url)
                start = time.perf_counter()
                ids = [(await submit(store, "calculator", prompt(i)))[0].id for i in range(runs)]
                worker = Worker(store, settings, concurrency=runs, poll_seconds=0.05)
                most_active = 0

                async def watch(done: anyio.Event) -> None:
                    nonlocal most_active
                    while not done.is_set():
                        most_active = max(most_active, len(worker.active))
                        with anyio.move_on_after(0.05):
                            await done.wait()

                done = anyio.Event()
                async with anyio.create_task_group() as group:
                    group.start_soon(watch, done)
                    await worker.serve(anyio.Event(), until_idle=True)
                    done.set()
                wall = time.perf_counter() - start
                server = (await http.post(stats_url)).json()
            excess: list[float] = []
            for run_id in ids:
                record = await store.get_run(run_id)
                if record is None or record.state is not RunState.SUCCEEDED:
                    raise RuntimeError(f"run {run_id} did not succeed: {record}")
                started: dict[int, float] = {}
                for event in await store.list_events(run_id):
                    if isinstance(event.data, StepStartData):
                        started[event.data.step] = event.ts
                    elif isinstance(event.data, StepFinishData):
                        excess.append(event.ts - started.pop(event.data.step) - delay)
        finally:
            await store.close()
    if len(excess) != runs * (calls + 1):
        raise RuntimeError(f"{len(excess)} steps journaled, not {runs * (calls + 1)}")
    emit(
        {
            "wall_s": wall,
            "idle_rss_mb": idle,
            "peak_rss_mb": peak_rss_mb(),
            "max_in_flight": server["max_in_flight"],
            "max_active": most_active,
            "step_excess_p50_ms": 1000 * median(excess),
            "step_excess_p99_ms": 1000 * percentile(excess, 99),
            "step_excess_max_ms": 1000 * max(excess),
        }
    )


def child_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--warm-url", required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--runs", type=int, required=True)
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--delay", type=float, required=True)
    args = parser.parse_args(argv)
    asyncio.run(measure(args.warm_url, args.base_url, args.runs, args.calls, args.delay))


# --------------------------------------------------------------------------- the parent


def run(config: Config, log: Any = print) -> dict[str, Any]:
    """Repeat the measurement ``rounds`` times; the raw figures of each."""
    samples: list[dict[str, Any]] = []
    errors: list[str] = []
    with (
        FakeServerProcess(config.calls) as instant,
        FakeServerProcess(config.calls, delay=config.delay) as slow,
    ):
        for round_no in range(config.rounds):
            result = run_child(
                [
                    str(BENCH / "scale.py"),
                    "--child",
                    f"--warm-url={instant.base_url}",
                    f"--base-url={slow.base_url}",
                    f"--runs={config.runs}",
                    f"--calls={config.calls}",
                    f"--delay={config.delay}",
                ],
                timeout=config.timeout,
            )
            if result.ok:
                samples.append(result.data)
                shown = (
                    f"{result.data['max_in_flight']} in flight, "
                    f"{result.data['peak_rss_mb']:.0f} MB peak RSS"
                )
            else:
                errors.append(result.error or "")
                shown = result.error or ""
            log(f"[scale] round {round_no + 1}/{config.rounds}: {shown}")
    return {
        "runs": config.runs,
        "calls": config.calls,
        "delay_s": config.delay,
        "rounds": config.rounds,
        "target_rss_mb": TARGET_RSS_MB,
        "samples": samples,
        "errors": errors,
    }


def render(result: dict[str, Any]) -> str:
    """One row of medians (min-max) over the rounds."""
    got = result["samples"]
    header = [
        "runs",
        "most in flight at the model",
        "peak RSS MB",
        "RSS warm, idle MB",
        "step p50, ms over the model's wait",
        "step p99, ms over the model's wait",
        "target",
    ]
    target = f"peak RSS < {result['target_rss_mb']} MB, all in flight"
    if not got:
        reason = result["errors"][0] if result["errors"] else "no rounds"
        return table(header, [[str(result["runs"]), f"failed: {reason}", "", "", "", "", target]])

    def col(key: str) -> str:
        return spread([s[key] for s in got], 0)

    failures = f" ({len(result['errors'])} failed)" if result["errors"] else ""
    return table(
        header,
        [
            [
                f"{result['runs']:,}{failures}",
                col("max_in_flight"),
                col("peak_rss_mb"),
                col("idle_rss_mb"),
                col("step_excess_p50_ms"),
                col("step_excess_p99_ms"),
                target,
            ]
        ],
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child_main(sys.argv[2:])
    else:
        sys.exit("run the benchmark with bench/run.py (this module is one of its sections)")
