"""The one interface every framework adapter implements, and the task they all run.

The task: the user asks for a sum; the fake model (``bench/fake_server.py``)
answers with ``calls`` tool calls to ``add``, one per turn, then with the final
text :func:`expected_answer`. Every adapter sends the same instructions and
prompt, declares the same tool from :mod:`bench_tools`, talks Chat Completions
without streaming, and returns the final text so the child can check it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import anyio

MODEL = "bench-model"
API_KEY = "bench"  # the fake server takes any key; the SDKs insist on one
INSTRUCTIONS = "You are a calculator. Use the add tool for every sum."


def prompt(index: int) -> str:
    """The user message of task ``index`` (distinct, so no framework can cache answers)."""
    return f"Task {index}: what is 17 plus 25? Use the add tool."


def expected_answer(calls: int) -> str:
    """The fake model's final answer after ``calls`` tool results (see ``ToolLoop``)."""
    return f"done after {calls} tool results"


@dataclass(frozen=True)
class Setup:
    """What a framework is given before it runs tasks."""

    base_url: str  # the fake server's OpenAI base URL, ending in /v1
    calls: int  # tool calls per task before the final answer
    concurrency: int  # tasks in flight at once


class Framework(ABC):
    """An agent framework (or the bare SDK) running the benchmark task.

    ``start`` builds what a program would build once (clients, agents, stores);
    ``run_one`` runs one task to its final answer; ``stop`` releases it all.
    ``run`` runs many tasks ``concurrency`` at a time; a framework whose natural
    shape is a queue (submit everything, let a worker drain it) overrides it.

    Its name, label and required packages live in :mod:`peers` (the registry), so
    that listing frameworks imports none of them.
    """

    async def start(self, setup: Setup) -> None:
        """Build the clients, agents and stores the tasks share."""
        self.setup = setup

    @abstractmethod
    async def run_one(self, index: int) -> str:
        """Run task ``index`` to its end and return the final answer text."""

    async def run(self, tasks: int, first_index: int) -> list[str]:
        """Run ``tasks`` tasks, ``setup.concurrency`` at a time; their answers in order."""
        answers = [""] * tasks
        limiter = anyio.Semaphore(self.setup.concurrency)

        async def one(n: int) -> None:
            async with limiter:
                answers[n] = await self.run_one(first_index + n)

        async with anyio.create_task_group() as group:
            for n in range(tasks):
                group.start_soon(one, n)
        return answers

    async def stop(self) -> None:  # noqa: B027 - nothing to release unless an adapter says so
        """Release what ``start`` built."""
