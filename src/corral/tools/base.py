"""The one interface every tool kind implements.

A tool kind (python, exec, http, mcp) only knows how to execute a call with
already validated arguments. Everything else - schema validation, permissions,
approval, timeout, retries, circuit breaking, output caps and secret redaction -
is done once, for every kind, by :class:`corral.tools.governance.GovernedTool`.

A kind signals failure by raising :class:`~corral.core.errors.ToolError` with a
stable code; any other exception escaping ``call`` is a bug in the kind and is
reported as ``execution_failed`` by the governance layer.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from corral.core.events import MemorySearchData, MemoryWriteData
from corral.core.messages import ToolSpec


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about the call it serves."""

    run_id: str
    agent: str
    namespace: str
    call_id: str
    #: stable across retries and replays of the same call: (run, step, call)
    idempotency_key: str
    #: a per-agent directory under CORRAL_HOME the tool may write to
    workspace: Path
    #: resolved secret values by secret name, for tools that authenticate
    secrets: Mapping[str, str] = field(default_factory=dict[str, str])
    #: variables Corral plants in a process tool's environment for this call
    #: (``CORRAL_URL``, ``CORRAL_AGENT_TOKEN`` of an agent with links)
    environment: Mapping[str, str] = field(default_factory=dict[str, str])
    #: values of this call only that are redacted like secrets from its outcome, by name
    #: (the agent token: minted per call, so no agent-wide redactor knows it)
    hidden: Mapping[str, str] = field(default_factory=dict[str, str])
    #: events the call asks to be journaled with its result (the engine emits them,
    #: redacted, before the call's ``tool.result``): what a memory tool wrote or searched
    journal: list[MemoryWriteData | MemorySearchData] = field(
        default_factory=list[MemoryWriteData | MemorySearchData]
    )
    #: what this call may spend outside the run (``None``: no limit): the calling run's
    #: ``max_cost_usd`` less its spend so far and less what children still running hold,
    #: split evenly between the calls of the step that can spend it (those starting child
    #: runs and those handed an agent token): a child run the call starts gets it as its cap
    cost_left: float | None = None
    #: the same for tokens (its ``max_tokens`` less the tokens it used so far)
    tokens_left: int | None = None

    def key_with(self, arguments: dict[str, Any]) -> str:
        """The call's idempotency key and a digest of its arguments: what a call that a
        remote dedupes by sends, so that a model asked again after a crash, and answering
        differently, never gets the answer to the question it did not ask this time."""
        digest = hashlib.sha256(
            json.dumps(arguments, sort_keys=True, ensure_ascii=False).encode()
        ).hexdigest()[:16]
        return f"{self.idempotency_key}:{digest}"


@dataclass(frozen=True)
class ChildRun:
    """What a tool returns when its answer is another run's (``agents_exec``): the run
    ``run_id`` of agent ``agent`` was started, and the calling run waits for it, durably
    and without a worker (``waiting_children``); its outcome becomes the call's result."""

    run_id: str
    agent: str


@dataclass(frozen=True)
class Handoff:
    """What a tool returns when the conversation is to go on under another agent
    (``handoff``): the loop switches to agent ``agent`` once the step's other calls are
    done, and journals the switch (a ``handoff`` event)."""

    agent: str
    reason: str = ""


class Tool(ABC):
    """One callable tool."""

    spec: ToolSpec
    #: the name agents and permissions use: ``add``, ``mcp:files/read``
    ref: str
    #: whether repeating a call has no further effect (decides replay after a crash)
    idempotent: bool = False
    #: whether permissions are checked on what a call names (:meth:`targets`, after its
    #: arguments are read) instead of on ``ref`` (the linked-agent tools: ``agent:NAME``)
    by_target: ClassVar[bool] = False
    #: whether a call's planted variables (:attr:`ToolContext.environment`) reach a
    #: process the tool starts: only such calls get an agent token minted
    plants_environment: bool = False
    #: whether a call starts child runs (``agents_exec``): such calls, and those that get an
    #: agent token, share what the calling run has left (see ``ToolContext.cost_left``)
    starts_children: ClassVar[bool] = False

    def targets(self, arguments: dict[str, Any]) -> Sequence[str]:
        """The refs a call with these arguments needs permitted (``by_target`` tools); may
        raise ``ToolError`` when the arguments name something the tool cannot reach."""
        return ()

    @abstractmethod
    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        """Execute one call. Return text or JSON-able data; raise ``ToolError`` on failure."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release processes or connections held for this tool."""
