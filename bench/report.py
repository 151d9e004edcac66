"""Turns one run's results into the tables and ``docs/benchmarks.md``.

Nothing here holds a measured figure: every number in the page comes from the
results of the run being rendered (or from the issue's targets, which are named
as targets). The reading at the end is computed from the same results, so it
cannot drift from the tables above it.
"""

from __future__ import annotations

from typing import Any

import http_api
import isolation
import memory
import multiagent
import overhead
import scale
import scaleout
import startup
import throughput
from _common import fmt, median, spread, table
from peers import TARGETED

#: a ratio to the floor this far under 1 is taken for noise (the floor does the least work)
NOISE_RATIO = 0.9


def plural(count: int, word: str) -> str:
    """``1 round``, ``5 rounds``."""
    return f"{count:,} {word}" + ("" if count == 1 else "s")


SECTIONS = {
    "overhead": ("1. Agent-loop overhead", overhead.render),
    "throughput": ("2. Task throughput", throughput.render),
    "scale": ("3. Scale of concurrency", scale.render),
    "startup": ("4. Start-up", startup.render),
    "http": ("5. HTTP API", http_api.render),
    "scaleout": ("6. Scale-out: worker processes on PostgreSQL + NATS", scaleout.render),
    "isolation": ("7. Isolation: one tool call, sandboxed or not", isolation.render),
    "multiagent": ("8. Multi-agent: delegation and fan-out", multiagent.render),
    "memory": ("9. Memory: ingest and hybrid search, beside ChromaDB", memory.render),
}


