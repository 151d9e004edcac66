"""Section 8, multi-agent: what a delegation to a linked agent costs, and fan-out.

Every run here is a durable run on a fresh SQLite store, executed by one
in-process :class:`~corral.runtime.worker.Worker` (32 slots; every submit and
every child run is announced on its bus, as in embedded mode), on the
``scripted`` provider, so no model time is in any figure:

- **delegation**: a parent whose first turn calls ``agents_exec`` on a linked
  one-turn agent, then answers, against the same parent calling a plain
  ``python`` tool (``add``) instead. The delegation adds a child run (submitted,
  claimed, executed, saved), the parent parked in ``waiting_children`` and
  queued, claimed and resumed again when its child finishes. Timed per parent run
  from the submit until the driver sees it finished (a watch of the run's events,
  woken by the commit of its outcome: no polling), one run at a time, the two
  kinds interleaved.
- **fan-out**: a parent whose first turn calls ``agents_exec`` 10 times (one
  turn, 10 tool calls: 10 child runs at once, slots free), against one call.
  Wall time of the parent run, the two interleaved; the figure is the ratio of
  the p50s. Three times: with children whose model answers at once (the ratio is
  then Corral's own cost per child run, which one worker process pays on one
  core), and with children whose model takes 5 ms (a local model's short answer)
  and 50 ms (a fast remote model's), the ``latency_seconds`` of the scripted turn:
  whether children run side by side, and from what model time their own cost is
  hidden behind it.

Each round is a child process (``multiagent.py --child``): it warms up untimed,
freezes its heap, measures. The page shows the median over rounds of each
round's p50/p95 and of the differences and ratios.

The section's third measurement, system-run throughput on SQLite and on
PostgreSQL + NATS, is :mod:`sysruns` (its result is this one's ``systems``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sysruns
from _common import BENCH, emit, fmt, freeze_heap, median, percentile, run_child, spread, table

#: the issue's targets
TARGET_DELEGATION_ADDS_MS = 3.0
TARGET_FAN_OUT_RATIO = 1.5
FAN_OUT = 10
#: the model times of the children in the other fan-out measurements, in milliseconds
CHILD_MODEL_MS = (5, 50)


@dataclass(frozen=True)
class Config:
    """How much to measure."""

    rounds: int = 3
    runs: int = 100  # parent runs of each delegation kind per round
    fan_runs: int = 30  # parent runs of each fan-out kind per round
    warmup: int = 5
    timeout: float = 600.0
    systems: sysruns.Config = field(default_factory=sysruns.Config)


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def resources() -> str:
    """The agents of both measurements, as a user would write them (JSON is YAML)."""

    def model(name: str, *turns: dict[str, Any]) -> dict[str, Any]:
        spec = {"provider": "scripted", "script": list(turns)}
        return {"kind": "ModelEndpoint", "metadata": {"name": name}, "spec": spec}

    def agent(name: str, model_name: str, **spec: Any) -> dict[str, Any]:
        return {"kind": "Agent", "metadata": {"name": name}, "spec": {"model": model_name, **spec}}

    def ask(count: int, helper: str = "helper") -> dict[str, Any]:
        calls = [_call("agents_exec", agent=helper, input=f"part {n}") for n in range(count)]
        return {"tool_calls": calls}

    path = str(BENCH)
    docs = [
        model("helper-model", {"text": "done"}),
        model("plain-model", {"tool_calls": [_call("add", a=2, b=3)]}, {"text": "5"}),
        model("boss-model", ask(1), {"text": "the helper is done"}),
        model("fan-model", ask(FAN_OUT), {"text": "all helpers are done"}),
        *[
            doc
            for ms in CHILD_MODEL_MS
            for doc in (
                model(f"helper-{ms}ms-model", {"text": "done", "latency_seconds": ms / 1000}),
                model(f"one-{ms}ms-model", ask(1, f"helper-{ms}ms"), {"text": "it is done"}),
                model(f"fan-{ms}ms-model", ask(FAN_OUT, f"helper-{ms}ms"), {"text": "all done"}),
            )
        ],
        {
            "kind": "Tool",
            "metadata": {"name": "add"},
            "spec": {
                "type": "python",
                "python": {"function": "bench_tools:add", "path": path},
                "idempotent": True,
            },
        },
        agent("helper", "helper-model"),
        agent("plain", "plain-model", tools=["add"]),
        agent("boss", "boss-model", links=["helper"]),
        agent("fan-1", "boss-model", links=["helper"]),
        agent("fan-10", "fan-model", links=["helper"]),
        *[
            doc
            for ms in CHILD_MODEL_MS
            for doc in (
                agent(f"helper-{ms}ms", f"helper-{ms}ms-model"),
                agent(f"fan-1-{ms}ms", f"one-{ms}ms-model", links=[f"helper-{ms}ms"]),
                agent(f"fan-10-{ms}ms", f"fan-{ms}ms-model", links=[f"helper-{ms}ms"]),
            )
        ],
    ]
    return "\n---\n".join(json.dumps({"apiVersion": "corral/v1", **doc}) for doc in docs)


async def _one(store: Any, worker: Any, agent: str, number: int) -> float:
    """Submit one run of ``agent``, wait until it ends: from the submit to the commit of its
    outcome as the caller sees it, in ms."""
    from corral.core.runs import RunState
    from corral.runtime.operations import submit

    started = time.perf_counter()
    record, _ = await submit(store, agent, f"task {number}", bus=worker.bus)
    async with worker.bus.watch_events(record.id) as watch:
        while True:
            stored = await store.get_run(record.id)
            if stored is not None and stored.state.finished:
                break
            await watch.wait(0.05)
    took = time.perf_counter() - started
    if stored.state is not RunState.SUCCEEDED:
        raise RuntimeError(f"run of {agent} ended {stored.state}: {stored.error}")
    return 1000 * took


async def _child(runs: int, fan_runs: int, warmup: int) -> dict[str, Any]:
    import anyio

    from corral.core.settings import Settings
    from corral.resources.loader import load_text
    from corral.runtime.worker import Worker
    from corral.store import open_store

    with tempfile.TemporaryDirectory(prefix="corral-bench-multiagent-") as tmp:
        os.environ["CORRAL_HOME"] = tmp
        url = f"sqlite:///{Path(tmp) / 'corral.db'}"
        store = await open_store(url)
        await store.apply(load_text(resources(), "bench.yaml"))
        settings = Settings(home=Path(tmp), db_url=url, secret_key=None)
        worker = Worker(store, settings, concurrency=32, poll_seconds=0.5)
        stop = anyio.Event()
        ms: dict[str, list[float]] = {name: [] for name in LABELS}
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(worker.serve, stop)
                number = 0
                for agent in ms:
                    for _ in range(warmup):
                        number += 1
                        await _one(store, worker, agent, number)
                freeze_heap()
                for _ in range(runs):
                    for agent in ("plain", "boss"):
                        number += 1
                        ms[agent].append(await _one(store, worker, agent, number))
                for _ in range(fan_runs):
                    for agent in [name for pair in FAN_PAIRS for name in pair]:
                        number += 1
                        ms[agent].append(await _one(store, worker, agent, number))
                stop.set()
            children = len(await store.list_runs("default", agent="helper", limit=100_000))
        finally:
            await store.close()
    expected = (warmup + runs) * 1 + (warmup + fan_runs) * (1 + FAN_OUT)
    if children != expected:
        raise RuntimeError(f"{children} child runs of helper, expected {expected}")
    return {
        "rows": {
            agent: {"p50_ms": percentile(got, 50), "p95_ms": percentile(got, 95)}
            for agent, got in ms.items()
        },
        "children": children,
    }


#: what each measured agent is, on the page
LABELS = {
    "plain": "one plain tool call (python add)",
    "boss": "one delegation (agents_exec, one-turn child)",
    "fan-1": "agents_exec x1 in one turn",
    "fan-10": f"agents_exec x{FAN_OUT} in one turn",
    **{
        name: label
        for ms in CHILD_MODEL_MS
        for name, label in (
            (f"fan-1-{ms}ms", f"agents_exec x1, the child's model {ms} ms"),
            (f"fan-10-{ms}ms", f"agents_exec x{FAN_OUT}, each child's model {ms} ms"),
        )
    },
}
#: the fan-out pairs: (one child, FAN_OUT children); the first's children answer at once
FAN_PAIRS = (("fan-1", "fan-10"), *((f"fan-1-{ms}ms", f"fan-10-{ms}ms") for ms in CHILD_MODEL_MS))


def run(config: Config, log: Any = print) -> dict[str, Any]:
    """``rounds`` child processes, each measuring every row."""
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in LABELS}
    errors: list[str] = []
    for index in range(config.rounds):
        child = run_child(
            [
                str(BENCH / "multiagent.py"),
                "--child",
                f"--runs={config.runs}",
                f"--fan-runs={config.fan_runs}",
                f"--warmup={config.warmup}",
            ],
            timeout=config.timeout,
            env={"PYTHONPATH": str(BENCH) + os.pathsep + os.environ.get("PYTHONPATH", "")},
        )
        if not child.ok:
            errors.append(f"round {index + 1}: {child.error}")
            log(f"[multiagent] round {index + 1} failed: {child.error}")
            continue
        for name, got in child.data["rows"].items():
            samples[name].append(got)
    result = {
        "rounds": config.rounds,
        "runs": config.runs,
        "fan_runs": config.fan_runs,
        "fan_out": FAN_OUT,
        "target_delegation_adds_ms": TARGET_DELEGATION_ADDS_MS,
        "target_fan_out_ratio": TARGET_FAN_OUT_RATIO,
        "samples": samples,
        "errors": errors,
    }
    result["systems"] = sysruns.run(config.systems, log)
    adds, ratio = delegation_adds(result), fan_out_ratios(result)
    if adds:
        log(f"[multiagent] a delegation adds {spread(adds, 2)} ms (p50)")
    if ratio:
        log(f"[multiagent] fan-out x{FAN_OUT} / x1: {spread(ratio, 2)}")
    for ms, pair in zip(CHILD_MODEL_MS, FAN_PAIRS[1:], strict=True):
        if slow := fan_out_ratios(result, pair):
            log(
                f"[multiagent] fan-out x{FAN_OUT} / x1, children on a {ms} ms model: {spread(slow, 2)}"
            )
    return result


def p50s(result: dict[str, Any], name: str) -> list[float]:
    """The p50 of each round of row ``name``, in milliseconds."""
    return [s["p50_ms"] for s in result["samples"].get(name, [])]


def delegation_adds(result: dict[str, Any]) -> list[float]:
    """What a delegation added to a parent run's p50 over a plain tool call, per round."""
    plain, boss = p50s(result, "plain"), p50s(result, "boss")
    return [b - p for p, b in zip(plain, boss, strict=False)]


