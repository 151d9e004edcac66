"""OpenAI Agents SDK: an ``Agent`` on ``OpenAIChatCompletionsModel``, run by ``Runner.run``.

Tracing is turned off: by default the SDK exports traces to OpenAI's servers,
which this machine cannot reach, and a background exporter retrying would be
measured as the SDK's cost.
"""

from __future__ import annotations

from typing import Any

import openai
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from bench_tools import add

from peers._base import API_KEY, INSTRUCTIONS, MODEL, Framework, Setup, prompt


class OpenAIAgentsSDK(Framework):
    """``Runner.run(agent, prompt)`` per task, one shared ``AsyncOpenAI`` client."""

    async def start(self, setup: Setup) -> None:
        await super().start(setup)
        set_tracing_disabled(True)
        self.client = openai.AsyncOpenAI(base_url=setup.base_url, api_key=API_KEY, max_retries=0)
        self.agent: Any = Agent(
            name="calculator",
            instructions=INSTRUCTIONS,
            model=OpenAIChatCompletionsModel(model=MODEL, openai_client=self.client),
            tools=[function_tool(add)],
        )

    async def run_one(self, index: int) -> str:
        result = await Runner.run(self.agent, prompt(index), max_turns=self.setup.calls + 2)
        return str(result.final_output)

    async def stop(self) -> None:
        await self.client.close()
