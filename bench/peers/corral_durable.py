"""Corral in embedded durable mode: a fresh SQLite store in a temporary directory, no services.

Two shapes of the same durable run (the ``openai`` provider pointed at the fake
server, ``add`` as a ``python`` Tool resource, every model response and tool
result journaled with ``synchronous=FULL`` before the run moves on):

- :class:`CorralEmbedded`: each task is ``LocalRunner.run`` (submit, claim that
  run, execute it here) on one :class:`~corral.runtime.local.LocalRunner` opened
  at the start - what ``corral run`` does for one run, and the same shape as the
  peers' ``await agent.run(...)`` on an agent built once.
- :class:`CorralWorker`: one in-process :class:`~corral.runtime.worker.Worker` with
  ``concurrency`` slots runs from the start, as ``corral worker`` or ``corral serve``
  would; every task is submitted (and announced on the worker's bus), and the worker
  executes them as they come; timed from the first submit to the last success.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import anyio
from _common import BENCH

from corral.core.runs import RunRecord, RunState
from corral.core.settings import Settings
from corral.resources.loader import load_text
from corral.runtime.local import LocalRunner
from corral.runtime.operations import submit
from corral.runtime.worker import Worker
from corral.store import open_store
from peers._base import INSTRUCTIONS, MODEL, Framework, Setup, prompt


def resources(setup: Setup, *, inline: bool = False) -> str:
    """The ModelEndpoint, Tool and Agent of the task, as a user would write them
    (``inline``: the ``add`` Tool runs on the event loop, not in a worker thread)."""
    return f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: fake}}
spec:
  provider: openai
  model: {MODEL}
  base_url: {setup.base_url}
  retry: {{max_attempts: 1}}
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: add}}
spec:
  type: python
  python: {{function: "bench_tools:add", path: "{BENCH}", inline: {str(inline).lower()}}}
  idempotent: true
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: calculator}}
spec:
  model: fake
  instructions: {INSTRUCTIONS}
  tools: [add]
  stream: false
  limits: {{max_steps: {setup.calls + 2}}}
"""


class CorralEmbedded(Framework):
    """One ``LocalRunner.run`` call per task, ``concurrency`` at a time."""

    inline_tool = False  # the default: a synchronous Python tool runs in a worker thread

    async def start(self, setup: Setup) -> None:
        await super().start(setup)
        self._tmp = tempfile.TemporaryDirectory(prefix="corral-bench-")
        home = Path(self._tmp.name)
        os.environ["CORRAL_HOME"] = str(home)  # the secret key file, workspaces: all in here
        url = f"sqlite:///{home / 'corral.db'}"
        self.settings = Settings(home=home, db_url=url, secret_key=None)
        self.store = await open_store(url)
        text = resources(setup, inline=self.inline_tool)
        await self.store.apply(load_text(text, "bench.yaml"))
        self.runner = await LocalRunner(self.store, self.settings).__aenter__()

    async def run_one(self, index: int) -> str:
        record = await self.runner.run("calculator", prompt(index))
        return answer_of(record)

    async def stop(self) -> None:
        await self.runner.__aexit__(None, None, None)
        await self.store.close()
        self._tmp.cleanup()


class CorralInline(CorralEmbedded):
    """:class:`CorralEmbedded` with the ``add`` Tool declared ``inline: true``: no thread
    hop per call. The peers' rows run the same synchronous function in a thread (LangGraph,
    Pydantic AI, the Agents SDK), the floor calls it directly: this row shows what the
    option buys, and is not one of the rows the issue's target is judged on."""

    inline_tool = True


class CorralWorker(CorralEmbedded):
    """Submit every task to one in-process ``Worker`` serving since ``start``."""

    async def start(self, setup: Setup) -> None:
        await super().start(setup)
        self.worker = Worker(
            self.store, self.settings, concurrency=setup.concurrency, poll_seconds=0.05
        )
        self._stop = anyio.Event()
        self._serving = asyncio.get_running_loop().create_task(self.worker.serve(self._stop))

    async def run_one(self, index: int) -> str:
        raise NotImplementedError("the worker shape runs tasks in batches (see run)")

    async def run(self, tasks: int, first_index: int) -> list[str]:
        done = self.worker.executed + tasks
        ids = []
        for n in range(tasks):
            record, _ = await submit(
                self.store, "calculator", prompt(first_index + n), bus=self.worker.bus
            )
            ids.append(record.id)
        # A 1 ms tick (well under 1 % of a measurement) costs the worker less than an
        # observer called for every event of every run would.
        while self.worker.executed < done:
            if self._serving.done():  # the worker failed: say why
                await self._serving
            await anyio.sleep(0.001)
        return [answer_of(await self.store.get_run(run_id)) for run_id in ids]

    async def stop(self) -> None:
        self._stop.set()
        await self._serving
        await super().stop()


def answer_of(record: RunRecord | None) -> str:
    """The final text of a finished run; a run that did not succeed is an error."""
    if record is None or record.state is not RunState.SUCCEEDED:
        detail = "missing" if record is None else f"{record.state}: {record.error}"
        raise RuntimeError(f"the run did not succeed ({detail})")
    return str(record.output)
