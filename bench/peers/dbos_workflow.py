"""DBOS: the tool loop as a durable workflow, its system database a fresh SQLite file.

Each model call and each tool call is a DBOS step, so its result is recorded in
the system database before the workflow moves on - the same promise as
Corral's journal. SQLite is used as DBOS ships it (its default rollback
journal, ``synchronous=FULL``). The model is called with the bare ``openai``
client: DBOS is a durable-execution layer, not an agent framework, so this row
is "the floor, made durable by DBOS".
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import openai
from bench_tools import add
from dbos import DBOS

from peers._base import API_KEY, INSTRUCTIONS, MODEL, Framework, Setup, prompt
from peers.bare_openai import TOOLS

_client: Any = None  # the AsyncOpenAI client the model step uses (set by start)


@DBOS.step()
async def model_step(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One model call; its message (a plain dict) is what DBOS records."""
    response = await _client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    message: dict[str, Any] = response.choices[0].message.model_dump(exclude_none=True)
    return message


@DBOS.step()
async def tool_step(arguments: str) -> str:
    """One call of the ``add`` tool; its output is recorded."""
    return str(add(**json.loads(arguments)))


@DBOS.workflow()
async def agent_workflow(user_prompt: str) -> str:
    """The same loop as the floor, each call a step."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": user_prompt},
    ]
    while True:
        message = await model_step(messages)
        messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            return str(message.get("content") or "")
        for call in calls:
            output = await tool_step(call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})


class DBOSWorkflow(Framework):
    """``await agent_workflow(prompt)`` per task (each call starts a new durable workflow)."""

    async def start(self, setup: Setup) -> None:
        global _client

        await super().start(setup)
        self._tmp = tempfile.TemporaryDirectory(prefix="dbos-bench-")
        _client = openai.AsyncOpenAI(base_url=setup.base_url, api_key=API_KEY, max_retries=0)
        DBOS(
            config={
                "name": "corral-bench",
                "system_database_url": f"sqlite:///{Path(self._tmp.name) / 'dbos.sqlite'}",
                "log_level": "WARNING",
            }
        )
        DBOS.launch()

    async def run_one(self, index: int) -> str:
        return await agent_workflow(prompt(index))

    async def stop(self) -> None:
        DBOS.destroy()
        await _client.close()
        self._tmp.cleanup()