def fan_out_ratios(result: dict[str, Any], pair: tuple[str, str] = FAN_PAIRS[0]) -> list[float]:
    """The p50 of the fan-out parent over the single-child parent's, per round."""
    one, many = p50s(result, pair[0]), p50s(result, pair[1])
    return [m / o for o, m in zip(one, many, strict=False) if o > 0]


def render(result: dict[str, Any]) -> str:
    """p50 and p95 per row (median (min-max) over rounds), with the differences."""
    header = ["parent run (submit to finished)", "p50 ms", "p95 ms", "beside"]
    rows = []
    for name, label in LABELS.items():
        got = result["samples"].get(name, [])
        if not got:
            rows.append([label, "failed", "", ""])
            continue
        beside = ""
        if name == "boss" and (adds := delegation_adds(result)):
            beside = f"+{spread(adds, 2)} ms over the plain tool call (p50)"
        for pair in FAN_PAIRS:
            if name == pair[1] and (ratio := fan_out_ratios(result, pair)):
                beside = f"{spread(ratio, 2, 'x')} the single child (p50)"
        p50 = [s["p50_ms"] for s in got]
        p95 = [s["p95_ms"] for s in got]
        rows.append([label, spread(p50, 2), spread(p95, 2), beside])
    text = table(header, rows)
    if result.get("errors"):
        text += "\n\nFailed rounds: " + "; ".join(result["errors"])
    if "systems" in result:
        text += "\n\n" + sysruns.render(result["systems"])
    return text


