"""Section 5, the HTTP API: task submit throughput, and SSE fan-out latency to 1-100 followers.

``bench/run.py`` runs it as a section (:func:`run`: each round a child process
``bench/http_api.py --child ...``). Standalone:
``.venv/bin/python bench/http_api.py [--submits N] [--concurrency C] [--followers 1,10,100]``;
figures go to stdout (``--json`` for machine-readable output).

The server is a child process running the app of ``corral serve`` (store on a
fresh SQLite file in WAL mode with ``synchronous=FULL``, rate limiting off); the clients are this process (httpx, keep-alive
connections), so client and server do not share an interpreter lock.

- *Submit throughput*: ``POST /v1/tasks`` by C concurrent clients, each submit a
  durable queued task (committed before the answer), to a server without workers
  (``--workers 0``): the submit path alone, nobody claiming.
- *SSE fan-out*: N followers hold ``GET /v1/runs/{id}/events`` streams open on one
  run (one run per N of ``--followers``, one after another on the same server); the run (20 steps, each a model turn and a 20 ms tool call) is executed by
  the embedded worker. Latency of one event at one follower = the time it was
  received minus the time its batch was committed: the server's bus records the
  moment each ``append_events`` commit was announced (right after the commit), and
  writes those times out when it stops. Clocks are the same machine's wall clock.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from _common import BENCH, RESULT_MARK, freeze_heap, run_child, spread, table

STEPS = 20
ANNOUNCES = "announces.json"


def resources(tools_dir: Path) -> str:
    turns = "\n".join(
        f'    - {{tool_calls: [{{name: echo, arguments: {{text: "{i}", seconds: 0.02}}}}]}}'
        for i in range(STEPS)
    )
    return f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: script}}
spec:
  provider: scripted
  script:
{turns}
    - {{text: done}}
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: echo}}
spec:
  type: python
  python: {{function: "bench_http_tools:echo", path: "{tools_dir}"}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: fanout}}
spec:
  model: script
  tools: [echo]
  limits: {{max_steps: {STEPS + 2}}}
"""


TOOL_SOURCE = '''
import time


def echo(text: str, seconds: float = 0.0) -> str:
    """Answer text after seconds."""
    time.sleep(seconds)
    return text
'''


# --------------------------------------------------------------------------- the server (child)


def serve_child(home: Path, port: int, workers: int) -> None:
    """Run the API with a bus that timestamps every commit announcement."""
    import uvicorn

    from corral.bus.local import LocalBus
    from corral.core.settings import Settings
    from corral.server.app import create_app
    from corral.server.serve import CorralServer, ensure_admin_token
    from corral.store import open_store

    announced: list[tuple[str, int, float]] = []

    class TimingBus(LocalBus):
        async def announce_events(self, run_id: str, last_seq: int) -> None:
            announced.append((run_id, last_seq, time.time()))
            await super().announce_events(run_id, last_seq)

    async def main() -> None:
        settings = Settings(
            home=home,
            db_url=f"sqlite:///{home / 'corral.db'}",
            secret_key=None,
            api_rate_limit=0,
        )
        store = await open_store(settings.db_url)
        try:
            await ensure_admin_token(store, home, out=io.StringIO())
            app = create_app(
                store,
                TimingBus(),
                settings,
                workers=workers,
                worker_options={"poll_seconds": 0.05},
                keepalive_seconds=30,
            )
            config = uvicorn.Config(
                app, host="127.0.0.1", port=port, log_level="warning", access_log=False
            )
            server = CorralServer(config, app.state.corral)
            freeze_heap()  # as `corral serve` does once its app is built
            await server.serve()
        finally:
            await store.close()
            (home / ANNOUNCES).write_text(json.dumps(announced))

    asyncio.run(main())


