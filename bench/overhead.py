"""Section 1, agent-loop overhead: the same tool-calling task through every framework.

One fake OpenAI-compatible server process (``bench/fake_server.py``) answers
every framework: ``calls`` tool calls to ``add``, one per turn, then a final
answer, so a task is ``calls + 1`` model calls. Each measurement is a child
process (``python bench/overhead.py --child NAME ...``) that imports one
framework, builds it and runs one task (its cold start, reported), runs an
untimed warm-up, then times ``tasks`` tasks at ``concurrency`` and checks the
work was really done: every answer is the expected text, the tool ran
``tasks * calls`` times and the server answered ``tasks * (calls + 1)`` model
calls.

The parent interleaves: round after round, each concurrency level runs every
framework in turn (floor, corral, ..., floor, corral, ...), so a noisy
neighbour shows as spread in every row instead of a false ranking. A row's
ratio to the floor is taken per round, against the floor measured in the same
round at the same level.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from typing import Any

from _common import (
    BENCH,
    FakeServerProcess,
    emit,
    freeze_heap,
    median,
    run_child,
    spread,
    table,
)
from peers import TARGETED

TARGET_RATIO = 1.5  # Corral durable run vs the floor, at c=1 and c=50 (the target)


@dataclass(frozen=True)
class Config:
    """How much to measure."""

    frameworks: tuple[str, ...]
    levels: tuple[int, ...] = (1, 50)
    rounds: int = 5
    calls: int = 3
    # Long enough that a measurement is not one burst of start-up and tail: at c=1 a task
    # of the floor takes ~10 ms here, and at c=50 a wave's first and last runs overlap
    # less with the others.
    tasks_at_1: int = 50  # tasks per measurement at concurrency 1
    waves: int = 4  # above concurrency 1: tasks per measurement = waves x concurrency
    timeout: float = 600.0

    def tasks(self, level: int) -> int:
        return self.tasks_at_1 if level == 1 else self.waves * level


# --------------------------------------------------------------------------- the child


async def measure(name: str, base_url: str, calls: int, concurrency: int, tasks: int) -> None:
    """Build framework ``name``, warm it up, time ``tasks`` tasks and emit the figures."""
    import peers
    from bench_tools import take_calls
    from peers._base import Setup, expected_answer

    # cold start: import the framework, build it, run one task (its lazy imports included)
    started = time.perf_counter()
    framework = peers.load(name)()
    await framework.start(Setup(base_url=base_url, calls=calls, concurrency=concurrency))
    try:
        check(await framework.run(1, 0), expected_answer(calls), 1)
        cold_seconds = time.perf_counter() - started
        import httpx  # only now: most frameworks import it, and it counts in their cold start

        # untimed: connection pools filled, caches warm
        warmup = max(2, concurrency)
        check(await framework.run(warmup, 1), expected_answer(calls), warmup)
        freeze_heap()
        stats_url = base_url.removesuffix("/v1") + "/bench/stats"
        async with httpx.AsyncClient() as http:
            await http.post(stats_url)  # resets the server's counters
            take_calls()
            start = time.perf_counter()
            answers = await framework.run(tasks, 1_000_000)
            seconds = time.perf_counter() - start
            served = (await http.post(stats_url)).json()["served"]
    finally:
        await framework.stop()
    check(answers, expected_answer(calls), tasks)
    if (tool_calls := take_calls()) != tasks * calls:
        raise RuntimeError(f"the tool ran {tool_calls} times, not {tasks * calls}")
    if served != tasks * (calls + 1):
        raise RuntimeError(f"the server answered {served} model calls, not {tasks * (calls + 1)}")
    emit(
        {
            "seconds": seconds,
            "tasks": tasks,
            "model_calls": served,
            "ms_per_call": 1000 * seconds / served,
            "runs_per_s": tasks / seconds,
            "cold_s": cold_seconds,
        }
    )


def check(answers: list[str], expected: str, count: int) -> None:
    """Every task came back with the fake model's final answer."""
    wrong = [a for a in answers if a != expected]
    if len(answers) != count or wrong:
        raise RuntimeError(f"{len(wrong)} of {count} answers wrong, e.g. {wrong[:1]!r}")


