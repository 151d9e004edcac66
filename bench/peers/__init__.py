"""The frameworks of the agent-loop section, one adapter module each (see :mod:`peers._base`).

The registry names each adapter by ``module:Class`` so that listing them imports
nothing: a framework whose packages are missing is reported as "not installed"
without its import ever being tried (Corral's own ``.venv`` has no peers).
"""

from __future__ import annotations

import importlib
from importlib import metadata

from peers._base import Framework

#: name -> "module:Class", in the order a round runs them (the floor first)
FRAMEWORKS: dict[str, str] = {
    "floor": "peers.bare_openai:BareOpenAI",
    "floor-post": "peers.bare_openai:BarePost",
    "corral": "peers.corral_durable:CorralEmbedded",
    "corral-worker": "peers.corral_durable:CorralWorker",
    "corral-inline": "peers.corral_durable:CorralInline",
    "langgraph": "peers.langgraph_react:LangGraphReact",
    "openai-agents": "peers.openai_agents_sdk:OpenAIAgentsSDK",
    "pydantic-ai": "peers.pydantic_ai_agent:PydanticAI",
    "dbos": "peers.dbos_workflow:DBOSWorkflow",
}

#: the distributions each framework needs; when one is missing its rows say "not installed"
REQUIRES: dict[str, tuple[str, ...]] = {
    "floor": ("openai",),
    "floor-post": ("openai",),
    "corral": ("corral",),
    "corral-worker": ("corral",),
    "corral-inline": ("corral",),
    "langgraph": ("langgraph", "langchain-openai"),
    "openai-agents": ("openai-agents",),
    "pydantic-ai": ("pydantic-ai-slim",),
    "dbos": ("dbos", "openai"),
}

LABELS: dict[str, str] = {
    "floor": "openai SDK, bare loop (floor)",
    "floor-post": "openai SDK, bare loop, `client.post` (no request transform)",
    "corral": "Corral, durable: LocalRunner.run per task",
    "corral-worker": "Corral, durable: submit + 1 worker",
    "corral-inline": "Corral, durable: LocalRunner.run, tool `inline: true`",
    "langgraph": "LangGraph create_react_agent",
    "openai-agents": "OpenAI Agents SDK (Chat Completions)",
    "pydantic-ai": "Pydantic AI (OpenAIChatModel)",
    "dbos": "DBOS durable workflow (SQLite)",
}

#: the rows that persist every model response and tool result before moving on
DURABLE = {"corral", "corral-worker", "corral-inline", "dbos"}

#: the rows the issue's target (at most 1.5x the floor) is judged on: Corral as configured by
#: default (corral-inline declares its tool inline, which the peers' rows do not)
TARGETED = ("corral", "corral-worker")


def missing(name: str) -> list[str]:
    """The distributions ``name`` needs that are not installed here."""
    absent = []
    for dist in REQUIRES[name]:
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            absent.append(dist)
    return absent


def load(name: str) -> type[Framework]:
    """The adapter class of ``name`` (this imports the framework)."""
    module, _, cls = FRAMEWORKS[name].partition(":")
    found: type[Framework] = getattr(importlib.import_module(module), cls)
    return found


__all__ = [
    "DURABLE",
    "FRAMEWORKS",
    "LABELS",
    "REQUIRES",
    "TARGETED",
    "Framework",
    "load",
    "missing",
]