def target_rows(result: dict[str, Any], verdict: Any) -> list[list[str]]:
    """The section's rows of the targets table (``verdict(met)`` words the verdict)."""
    adds, ratio = delegation_adds(result), fan_out_ratios(result)
    limit, most = result["target_delegation_adds_ms"], result["target_fan_out_ratio"]
    return [
        [
            f"A delegation (agents_exec child run) adds at most {limit:g} ms (p50) on SQLite "
            "over a plain tool call",
            f"+{spread(adds, 2)} ms" if adds else "failed",
            verdict(median(adds) <= limit if adds else None),
        ],
        [
            f"Fan-out to {result['fan_out']} children: at most {most:g}x the wall time of 1",
            spread(ratio, 2, "x") if ratio else "failed",
            verdict(median(ratio) <= most if ratio else None),
        ],
    ]


#: the commits a delegation adds to the path of a parent run making a plain tool call: the
#: child's submit (claimed in the same transaction) and the child's save; the parent waits
#: in its slot (no park, no second claim), and the plain call's own write (its call and
#: result, written ahead while the model answers) is off the path (counted by tracing the
#: writer's transactions in a run of each)
DELEGATION_COMMITS = 2


def method(result: dict[str, Any]) -> str:
    """The page's paragraph on how this section measures."""
    return (
        f"- **Multi-agent** (`bench/multiagent.py`). Durable runs on a fresh SQLite store, one "
        f"in-process worker (32 slots, every submit and child announced on its bus), the "
        f"`scripted` provider (no model time in any figure). Delegation: a parent whose first "
        f"turn calls `agents_exec` on a linked one-turn agent, then answers, against the same "
        f"parent calling a plain `python` tool; {result['runs']:,} runs of each, one at a time, "
        f"interleaved. Fan-out: one turn calling `agents_exec` {result['fan_out']} times (10 "
        f"child runs at once, slots free) against once; {result['fan_runs']:,} runs of each, "
        f"interleaved. Each parent run is timed from its submit until the driver sees it "
        f"finished (a watch of its events, woken by the commit of its outcome); p50 and p95 "
        f"per round, "
        f"{result['rounds']} rounds, each a child process after an untimed warm-up."
    ) + ("\n" + sysruns.method(result["systems"]) if "systems" in result else "")


