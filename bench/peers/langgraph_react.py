"""LangGraph: the prebuilt ReAct agent (``create_react_agent``) over ``ChatOpenAI``.

In memory, no checkpointer: nothing survives the process, as in LangGraph's
quick start. ``use_responses_api=False`` keeps it on Chat Completions, like
every other row. LangSmith tracing is off (it is unless its variables are set).
"""

from __future__ import annotations

import warnings
from typing import Any

from bench_tools import add
from langchain_openai import ChatOpenAI

from peers._base import API_KEY, INSTRUCTIONS, MODEL, Framework, Setup, prompt

with warnings.catch_warnings():
    # create_react_agent is deprecated in favour of langchain's create_agent; the
    # issue names it, and it is still the agent LangGraph itself ships.
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent


class LangGraphReact(Framework):
    """``create_react_agent(ChatOpenAI(...), [add])``, one ``ainvoke`` per task."""

    async def start(self, setup: Setup) -> None:
        await super().start(setup)
        model = ChatOpenAI(
            model=MODEL,
            base_url=setup.base_url,
            api_key=API_KEY,
            max_retries=0,
            use_responses_api=False,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.agent: Any = create_react_agent(model, [add], prompt=INSTRUCTIONS)
        # each tool call is two graph steps (agent, tools), plus the final answer
        self.config: Any = {"recursion_limit": 2 * setup.calls + 5}

    async def run_one(self, index: int) -> str:
        state = await self.agent.ainvoke(
            {"messages": [{"role": "user", "content": prompt(index)}]}, self.config
        )
        return str(state["messages"][-1].content)