# --------------------------------------------------------------------------- the clients


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def submit_throughput(
    client: httpx.AsyncClient, total: int, concurrency: int
) -> dict[str, float]:
    latencies: list[float] = []
    remaining = total

    async def submitter() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            response = await client.post("/v1/tasks", json={"agent": "fanout", "input": "x"})
            latencies.append(time.perf_counter() - started)
            assert response.status_code == 201, response.text

    started = time.perf_counter()
    await asyncio.gather(*(submitter() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return {
        "concurrency": concurrency,
        "submits": total,
        "per_second": total / elapsed,
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
    }


async def fan_out(
    client: httpx.AsyncClient, followers: int
) -> tuple[str, list[list[tuple[int, float]]]]:
    """Start a run under ``followers`` open streams; each returns (seq, received at)."""
    run_id = (
        await client.post("/v1/tasks", json={"agent": "fanout", "input": "x", "delay_seconds": 2})
    ).json()["id"]
    connected = 0
    all_connected = asyncio.Event()

    async def follow() -> list[tuple[int, float]]:
        nonlocal connected
        received: list[tuple[int, float]] = []
        headers = {"Accept": "text/event-stream"}
        async with client.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as resp:
            connected += 1
            if connected == followers:
                all_connected.set()
            async for line in resp.aiter_lines():
                if line.startswith("id: "):
                    received.append((int(line[4:]), time.time()))
        return received

    tasks = [asyncio.create_task(follow()) for _ in range(followers)]
    await all_connected.wait()  # the run is due 2 s after its submit: all are listening
    return run_id, list(await asyncio.gather(*tasks))


def fan_out_figures(
    run_id: str, streams: list[list[tuple[int, float]]], announces: list[list[Any]]
) -> dict[str, float]:
    committed: dict[int, float] = {}
    covered = 0
    for announced_run, last_seq, at in announces:
        if announced_run != run_id:
            continue
        for seq in range(covered + 1, last_seq + 1):
            committed[seq] = at
        covered = max(covered, last_seq)
    samples = [at - committed[seq] for stream in streams for seq, at in stream]
    slowest = [
        max(at for stream in streams for s, at in stream if s == seq) - committed[seq]
        for seq in committed
    ]
    events = len(committed)
    assert all([s for s, _ in stream] == list(range(1, events + 1)) for stream in streams)
    return {
        "followers": len(streams),
        "events": events,
        "p50_ms": statistics.median(samples) * 1000,
        "p99_ms": percentile(samples, 0.99) * 1000,
        "max_ms": max(samples) * 1000,
        "last_follower_p50_ms": statistics.median(slowest) * 1000,
        "last_follower_p99_ms": percentile(slowest, 0.99) * 1000,
    }


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_ready(base: str) -> None:
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient() as probe:
        while True:
            try:
                if (await probe.get(f"{base}/readyz", timeout=1)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            await asyncio.sleep(0.1)


async def measure(scenario: str, args: argparse.Namespace, home: Path, port: int) -> Any:
    base = f"http://127.0.0.1:{port}"
    await wait_ready(base)
    token = (home / "admin.token").read_text().strip()
    tools_dir = home / "tools"
    tools_dir.mkdir()
    (tools_dir / "bench_http_tools.py").write_text(TOOL_SOURCE)
    limits = httpx.Limits(max_connections=max(args.followers) + 50, max_keepalive_connections=64)
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {token}"}, limits=limits, timeout=60
    ) as client:
        applied = await client.post(
            "/v1/resources",
            content=resources(tools_dir),
            headers={"Content-Type": "application/yaml"},
        )
        assert applied.status_code == 200, applied.text
        if scenario == "submit":
            await submit_throughput(client, min(50, args.submits), 4)  # warm-up
            return [await submit_throughput(client, args.submits, c) for c in (1, args.concurrency)]
        return [await fan_out(client, followers) for followers in args.followers]


def run_scenario(scenario: str, args: argparse.Namespace, workers: int) -> tuple[Any, Any]:
    """Measure one scenario against a fresh server child; returns it and the commit times."""
    with tempfile.TemporaryDirectory(prefix="corral-bench-http-") as tmp:
        home, port = Path(tmp), free_port()
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(home), str(port), str(workers)],
            env={**os.environ, "CORRAL_HOME": str(home)},
        )
        try:
            measured = asyncio.run(measure(scenario, args, home, port))
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
        return measured, json.loads((home / ANNOUNCES).read_text())


def measure_all(args: argparse.Namespace) -> dict[str, Any]:
    """Both scenarios, each against a server of its own."""
    submits, _ = run_scenario("submit", args, workers=0)
    runs, announces = run_scenario("fan-out", args, workers=8)
    return {
        "submit": submits,
        "sse_fan_out": [fan_out_figures(run_id, streams, announces) for run_id, streams in runs],
    }


# --------------------------------------------------------------------------- the section


@dataclass(frozen=True)
class Config:
    """How much to measure."""

    rounds: int = 3
    submits: int = 1000
    concurrency: int = 16  # submit throughput is measured at c=1 and at c=concurrency
    followers: tuple[int, ...] = (1, 10, 100)
    timeout: float = 600.0


