"""The benchmark suite: ``make bench`` runs this in ``bench/.venv`` (peers installed).

    bench/.venv/bin/python bench/run.py [--quick] [--write-docs [PATH]] [--json PATH]
        [--sections overhead,throughput,scale,startup,http,scaleout,isolation,multiagent,
                    memory]
        [--frameworks ...]
        [--rounds N] [--note TEXT]
    bench/.venv/bin/python bench/run.py --from-json PATH --write-docs   # re-render only

Nine sections (see each module's docstring): agent-loop overhead against the
floor and the peer frameworks (``overhead.py``), durable task throughput
(``throughput.py``), 1,000 runs in flight on one worker (``scale.py``),
start-up of whole ``corral`` processes (``startup.py``), the HTTP API's
submit throughput and SSE fan-out latency (``http_api.py``), and ``corral
worker`` processes on PostgreSQL + NATS JetStream beside SQLite
(``scaleout.py``; rows say "not reachable" without those servers), and what a tool
call costs isolated: exec with and without the sandbox, wasm, python
(``isolation.py``), what a delegation to a linked agent and a fan-out to 10
child runs cost and how many system runs of an AgentSystem complete per second
on SQLite and on PostgreSQL + NATS (``multiagent.py``, ``sysruns.py``), and a Memory's ingest and hybrid search beside
ChromaDB at 10k and 100k entries (``memory.py``). Progress goes to
stderr, the tables to stdout; ``--write-docs`` writes ``docs/benchmarks.md``
from this run's results, ``--json`` keeps the raw figures.

A framework whose packages are not installed (as in Corral's own ``.venv``)
gets rows saying so; that is not a failure. ``--quick`` measures almost
nothing and exists so ``tests/test_bench_smoke.py`` can check, in seconds,
that the harness runs end to end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import http_api
import isolation
import memory
import multiagent
import overhead
import report
import scale
import scaleout
import startup
import sysruns
import throughput
from _common import (
    REPO,
    LoadMonitor,
    git_commit,
    machine,
    sqlite_commits_per_second,
    versions,
)
from peers import FRAMEWORKS

SECTIONS = (
    "overhead",
    "throughput",
    "scale",
    "startup",
    "http",
    "scaleout",
    "isolation",
    "multiagent",
    "memory",
)


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def configs(args: argparse.Namespace) -> dict[str, Any]:
    """Each section's configuration: the full run, or the tiny ``--quick`` one."""
    frameworks = tuple(args.frameworks.split(",")) if args.frameworks else tuple(FRAMEWORKS)
    unknown = [f for f in frameworks if f not in FRAMEWORKS]
    if unknown:
        sys.exit(f"unknown frameworks: {', '.join(unknown)} (known: {', '.join(FRAMEWORKS)})")
    if args.quick:
        found = {
            # one level above 1 exercises the concurrent path; c=1 is the same code
            "overhead": overhead.Config(frameworks, levels=(2,), rounds=1, waves=1, timeout=120),
            "throughput": throughput.Config(
                rounds=1,
                tasks=20,
                slow_tasks=10,
                concurrency=4,
                submitters=2,
                store_only=False,
                timeout=120,
            ),
            "scale": scale.Config(rounds=1, runs=10, delay=0.3, timeout=120),
            "startup": startup.Config(repeats=1, warm=False),
            # two followed runs exercise the per-count loop; 20 submits the submit path
            "http": http_api.Config(
                rounds=1, submits=20, concurrency=4, followers=(1, 5), timeout=120
            ),
            # SQLite and one NATS worker: each configuration starts worker processes
            "scaleout": scaleout.Config(
                rounds=1,
                tasks=20,
                latency_runs=2,
                workers=(1,),
                concurrency=4,
                postgres_alone=False,
                timeout=120,
            ),
            "isolation": isolation.Config(rounds=1, calls=5, warmup=1, timeout=120),
            # system runs: SQLite and one NATS worker, a handful each
            "multiagent": multiagent.Config(
                rounds=1,
                runs=2,
                fan_runs=2,
                warmup=1,
                timeout=120,
                systems=sysruns.Config(rounds=1, systems=4, latency_runs=2, workers=(1,)),
            ),
            # SQLite and ChromaDB (not installed in Corral's own .venv: a row says so)
            "memory": memory.Config(
                sizes=(200,),
                dims=16,
                queries=3,
                batch=100,
                rows=("corral, SQLite", "chromadb"),
                timeout=120,
            ),
        }
    else:
        found = {
            "overhead": overhead.Config(frameworks),
            "throughput": throughput.Config(),
            "scale": scale.Config(),
            "startup": startup.Config(),
            "http": http_api.Config(),
            "scaleout": scaleout.Config(),
            "isolation": isolation.Config(),
            "multiagent": multiagent.Config(),
            "memory": memory.Config(),
        }
    if args.rounds:
        for key in ("overhead", "throughput"):
            found[key] = type(found[key])(**{**found[key].__dict__, "rounds": args.rounds})
    return found


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run the chosen sections; their raw results and what the page says about the run."""
    chosen = args.sections.split(",") if args.sections else list(SECTIONS)
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown:
        sys.exit(f"unknown sections: {', '.join(unknown)} (known: {', '.join(SECTIONS)})")
    config = configs(args)
    results: dict[str, Any] = {}
    # the disk is probed before and after each section: it drifts on a shared machine
    probe_seconds = 0.3 if args.quick else 2.0
    disk = [sqlite_commits_per_second(probe_seconds)]
    with LoadMonitor() as load:
        for name in SECTIONS:
            if name in chosen:
                started = time.monotonic()
                log(f"[{name}] starting")
                results[name] = SECTION_RUNNERS[name](config[name], log)
                log(f"[{name}] done in {time.monotonic() - started:.0f} s")
                disk.append(sqlite_commits_per_second(probe_seconds))
    results["meta"] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "machine": machine(),
        "versions": versions(),
        "quick": args.quick,
        "note": args.note,
        "load": load.summary,
        "disk_commits_per_s": disk,
        "argv": sys.argv[1:],
    }
    return results


SECTION_RUNNERS = {
    "overhead": overhead.run,
    "throughput": throughput.run,
    "scale": scale.run,
    "startup": startup.run,
    "http": http_api.run,
    "scaleout": scaleout.run,
    "isolation": isolation.run,
    "multiagent": multiagent.run,
    "memory": memory.run,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny run: checks the harness")
    parser.add_argument("--sections", help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument("--frameworks", help=f"comma-separated, of {', '.join(FRAMEWORKS)}")
    parser.add_argument("--rounds", type=int, help="rounds of the overhead and throughput sections")
    parser.add_argument(
        "--write-docs",
        nargs="?",
        const=str(REPO / "docs" / "benchmarks.md"),
        metavar="PATH",
        help="write the page (default docs/benchmarks.md)",
    )
    parser.add_argument("--json", metavar="PATH", help="write the raw results as JSON")
    parser.add_argument("--from-json", metavar="PATH", help="render saved results; measure nothing")
    parser.add_argument("--note", default="", help="a line the page shows at its top")
    args = parser.parse_args(argv)
    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())
        if args.note:
            results["meta"]["note"] = args.note
    else:
        results = measure(args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    print(report.stdout_text(results))
    if args.write_docs:
        Path(args.write_docs).write_text(report.docs_page(results))
        log(f"wrote {args.write_docs}")


if __name__ == "__main__":
    main()