def _and(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return " and ".join([", ".join(items[:-1]), items[-1]] if len(items) > 1 else items)


# --------------------------------------------------------------------------- targets


def _verdict(met: bool | None, quick: bool) -> str:
    if quick:
        return "quick run: not a measurement"
    if met is None:
        return "not measured"
    return "met" if met else "**not met**"


#: the floor, and the same loop without the SDK's request transform (see peers/bare_openai.py)
FLOORS = ("floor", "floor-post")


def _post_ratio(section: dict[str, Any], level: int) -> float | None:
    """The least work for the task's HTTP calls at ``level``, as a ratio to the floor: the
    floor's loop posting without the SDK's request transform (``None``: not measured)."""
    for row in section["rows"]:
        if row["name"] == "floor-post" and row["level"] == level and row.get("ratio"):
            return median(row["ratio"])
    return None


def _least_ratio(section: dict[str, Any], level: int) -> float:
    """What a framework cannot go under at ``level`` but by noise, as a ratio to the floor."""
    return _post_ratio(section, level) or 1.0


def target_rows(results: dict[str, Any]) -> list[list[str]]:
    """One row per target of the issue: what it asks, what this run got, met or not."""
    quick = bool(results["meta"].get("quick"))
    rows: list[list[str]] = []
    if (section := results.get("overhead")) is not None:
        limit = section["target_ratio"]
        for level in section["levels"]:
            got, met_by, missed_by = [], [], []
            for row in section["rows"]:
                if row["level"] == level and row["name"] in TARGETED:
                    if row["status"] == "ok" and row["ratio"]:
                        got.append(f"{row['name']}: {spread(row['ratio'], 2, 'x')}")
                        ok = median(row["ratio"]) <= limit
                        (met_by if ok else missed_by).append(row["name"])
                    else:
                        got.append(f"{row['name']}: {row['status']}")
            verdict = _verdict(not missed_by if got else None, quick)
            if met_by and missed_by and not quick:  # the two shapes of a Corral run disagree
                verdict = f"met by {', '.join(met_by)}; **not met** by {', '.join(missed_by)}"
            noisy = any(
                r["level"] == level and min(r["ratio"]) < NOISE_RATIO * _least_ratio(section, level)
                for r in section["rows"]
                if r["status"] == "ok" and r["ratio"] and r["name"] not in FLOORS
            )
            if noisy and not quick:
                verdict += " (a noisy floor in some rounds: see the reading)"
            rows.append(
                [
                    f"Corral durable run at c={level}: at most {limit}x the floor (ms per model call)",
                    "; ".join(got) or "-",
                    verdict,
                ]
            )
    if (section := results.get("throughput")) is not None:
        got = section["samples"].get("corral-sqlite") or []
        totals = [s["total_per_s"] for s in got]
        rows.append(
            [
                f"Durable no-op tasks on SQLite: at least {section['target_per_s']:,}/s",
                f"{spread(totals, 0)}/s" if totals else section["status"]["corral-sqlite"],
                _verdict(median(totals) >= section["target_per_s"] if totals else None, quick),
            ]
        )
    if (section := results.get("scale")) is not None:
        # only a round that really had every run in flight at once speaks to the target
        full = [s for s in section["samples"] if s["max_in_flight"] >= section["runs"]]
        met: bool | None = None
        if full:
            peak = [s["peak_rss_mb"] for s in full]
            met = median(peak) < section["target_rss_mb"]
            shown = f"peak RSS {spread(peak, 0)} MB"
            if len(full) < len(section["samples"]):
                shown += f" ({len(full)} of {len(section['samples'])} rounds had all in flight)"
        elif section["samples"]:
            most = max(s["max_in_flight"] for s in section["samples"])
            shown = f"not shown: at most {most:,} runs were in flight at once"
        else:
            shown = "failed"
        rows.append(
            [
                f"{section['runs']:,} concurrent in-flight runs on one worker: under "
                f"{section['target_rss_mb']} MB RSS",
                shown,
                _verdict(met, quick),
            ]
        )
    if (section := results.get("startup")) is not None:
        got = section.get("samples", {}).get("corral --help", {}).get("ms", [])
        rows.append(
            [
                f"`corral --help` under {section.get('target_help_ms', startup.TARGET_HELP_MS)} ms",
                f"{spread(got, 0)} ms" if got else "failed",
                _verdict(median(got) < section["target_help_ms"] if got else None, quick),
            ]
        )
    if (section := results.get("isolation")) is not None:
        adds = isolation.sandbox_adds(section)
        limit = section["target_sandbox_adds_ms"]
        rows.append(
            [
                f"The sandbox adds at most {limit:g} ms to an exec call (p50)",
                f"+{spread(adds, 2)} ms"
                if adds
                else section["status"].get("exec, isolation sandbox", "failed"),
                _verdict(median(adds) <= limit if adds else None, quick),
            ]
        )
        wasm = isolation.p50s(section, "wasm (cached module)")
        limit = section["target_wasm_ms"]
        rows.append(
            [
                f"A WASM call of a cached module: at most {limit:g} ms (p50)",
                f"{spread(wasm, 2)} ms" if wasm else "failed",
                _verdict(median(wasm) <= limit if wasm else None, quick),
            ]
        )
    if (section := results.get("multiagent")) is not None:
        rows += multiagent.target_rows(section, lambda met: _verdict(met, quick))
    rows += memory_target_rows(results, quick)
    return rows


def memory_target_rows(results: dict[str, Any], quick: bool) -> list[list[str]]:
    """The memory section's targets: hybrid search p50 at 100k on each store, ingest
    against ChromaDB."""
    section = results.get("memory")
    if section is None:
        return []
    size = max(section["sizes"])
    limit = memory.TARGET_P50_MS
    rows = []
    for row in ("corral, SQLite", "corral, PostgreSQL"):
        got = memory.sample(section, row, size)
        rows.append(
            [
                f"Memory hybrid search p50 at {size:,} entries ({row}) under {limit:g} ms",
                f"{fmt(got['p50_ms'], 2)} ms ({got['index']})"
                if got
                else section["status"].get(row, "failed"),
                _verdict(got["p50_ms"] < limit if got else None, quick),
            ]
        )
    for row in ("corral, SQLite", "corral, PostgreSQL"):
        ours, chroma = memory.sample(section, row, size), memory.sample(section, "chromadb", size)
        rows.append(
            [
                f"Memory ingest at {size:,} entries ({row}) at least ChromaDB's",
                f"{fmt(ours['ingest_per_s'], 0)}/s against {fmt(chroma['ingest_per_s'], 0)}/s"
                if ours and chroma
                else section["status"].get(row if not ours else "chromadb", "failed"),
                _verdict(
                    ours["ingest_per_s"] >= chroma["ingest_per_s"] if ours and chroma else None,
                    quick,
                ),
            ]
        )
    return rows


def targets_table(results: dict[str, Any]) -> str:
    return table(["target", "this run: median (min-max)", "verdict"], target_rows(results))


def sections_text(results: dict[str, Any]) -> str:
    """Every measured section's table, under its heading."""
    parts = []
    for key, (title, render) in SECTIONS.items():
        if key in results:
            parts.append(f"### {title}\n\n{render(results[key])}")
    return "\n\n".join(parts)


def stdout_text(results: dict[str, Any]) -> str:
    """What ``bench/run.py`` prints at the end."""
    return f"{sections_text(results)}\n\n### Targets\n\n{targets_table(results)}\n"


# --------------------------------------------------------------------------- the page


def _machine_lines(meta: dict[str, Any]) -> list[str]:
    m = meta["machine"]
    load = meta.get("load", {})
    disk = meta.get("disk_commits_per_s", [])
    lines = [
        f"- Date: {meta['date']}; commit `{meta['commit']}`; the run took "
        f"{fmt(load.get('wall_seconds', 0) / 60, 1)} minutes.",
        f"- CPU: {m['cpu']}, {m['cores']} cores; memory {m['memory']}.",
        f"- OS: {m['os']}; {m['python']}; SQLite {m['sqlite']}.",
    ]
    if disk:
        lines.append(
            "- Disk: a raw `sqlite3` loop of one-row write transactions (WAL, "
            f"`synchronous=FULL`, so one fsync each) did {spread(disk, 0)} commits/s "
            "(probed before and after each section): the floor under every durable figure."
        )
    if load:
        lines.append(
            f"- Load while measuring: 1-minute load average {fmt(load['load_min'], 1)}-"
            f"{fmt(load['load_max'], 1)} (median {fmt(load['load_median'], 1)}) on "
            f"{m['cores']} cores; processes other than the benchmark's own (PostgreSQL's work "
            f"for it included) used "
            f"{fmt(100 * load['others_cpu_share'], 0)} % of the machine's CPU time, the "
            f"benchmark itself {fmt(100 * load['bench_cpu_share'], 0)} %."
        )
    return lines


def _versions_table(meta: dict[str, Any]) -> str:
    rows = [[name, version] for name, version in meta["versions"].items()]
    return table(["package", "version"], rows)


def _method(results: dict[str, Any]) -> str:
    parts = []
    if (o := results.get("overhead")) is not None:
        tasks = " and ".join(
            f"{plural(o['tasks'][str(level)], 'task')} at c={level}" for level in o["levels"]
        )
        parts.append(
            f"- **Agent-loop overhead** (`bench/overhead.py`, adapters in `bench/peers/`). "
            f"Every framework runs the same task: the fake model (Corral's "
            f"`FakeOpenAIServer`, real HTTP, one process of its own shared by every framework, so "
            f"its CPU cost per call is the same for all) answers {o['calls']} tool calls to "
            f"the same Python `add` function, one per turn, then a final answer: "
            f"{o['calls'] + 1} model calls per task, Chat Completions, no streaming. Each "
            f"measurement is a fresh child process, so peak RSS and cold start (import, "
            f"build, first task) are that framework's alone; it runs an untimed warm-up, "
            f"then times {tasks}, "
            f"and checks the work: every answer right, the tool called and the server asked "
            f"exactly as often as the task requires. {plural(o['rounds'], 'round')}, each running "
            f"every framework in turn at each level (A B C ... A B C ...); 'x floor' is "
            f"each round's figure over the floor's in the same round, so a slow moment "
            f"widens the spread instead of reordering the rows. 'ms per model call' is wall "
            f"time over model calls: at c>1, the inverse of the call throughput."
        )
    if (t := results.get("throughput")) is not None:
        parts.append(
            f"- **Task throughput** (`bench/throughput.py`). Corral: durable no-op tasks (a "
            f"`scripted` agent, one text turn; {t['tasks']['corral-sqlite']:,} per measurement "
            f"on SQLite, {t['tasks']['corral-postgres']:,} on PostgreSQL) submitted by "
            f"{t['submitters']} concurrent callers to a fresh store, then drained by one worker "
            f"with concurrency {t['concurrency']}; each is queued, claimed under a lease, "
            f"journaled and saved. DBOS: {t['tasks']['dbos-sqlite']:,} workflows of one step each "
            f"enqueued the same way on a queue with worker concurrency {t['concurrency']} "
            f"(polling every 0.05 s, as Corral's worker here), timed until every result is "
            f"back; DBOS works while the enqueueing goes on, so it has no separate drain "
            f"figure. PostgreSQL runs go to a scratch database created beside "
            f"`{t['postgres_url']}` and dropped after. {plural(t['rounds'], 'round')}, "
            f"interleaved."
        )
    if (s := results.get("scale")) is not None:
        parts.append(
            f"- **Scale** (`bench/scale.py`). {s['runs']:,} runs of the task with "
            f"{plural(s['calls'], 'tool call')} submitted to one worker with {s['runs']:,} "
            f"slots, after one untimed run against an undelayed server (a warm worker, whose "
            f"RSS is the 'warm, idle' column); the fake model answers every call "
            f"{s['delay_s']:g} s late so that all of them wait at once (the server counts the "
            f"most requests it held at the same time). Step latency is `step.finish` - "
            f"`step.start` from each run's journal, shown as the excess over the model's "
            f"{s['delay_s']:g} s: what the worker added under that load. "
            f"{plural(s['rounds'], 'round')}."
        )
    if (u := results.get("startup")) is not None:
        parts.append(
            f"- **Start-up** (`bench/startup.py`). Whole processes, spawn to exit, with each "
            f"process's peak RSS from GNU `time`; {plural(u['repeats'], 'repetition')}, "
            f"interleaved"
            + (", after one untimed run of each (a warm page cache)." if u.get("warm") else ".")
        )
    if (h := results.get("http")) is not None:
        parts.append(
            f"- **HTTP API** (`bench/http_api.py`). `corral serve`'s app in a child process on a "
            f"fresh SQLite store, the clients (httpx, keep-alive) in another. Submit: "
            f"{h['submits']:,} `POST /v1/tasks` (each a durable queued task, committed before "
            f"the answer; no worker claims them) by 1 and by {h['concurrency'][-1]} concurrent "
            f"clients. SSE fan-out: one run of {h['steps']} steps (each a model turn and a "
            f"20 ms tool call, run by the embedded worker) per number of followers "
            f"({_and([f'{n:,}' for n in h['followers']])}) holding "
            f"`GET /v1/runs/{{id}}/events` open; latency is each event's arrival at a follower "
            f"minus its batch's commit (stamped by the server's bus), and 'last follower' "
            f"takes the slowest follower of each event. "
            f"{plural(h['rounds'], 'round')}, each with fresh servers."
        )
    if (x := results.get("scaleout")) is not None:
        servers = x.get("servers", {})
        running = [
            f"{name} {servers[key]}"
            for key, name in (("postgresql", "PostgreSQL"), ("nats", "NATS"))
            if servers.get(key)
        ]
        stores = [c["store"] for c in x["configurations"]]
        counts = [c["workers"] for c in x["configurations"] if c["store"] == "nats"]
        shapes = [
            "SQLite with one worker polling it every 10 ms (no bus reaches another process there)"
        ]
        if "postgres" in stores:
            shapes.append("PostgreSQL with one worker polling it every 10 ms (no NATS)")
        if counts:
            shapes.append(
                f"PostgreSQL + NATS JetStream with {_and([str(n) for n in counts])} worker "
                f"process{'' if counts == [1] else 'es'} (runs dispatched by NATS, the store "
                "swept every 5 s)"
            )
        parts.append(
            f"- **Scale-out** (`bench/scaleout.py`). Real `corral worker` processes "
            f"({x['concurrency']} slots each) on a fresh store per measurement: {_and(shapes)}"
            + (f"; {_and(running)} on this machine" if running else "")
            + f". Throughput: {x['tasks']:,} no-op tasks (an agent on the `scripted` provider: "
            f"one text turn, no tools) submitted by {x['submitters']} concurrent callers of a "
            f"driver process before the workers start, then announced on NATS (or found by the "
            f"polls) once all are up; 'tasks/s' counts the tasks finished from the moment the "
            f"last worker was up (or the first claim, if later) to the last finish, over that "
            f"time, from the store's own timestamps, so neither start-up nor the driver's "
            f"polling is in it. Overhead: {x['latency_runs']} runs of a tool-calling agent (3 "
            f"calls to a Python `add`, then an answer: 4 turns of a `scripted` model, so no "
            f"model time), one at a time after two untimed ones; dispatch is submit to claim, "
            f"execution claim to saved, from the stored record; each round's p50 and p95, and "
            f"the execution p50 over SQLite's in the same round. The database, NATS, the "
            f"workers and the driver share the machine's cores. PostgreSQL runs go to a scratch "
            f"database created beside `{x['postgres_url']}` and dropped after; NATS streams "
            f"(`{x['nats_url']}`) live under a random prefix, deleted after. "
            f"{plural(x['rounds'], 'round')}, each running every configuration in turn."
        )
    if (i := results.get("isolation")) is not None:
        parts.append(
            f"- **Isolation** (`bench/isolation.py`). One tool call timed around the tool "
            f"kind's own `call` (no governance, no engine), so the rows differ only in where "
            f"the tool runs: `cat` as an `exec` program with `isolation: none` and in a "
            f"bubblewrap sandbox, the example word-count WASM module (compiled when the tool "
            f"is built, so every call runs a cached module) and a trivial Python function in "
            f"a worker thread and in a worker subprocess (`isolation: process`, the arguments "
            f"and result over a pipe). {i['calls']:,} timed calls of each, interleaved, after untimed "
            f"ones; p50 and p95 per round, {plural(i['rounds'], 'round')}, each a child process."
        )
    if (a := results.get("multiagent")) is not None:
        parts.append(multiagent.method(a))
    if (m := results.get("memory")) is not None:
        parts.append(
            f"- **Memory** (`bench/memory.py`). The same precomputed texts (40 made-up words "
            f"each) and unit vectors of {m['dims']} floats for every row; no embedding model "
            f"runs. Corral: the store's `write_memories` in batches of {m['batch']:,} (entries, "
            f"full-text index and vectors in one transaction each), then `search_memory` with "
            f"the query's words and vector: full text and an exact cosine over every vector "
            f"of the scope, fused by reciprocal rank fusion, top 10. ChromaDB: an embedded "
            f"`PersistentClient`, `add` in the same batches, `query` by vector (HNSW: "
            f"approximate, vectors only). Each row and size is a child process; search "
            f"latency after a few untimed queries."
        )
    parts.append(
        "- Figures are medians with min-max in brackets. Child processes run one at a "
        "time; the fake server and the measured process each have a core of their own "
        "on a 2-core machine only when nothing else runs."
    )
    return "\n".join(parts)


def reading(results: dict[str, Any]) -> list[str]:
    """Plain statements computed from the results: what the figures say and do not say."""
    said: list[str] = []
    meta = results["meta"]
    if meta.get("quick"):
        said.append(
            "This was a `--quick` run: it shows that the harness works, not how fast anything is."
        )
    load = meta.get("load", {})
    if load.get("others_cpu_share", 0) > 0.1:
        said.append(
            f"Other processes took {fmt(100 * load['others_cpu_share'], 0)} % of the CPU "
            "while this ran, so absolute figures are low and noisy; the ratios, taken "
            "round by round against the floor, are steadier. Where two rows' ranges "
            "overlap, this run does not rank them."
        )
    if (o := results.get("overhead")) is not None:
        for level in o["levels"]:
            ranked = sorted(
                (median(r["ratio"]), r["label"])
                for r in o["rows"]
                if r["level"] == level
                and r["status"] == "ok"
                and r["ratio"]
                and r["name"] != "floor"
            )
            if ranked:
                order = ", ".join(f"{label} {ratio:.2f}x" for ratio, label in ranked)
                said.append(
                    f"At concurrency {level}, cost per model call over the floor, lowest first: {order}."
                )
        for level in o["levels"]:
            least = _post_ratio(o, level)
            if least is None:
                continue
            over = ", ".join(
                f"{r['label']} {median(r['ratio']) / least:.2f}x"
                for r in o["rows"]
                if r["level"] == level and r["name"] in TARGETED and r.get("ratio")
            )
            said.append(
                f"At concurrency {level}, the floor's loop sending its requests with "
                f"`client.post` (as Corral's OpenAI adapter does, skipping the transform "
                f"`chat.completions.create` runs over every message) took {least:.2f}x the "
                f"floor's time per call: that much of the floor is the SDK's request transform, "
                f"which changes nothing in these requests. Over that least work, Corral's "
                f"default rows took: {over}."
            )
        under = [
            (min(r["ratio"]) / _least_ratio(o, r["level"]), r["label"], r["level"])
            for r in o["rows"]
            if r["name"] not in FLOORS and r["status"] == "ok" and r["ratio"]
        ]
        if under and min(under)[0] < NOISE_RATIO:
            low, label, level = min(under)
            said.append(
                f"Some rounds put a framework well under the least work for the same HTTP "
                f"calls (lowest: {label} at c={level}, {low:.2f}x the `client.post` loop). "
                "Only noise does that: the floors of that round were slowed by other "
                "processes. The medians are the figures to read, and only where the ranges "
                "are narrow."
            )
        disk = meta.get("disk_commits_per_s", [])
        floor = [
            r for r in o["rows"] if r["name"] == "floor" and r["status"] == "ok" and r["level"] == 1
        ]
        if disk and floor:
            floor_ms = median(floor[0]["ms_per_call"])
            fast, slow = 1000 / max(disk), 1000 / min(disk)
            waits = 2 / (o["calls"] + 1)  # commits waited for per model call
            low, high = (f"{1 + waits * ms / floor_ms:.2f}" for ms in (fast, slow))
            low_high = f"{low}x" if low == high else f"{low}-{high}x"
            line = (
                f"A durable row also waits for the disk: one commit (an fsync) took "
                f"{fmt(fast, 1)}-{fmt(slow, 1)} ms during this run, against "
                f"{fmt(floor_ms, 1)} ms for a whole model call of the floor at c=1. A Corral "
                f"run here commits at its submit, once per tool step (the step's `tool.call` "
                f"and `tool.result` together) and with its outcome, but waits only for the "
                f"first and the last: the tool is idempotent, so a step's commit runs while "
                f"the next model call is on the wire. Those two waits alone would make it "
                f"{low_high} the floor at c=1"
            )
            corral = [
                r for r in o["rows"] if r["name"] == "corral" and r["level"] == 1 and r.get("ratio")
            ]
            if corral:
                excess = median(corral[0]["ratio"]) - 1
                if excess <= 0:
                    line += f"; Corral's row came in at {1 + excess:.2f}x all the same"
                elif waits * slow / floor_ms < excess / 2:
                    line += f", so most of Corral's excess there (+{excess:.2f}x) is not the disk's"
                else:
                    line += f", so the disk may account for much of Corral's +{excess:.2f}x there"
            said.append(line + ". At higher concurrency the commits of many runs share an fsync.")
    if (t := results.get("throughput")) is not None:
        got = t["samples"].get("corral-sqlite") or []
        if got and "store_only_per_s" in got[0]:
            total = median([s["total_per_s"] for s in got])
            drain = median([s["drain_per_s"] for s in got])
            store = median([s["store_only_per_s"] for s in got])
            if store > 0:
                said.append(
                    f"Corral no-op tasks on SQLite: {fmt(total, 0)}/s from submit to succeeded "
                    f"with the worker running; a worker draining a queue of them does "
                    f"{fmt(drain, 0)}/s, while the same store operations without the engine run "
                    f"at {fmt(store, 0)}/s: about {fmt(100 * (1 - drain / store), 0)} % of a "
                    "drained task's time is spent outside the store (the agent, the engine "
                    "loop, events)."
                )
        dbos = t["samples"].get("dbos-sqlite") or []
        if got and dbos:
            said.append(
                f"The DBOS queue on SQLite did {fmt(median([s['total_per_s'] for s in dbos]), 0)}/s "
                "with its default SQLite settings (rollback journal, `synchronous=FULL`)."
            )
    if (s := results.get("scale")) is not None and s["samples"]:
        got = s["samples"]
        peak = median([x["peak_rss_mb"] for x in got])
        idle = median([x["idle_rss_mb"] for x in got])
        in_flight = min(x["max_in_flight"] for x in got)
        said.append(
            f"With up to {in_flight:,} runs waiting on the model at once (the fewest of any "
            f"round), the worker's RSS grew from {fmt(idle, 0)} MB warm and idle to "
            f"{fmt(peak, 0)} MB, about {fmt(1024 * (peak - idle) / s['runs'], 0)} KB per "
            f"in-flight run. A step took {fmt(median([x['step_excess_p50_ms'] for x in got]), 0)} "
            f"ms (p50) and {fmt(median([x['step_excess_p99_ms'] for x in got]), 0)} ms (p99) "
            f"beyond the model's own wait: the answers of all runs come back within a few "
            f"seconds of each other, and each waits its turn for the worker's one process."
        )
        if in_flight < s["runs"]:
            said.append(
                f"Not all {s['runs']:,} runs were in flight at once in every round: the "
                f"worker took longer than the model's {s['delay_s']:g} s wait to start them "
                "all, so the first answers came back before the last runs had asked."
            )
    if (u := results.get("startup")) is not None and "samples" in u:
        floor = u["samples"].get("python -c pass", {}).get("ms", [])
        helped = u["samples"].get("corral --help", {}).get("ms", [])
        if floor and helped:
            said.append(
                f"`corral --help` takes {fmt(median(helped), 0)} ms, of which the interpreter's "
                f"own start is {fmt(median(floor), 0)} ms; the rest is Corral's CLI (imports, "
                "building and printing the help)."
            )
    if (h := results.get("http")) is not None and h["samples"]:
        rates = [
            f"{fmt(median([r['per_second'] for r in got]), 0)}/s at c={c}"
            for c in h["concurrency"]
            if (got := http_api.submit_samples(h, c))
        ]
        fans = [
            f"{fmt(median([f['p50_ms'] for f in got]), 1)} ms (p50) and "
            f"{fmt(median([f['p99_ms'] for f in got]), 1)} ms (p99) with {plural(n, 'follower')}"
            for n in h["followers"]
            if (got := http_api.fan_out_samples(h, n))
        ]
        if rates and fans:
            said.append(
                f"Over HTTP, durable task submits reached {_and(rates)}. From its commit to a "
                f"follower's SSE stream an event took {'; '.join(fans)}."
            )
    said += scaleout_reading(results)
    if (i := results.get("isolation")) is not None:
        adds = isolation.sandbox_adds(i)
        none = isolation.p50s(i, "exec, isolation none")
        wasm = isolation.p50s(i, "wasm (cached module)")
        if adds and none:
            said.append(
                f"The bubblewrap sandbox adds {fmt(median(adds), 1)} ms (p50) to an exec call "
                f"of {fmt(median(none), 1)} ms: namespaces, mounts and a second process per "
                "call."
            )
        if wasm and none:
            said.append(
                f"A WASM call of a cached module takes {fmt(median(wasm), 2)} ms (p50), a "
                f"fresh store, instance and WASI context per call and no process, against "
                f"{fmt(median(none), 1)} ms for starting a program."
            )
    if (a := results.get("multiagent")) is not None:
        said += multiagent.reading(a, results["meta"].get("disk_commits_per_s", []))
    return said


def scaleout_reading(results: dict[str, Any]) -> list[str]:
    """What the scale-out section's figures say (nothing when it has none)."""
    x = results.get("scaleout")
    if x is None:
        return []
    said: list[str] = []

    def med(key: str, field: str) -> float | None:
        got = [s[field] for s in x["samples"].get(key, []) if s.get(field) is not None]
        return median(got) if got else None

    sqlite_rate = med("sqlite-1", "drain_per_s")
    nats = [
        (c["workers"], rate)
        for c in x["configurations"]
        if c["store"] == "nats" and (rate := med(c["key"], "drain_per_s")) is not None
    ]
    if sqlite_rate is not None and nats:
        rates = _and([f"{fmt(rate, 0)}/s with {plural(n, 'worker')}" for n, rate in nats])
        line = (
            f"Worker processes draining no-op tasks: {fmt(sqlite_rate, 0)}/s on SQLite (one "
            f"worker), {rates} on PostgreSQL + NATS"
        )
        one = dict(nats).get(1)
        most, best = max(nats, key=lambda pair: pair[1])
        if one and len(nats) > 1:
            gain = best / one
            if gain >= 1.2 and most > 1:
                line += f"; {most} workers did {gain:.1f}x one worker's throughput"
            elif min(rate for _, rate in nats) < 0.8 * one:
                line += "; more worker processes lowered the throughput on this machine"
            else:
                line += "; more worker processes did not add throughput on this machine"
            cores = results["meta"]["machine"].get("cores", "?")
            line += (
                f" (PostgreSQL, NATS, the workers and the driver share its {cores} cores, so "
                "this shows what coordination costs, not what more hosts would add)"
            )
        said.append(line + ".")
    base = med("sqlite-1", "execution_p50_ms")
    one = med("nats-1", "execution_p50_ms")
    if base is not None and one is not None:
        line = (
            f"Per run of the tool-calling task, execution (claim to saved: the loop, the "
            f"tools, every journal write) took {fmt(base, 1)} ms (p50) on SQLite and "
            f"{fmt(one, 1)} ms on PostgreSQL + NATS with one worker"
        )
        waits = [
            f"{fmt(value, 1)} ms {how}"
            for key, how in (
                ("nats-1", "by NATS"),
                ("postgres-1", "polling PostgreSQL every 10 ms"),
                ("sqlite-1", "polling SQLite every 10 ms"),
            )
            if (value := med(key, "dispatch_p50_ms")) is not None
        ]
        said.append(
            line + f"; dispatch (submit to claim, p50) took {_and(waits)}." if waits else line + "."
        )
    down = sorted({s for s in x["status"].values() if "not reachable" in s})
    if down:
        said.append(f"Scale-out rows not measured: {'; '.join(down)}.")
    return said


def docs_page(results: dict[str, Any]) -> str:
    """The whole of ``docs/benchmarks.md``."""
    meta = results["meta"]
    note = f"\n> **{meta['note']}**\n" if meta.get("note") else ""
    reading_text = "\n".join(f"- {line}" for line in reading(results))
    return f"""# Benchmarks

Generated by `make bench` (`bench/run.py --write-docs`) from one run; do not edit the
figures by hand, run it again. How to run it and what each part measures:
`bench/README.md`. Every figure is the median over repeated, interleaved runs, with
min-max in brackets.
{note}
## Targets

{targets_table(results)}

## Where and when

{chr(10).join(_machine_lines(meta))}

{_versions_table(meta)}

## Method

{_method(results)}

## Results

{sections_text(results)}

## Reading

{reading_text}
"""