def run(config: Config, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Repeat the measurement ``rounds`` times, each in a child process; the figures of each."""
    samples: list[dict[str, Any]] = []
    errors: list[str] = []
    for round_no in range(config.rounds):
        result = run_child(
            [
                str(BENCH / "http_api.py"),
                "--child",
                f"--submits={config.submits}",
                f"--concurrency={config.concurrency}",
                f"--followers={','.join(map(str, config.followers))}",
            ],
            timeout=config.timeout,
        )
        if result.ok:
            samples.append(result.data)
            shown = ", ".join(
                [
                    f"c={r['concurrency']} {r['per_second']:.0f} submits/s"
                    for r in result.data["submit"]
                ]
                + [
                    f"{f['followers']} followers p50 {f['p50_ms']:.1f} ms"
                    for f in result.data["sse_fan_out"]
                ]
            )
        else:
            errors.append(result.error or "")
            shown = result.error or ""
        log(f"[http] round {round_no + 1}/{config.rounds}: {shown}")
    return {
        "rounds": config.rounds,
        "submits": config.submits,
        "concurrency": [1, config.concurrency],
        "followers": list(config.followers),
        "steps": STEPS,
        "samples": samples,
        "errors": errors,
    }


def submit_samples(result: dict[str, Any], concurrency: int) -> list[dict[str, Any]]:
    """Each round's submit figures at ``concurrency``."""
    return [r for s in result["samples"] for r in s["submit"] if r["concurrency"] == concurrency]


def fan_out_samples(result: dict[str, Any], followers: int) -> list[dict[str, Any]]:
    """Each round's fan-out figures with ``followers`` followers."""
    return [f for s in result["samples"] for f in s["sse_fan_out"] if f["followers"] == followers]


def render(result: dict[str, Any]) -> str:
    """Submit throughput per concurrency, then fan-out latency per number of followers."""
    submit_header = ["POST /v1/tasks", "submits", "submits/s", "p50 ms", "p99 ms"]
    fan_header = [
        "SSE followers of one run",
        "events each",
        "commit -> follower p50 ms",
        "p99 ms",
        "max ms",
        "last follower p50 ms",
        "last follower p99 ms",
    ]
    if not result["samples"]:
        reason = result["errors"][0] if result["errors"] else "no rounds"
        return table(submit_header, [["-", f"failed: {reason}", "", "", ""]])
    failures = f" ({len(result['errors'])} failed)" if result["errors"] else ""

    def col(rows: list[dict[str, Any]], key: str, digits: int = 1) -> str:
        return spread([r[key] for r in rows], digits)

    submit_rows = []
    for c in result["concurrency"]:
        got = submit_samples(result, c)
        submit_rows.append(
            [f"c={c}{failures}", f"{result['submits']:,}", col(got, "per_second", 0)]
            + [col(got, key) for key in ("p50_ms", "p99_ms")]
        )
    fan_rows = []
    for n in result["followers"]:
        got = fan_out_samples(result, n)
        fan_rows.append(
            [f"{n:,}{failures}", ", ".join(sorted({f"{f['events']:,}" for f in got})) or "-"]
            + [
                col(got, key)
                for key in (
                    "p50_ms",
                    "p99_ms",
                    "max_ms",
                    "last_follower_p50_ms",
                    "last_follower_p99_ms",
                )
            ]
        )
    return f"{table(submit_header, submit_rows)}\n\n{table(fan_header, fan_rows)}"


# --------------------------------------------------------------------------- standalone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--submits", type=int, default=1000, help="submits per measurement")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent submitters")
    parser.add_argument(
        "--followers",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 10, 100],
        help="SSE followers of one run, comma-separated: one run per number",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve", nargs=3, metavar="ARG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_child(Path(args.serve[0]), int(args.serve[1]), int(args.serve[2]))
        return

    figures = measure_all(args)
    if args.child:  # for bench/run.py: one result line (see _common.run_child)
        print(RESULT_MARK + json.dumps(figures), flush=True)
        return
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print("Task submit over HTTP (POST /v1/tasks, durable queued task per call)")
    for row in figures["submit"]:
        print(
            f"  c={row['concurrency']:<3} {row['per_second']:8.0f} submits/s   "
            f"p50 {row['p50_ms']:6.2f} ms   p99 {row['p99_ms']:6.2f} ms"
        )
    for fan in figures["sse_fan_out"]:
        print(
            f"SSE fan-out: {fan['followers']} followers x {fan['events']} events, "
            "commit -> received by a follower"
        )
        print(
            f"  each delivery   p50 {fan['p50_ms']:6.2f} ms   p99 {fan['p99_ms']:6.2f} ms   "
            f"max {fan['max_ms']:6.2f} ms"
        )
        print(
            f"  last follower   p50 {fan['last_follower_p50_ms']:6.2f} ms   "
            f"p99 {fan['last_follower_p99_ms']:6.2f} ms"
        )


if __name__ == "__main__":
    main()
