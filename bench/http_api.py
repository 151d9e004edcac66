"""The HTTP API: task submit throughput, and SSE fan-out latency to 100 followers.

Standalone: ``.venv/bin/python bench/http_api.py [--submits N] [--followers N]``.
Figures go to stdout (``--json`` for machine-readable output).

The server is a child process running the app of ``corral serve`` (store on a
fresh SQLite file in WAL mode with ``synchronous=FULL``, rate limiting off); the clients are this process (httpx, keep-alive
connections), so client and server do not share an interpreter lock.

- *Submit throughput*: ``POST /v1/tasks`` by C concurrent clients, each submit a
  durable queued task (committed before the answer), to a server without workers
  (``--workers 0``): the submit path alone, nobody claiming.
- *SSE fan-out*: N followers hold ``GET /v1/runs/{id}/events`` streams open on one
  run; the run (20 steps, each a model turn and a 20 ms tool call) is executed by
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

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
            await CorralServer(config, app.state.corral).serve()
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
    limits = httpx.Limits(max_connections=args.followers + 50, max_keepalive_connections=64)
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
            await submit_throughput(client, 50, 4)  # warm-up
            return [await submit_throughput(client, args.submits, c) for c in (1, args.concurrency)]
        return await fan_out(client, args.followers)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--submits", type=int, default=1000, help="submits per measurement")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent submitters")
    parser.add_argument("--followers", type=int, default=100, help="SSE followers of one run")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--serve", nargs=3, metavar="ARG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_child(Path(args.serve[0]), int(args.serve[1]), int(args.serve[2]))
        return

    submits, _ = run_scenario("submit", args, workers=0)
    (run_id, streams), announces = run_scenario("fan-out", args, workers=8)
    figures = {
        "submit": submits,
        "sse_fan_out": fan_out_figures(run_id, streams, announces),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print("Task submit over HTTP (POST /v1/tasks, durable queued task per call)")
    for row in figures["submit"]:
        print(
            f"  c={row['concurrency']:<3} {row['per_second']:8.0f} submits/s   "
            f"p50 {row['p50_ms']:6.2f} ms   p99 {row['p99_ms']:6.2f} ms"
        )
    fan = figures["sse_fan_out"]
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
