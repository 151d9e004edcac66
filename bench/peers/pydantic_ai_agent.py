"""Pydantic AI: an ``Agent`` on ``OpenAIChatModel`` (Chat Completions), run by ``agent.run``.

Instrumentation (Logfire / OpenTelemetry) is off, as it is by default.
"""

from __future__ import annotations

from typing import Any

from bench_tools import add
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import UsageLimits

from peers._base import API_KEY, INSTRUCTIONS, MODEL, Framework, Setup, prompt


class PydanticAI(Framework):
    """``await agent.run(prompt)`` per task, with ``add`` as a plain tool."""

    async def start(self, setup: Setup) -> None:
        await super().start(setup)
        provider = OpenAIProvider(base_url=setup.base_url, api_key=API_KEY)
        model = OpenAIChatModel(MODEL, provider=provider)
        self.agent: Any = Agent(model, instructions=INSTRUCTIONS, tools=[add])

    async def run_one(self, index: int) -> str:
        limits = UsageLimits(request_limit=self.setup.calls + 2)
        result = await self.agent.run(prompt(index), usage_limits=limits)
        return str(result.output)
