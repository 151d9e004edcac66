"""What durability costs per model call: a journaled Corral run vs a bare ``openai`` loop.

Both sides run the same task against the same local fake OpenAI-compatible
server (a child process): a conversation of ``--calls`` tool calls, one per
turn, with a trivial local tool, then a final answer - ``calls + 1`` model calls.

- bare: ``openai.AsyncOpenAI`` (one shared client) in a plain loop, ``C``
  conversations at a time.
- corral: the same task as durable runs - an agent with a python tool and the
  ``openai`` provider pointed at the fake server, submitted to a fresh SQLite
  store and executed by one in-process :class:`~corral.runtime.worker.Worker`
  with concurrency ``C``. Timed from the first submit until every run succeeded.

The figure is wall time per model call; the ratio is corral / bare. Runs are
interleaved (bare, corral, bare, corral, ...) and repeated ``--runs`` times.

    .venv/bin/python bench/durable_overhead.py [--runs 5] [--concurrency 1,50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BENCH, FakeServerProcess, machine, median, spread, table
from bench_tools import lookup

from corral.core.runs import RunState
from corral.core.settings import Settings
from corral.resources.loader import load_text
from corral.runtime.local import submit
from corral.runtime.worker import Worker
from corral.store import open_store

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Return a canned answer for query.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]


def resources(base_url: str) -> str:
    return f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: fake}}
spec:
  provider: openai
  model: test-model
  base_url: {base_url}
  retry: {{max_attempts: 1}}
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: lookup}}
spec:
  type: python
  python: {{function: "bench_tools:lookup", path: "{BENCH}"}}
  idempotent: true
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: looper}}
spec:
  model: fake
  tools: [lookup]
  stream: false
"""


async def bare(base_url: str, conversations: int, concurrency: int) -> float:
    """Seconds for ``conversations`` tool loops over the bare SDK, ``concurrency`` at a time."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
    limiter = anyio.Semaphore(concurrency)

    async def conversation(i: int) -> None:
        async with limiter:
            messages: list[Any] = [{"role": "user", "content": f"task {i}"}]
            while True:
                response = await client.chat.completions.create(
                    model="test-model", messages=messages, tools=TOOLS
                )
                message = response.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    return
                for call in message.tool_calls:
                    assert call.type == "function"
                    output = lookup(**json.loads(call.function.arguments))
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": output})

    try:
        start = time.perf_counter()
        async with anyio.create_task_group() as group:
            for i in range(conversations):
                group.start_soon(conversation, i)
        return time.perf_counter() - start
    finally:
        await client.close()


async def corral(base_url: str, conversations: int, concurrency: int) -> float:
    """Seconds from the first submit until ``conversations`` durable runs succeeded."""
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        home = Path(tmp)
        url = f"sqlite:///{home / 'corral.db'}"
        settings = Settings(home=home, db_url=url, secret_key=None)
        store = await open_store(url)
        try:
            await store.apply(load_text(resources(base_url), "bench.yaml"))
            worker = Worker(store, settings, concurrency=concurrency, poll_seconds=0.05)
            start = time.perf_counter()
            ids = [(await submit(store, "looper", f"task {i}"))[0].id for i in range(conversations)]
            await worker.serve(anyio.Event(), until_idle=True)
            elapsed = time.perf_counter() - start
            for run_id in ids:
                stored = await store.get_run(run_id)
                if stored is None or stored.state is not RunState.SUCCEEDED:
                    raise RuntimeError(f"run {run_id} did not succeed: {stored}")
            return elapsed
        finally:
            await store.close()


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="repetitions of each measurement")
    parser.add_argument("--concurrency", default="1,50", help="comma-separated levels")
    parser.add_argument("--calls", type=int, default=3, help="tool calls per conversation")
    parser.add_argument(
        "--conversations",
        type=int,
        default=0,
        help="conversations per measurement (default: 20 at concurrency 1, 4x the level above)",
    )
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    model_calls = args.calls + 1
    results: dict[tuple[str, int], list[float]] = {}
    with FakeServerProcess(args.calls) as server:
        for level in levels:
            count = args.conversations or (20 if level == 1 else 4 * level)
            # one untimed round of each warms imports, connections and the page cache
            await bare(server.base_url, min(count, 4), level)
            await corral(server.base_url, min(count, 4), level)
            for _ in range(args.runs):
                for name, fn in (("bare", bare), ("corral", corral)):
                    seconds = await fn(server.base_url, count, level)
                    ms = 1000 * seconds / (count * model_calls)
                    results.setdefault((name, level), []).append(ms)
    rows = []
    for level in levels:
        bare_ms, corral_ms = results[("bare", level)], results[("corral", level)]
        ratios = [c / b for b, c in zip(bare_ms, corral_ms, strict=True)]
        rows.append(
            [
                str(level),
                spread(bare_ms),
                spread(corral_ms),
                spread(ratios),
                f"{median(corral_ms) / median(bare_ms):.2f}",
            ]
        )
    print(f"durable overhead: {args.calls} tool calls + 1 answer per conversation, {machine()}")
    print(f"{args.runs} interleaved runs per figure: median (min-max)\n")
    print(
        table(
            [
                "concurrency",
                "bare ms/call",
                "corral ms/call",
                "ratio (per run)",
                "ratio of medians",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