def child_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--tasks", type=int, required=True)
    args = parser.parse_args(argv)
    asyncio.run(measure(args.name, args.base_url, args.calls, args.concurrency, args.tasks))


# --------------------------------------------------------------------------- the parent


def run(config: Config, log: Any = print) -> dict[str, Any]:
    """Measure every framework of ``config``, interleaved; the raw figures per round."""
    import peers

    absent = {name: peers.missing(name) for name in config.frameworks}
    present = [name for name in config.frameworks if not absent[name]]
    samples: dict[str, list[dict[str, Any]]] = {}
    with FakeServerProcess(config.calls) as server:
        for round_no in range(config.rounds):
            for level in config.levels:
                for name in present:
                    tasks = config.tasks(level)
                    args = [
                        str(BENCH / "overhead.py"),
                        "--child",
                        name,
                        f"--base-url={server.base_url}",
                        f"--calls={config.calls}",
                        f"--concurrency={level}",
                        f"--tasks={tasks}",
                    ]
                    result = run_child(args, timeout=config.timeout)
                    sample = {"round": round_no, **result.data, "error": result.error}
                    samples.setdefault(f"{name}@{level}", []).append(sample)
                    shown = (
                        f"{result.data['ms_per_call']:.2f} ms/call" if result.ok else result.error
                    )
                    log(
                        f"[overhead] round {round_no + 1}/{config.rounds} c={level} {name}: {shown}"
                    )
    rows = []
    for level in config.levels:
        floor = {s["round"]: s for s in samples.get(f"floor@{level}", []) if not s["error"]}
        for name in config.frameworks:
            row: dict[str, Any] = {"name": name, "label": peers.LABELS[name], "level": level}
            row["durable"] = name in peers.DURABLE
            if absent[name]:
                row["status"] = "not installed (" + ", ".join(absent[name]) + ")"
                rows.append(row)
                continue
            good = [s for s in samples[f"{name}@{level}"] if not s["error"]]
            errors = [s["error"] for s in samples[f"{name}@{level}"] if s["error"]]
            row["status"] = "ok" if good else f"failed: {errors[0]}"
            row["failures"] = errors
            for key in ("ms_per_call", "runs_per_s", "rss_mb", "cold_s"):
                row[key] = [s[key] for s in good]
            row["ratio"] = [
                s["ms_per_call"] / floor[s["round"]]["ms_per_call"]
                for s in good
                if s["round"] in floor
            ]
            rows.append(row)
    return {
        "calls": config.calls,
        "rounds": config.rounds,
        "levels": list(config.levels),
        "tasks": {str(level): config.tasks(level) for level in config.levels},
        "target_ratio": TARGET_RATIO,
        "rows": rows,
    }


def render(result: dict[str, Any]) -> str:
    """One table per concurrency level: median (min-max) over the rounds."""
    parts = []
    for level in result["levels"]:
        lines = []
        for row in (r for r in result["rows"] if r["level"] == level):
            target = f"<= {result['target_ratio']}x" if row["name"] in TARGETED else ""
            if row["status"] != "ok":
                lines.append([row["label"], row["status"], "", "", "", "", "", target])
                continue
            ratio = "1 (the floor)" if row["name"] == "floor" else spread(row["ratio"], 2, "x")
            failures = f" ({len(row['failures'])} failed)" if row["failures"] else ""
            lines.append(
                [
                    row["label"] + failures,
                    "yes" if row["durable"] else "no",
                    spread(row["ms_per_call"], 2),
                    spread(row["runs_per_s"], 1),
                    ratio,
                    f"{median(row['rss_mb']):.0f}",
                    f"{median(row['cold_s']):.2f}",
                    target,
                ]
            )
        tasks = result["tasks"][str(level)]
        parts.append(
            f"Concurrency {level} ({tasks} tasks of {result['calls']} tool calls + 1 answer "
            f"per measurement):\n\n"
            + table(
                [
                    "framework",
                    "durable",
                    "ms per model call",
                    "runs/s",
                    "x floor",
                    "peak RSS MB",
                    "cold start s",
                    "target",
                ],
                lines,
            )
        )
    return "\n\n".join(parts)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child_main(sys.argv[2:])
    else:
        sys.exit("run the benchmark with bench/run.py (this module is one of its sections)")