def reading(result: dict[str, Any], disk_commits_per_s: list[float]) -> list[str]:
    """What the figures say (``disk_commits_per_s``: the run's probes of the disk)."""
    adds, ratio = delegation_adds(result), fan_out_ratios(result)
    plain = p50s(result, "plain")
    said = []
    if adds and plain:
        line = (
            f"A parent run that delegates to a one-turn agent took {fmt(median(adds), 1)} ms "
            f"(p50) more than one making a plain tool call ({fmt(median(plain), 1)} ms): the "
            f"child's submit (and claim), execution and save while the parent waits in its "
            f"slot, {DELEGATION_COMMITS} more commits on its way"
        )
        if disk_commits_per_s:
            fast, slow = (
                1000 / rate for rate in (max(disk_commits_per_s), min(disk_commits_per_s))
            )
            line += (
                f"; with one commit (an fsync) taking {fmt(fast, 1)}-{fmt(slow, 1)} ms on this "
                f"disk, those alone come to {fmt(DELEGATION_COMMITS * fast, 1)}-"
                f"{fmt(DELEGATION_COMMITS * slow, 1)} ms unless commits share an fsync"
            )
        said.append(line + ".")
    if ratio:
        line = (
            f"Fanning out to {result['fan_out']} children in one turn took "
            f"{fmt(median(ratio), 2)}x the wall time of one child. The children's submits "
            "share one commit and their saves mostly another (the store's group commit): "
            "what the ratio measures is each child run's own CPU in the one worker process, "
            "paid one child after another on one core"
        )
        slower = [
            f"{fmt(median(slow), 2)}x with children whose model takes {ms} ms"
            for ms, pair in zip(CHILD_MODEL_MS, FAN_PAIRS[1:], strict=True)
            if (slow := fan_out_ratios(result, pair))
        ]
        if slower:
            line += "; " + ", ".join(slower) + " (their own cost then hides behind the model's)"
        said.append(line + ".")
    if "systems" in result:
        said += sysruns.reading(result["systems"], disk_commits_per_s)
    return said


def main() -> None:
    import anyio

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", action="store_true", help="measure one round, print it")
    parser.add_argument("--runs", type=int, default=Config.runs)
    parser.add_argument("--fan-runs", type=int, default=Config.fan_runs)
    parser.add_argument("--warmup", type=int, default=Config.warmup)
    parser.add_argument("--rounds", type=int, default=Config.rounds)
    args = parser.parse_args()
    if args.child:
        emit(anyio.run(_child, args.runs, args.fan_runs, args.warmup))
        return
    result = run(
        Config(rounds=args.rounds, runs=args.runs, fan_runs=args.fan_runs, warmup=args.warmup)
    )
    print(render(result))


if __name__ == "__main__":
    sys.path.insert(0, str(BENCH))
    main()
