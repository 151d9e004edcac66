"""The linked-agent tools: ``agents_list``, ``agents_info``, ``agents_exec`` and ``handoff``.

An Agent with ``links`` gets these four built-in tools, governed like every
other tool (:mod:`corral.tools.governance`: schema, approval, timeout, output
cap, redaction). Their permissions are checked on the agent a call names, as
``agent:NAME`` (``by_target``): a ToolPermission's glob such as ``agent:*``
allows or denies them for an agent with roles. An agent that is not linked is
refused before anything else (``permission_denied``), whatever the roles say.

``agents_exec`` starts a child run through :class:`Delegation`, the narrow
interface the runtime implements (tools never import the runtime), and returns
a :class:`~corral.tools.base.ChildRun`: the calling run then waits for it
without holding a worker, and the child's answer becomes the call's result.
The child's idempotency key is derived from the call's (run, step, call index)
and its arguments, so a replay of the call after a crash finds the child it
started instead of starting another.

``handoff`` checks that its target still exists and returns a
:class:`~corral.tools.base.Handoff`: the loop (:mod:`corral.engine.loop`) goes on
under the target agent once the step's other calls are done, with the whole
conversation so far, and journals the switch as a ``handoff`` event.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

from corral.core.errors import ToolError, ToolErrorCode
from corral.core.messages import ToolSpec
from corral.resources.kinds import DEFAULT_MAX_DEPTH, AgentLink
from corral.tools.base import ChildRun, Handoff, Tool, ToolContext

#: the prefix of the permission ref of a linked agent: ``agent:NAME``
AGENT_PREFIX = "agent:"
#: the longest input an ``agents_exec`` call may hand a child run
MAX_CHILD_INPUT_CHARS = 32_000
#: the longest reason a ``handoff`` call may give
MAX_HANDOFF_REASON_CHARS = 2_000


class Delegation(Protocol):
    """What the linked-agent tools need from the runtime."""

    async def start_child(
        self,
        ctx: ToolContext,
        agent: str,
        user_input: str,
        session: str | None,
        *,
        key: str,
        max_depth: int,
    ) -> ChildRun:
        """Start (or find, by ``key``) the child run of agent ``agent`` for the call of ``ctx``,
        at most ``max_depth`` below the top run, capped at ``ctx.cost_left``; ``ToolError``
        when it cannot be started (``budget_exceeded`` past the depth, a missing agent, a
        bad session)."""
        ...

    async def describe(self, namespace: str, agent: str) -> dict[str, Any]:
        """What a caller may know of a linked agent (``ToolError`` when it is gone)."""
        ...


class _LinkedAgentTool(Tool):
    """What the four tools share: the links, and the check of the agent a call names."""

    by_target: ClassVar[bool] = True
    idempotent = True

    def __init__(
        self,
        links: Sequence[AgentLink],
        delegation: Delegation,
        permitted: Callable[[str], bool],
    ) -> None:
        self.links = {link.agent: link for link in links}
        self.delegation = delegation
        self.permitted = permitted

    def targets(self, arguments: dict[str, Any]) -> Sequence[str]:
        name = arguments.get("agent")
        if name is None:
            return ()
        if name not in self.links:
            linked = ", ".join(sorted(self.links)) or "none"
            raise ToolError(
                ToolErrorCode.PERMISSION_DENIED,
                f"agent {name!r} is not linked to this agent (its links: {linked})",
            )
        return (f"{AGENT_PREFIX}{name}",)

    def _catalogue(self) -> str:
        lines = [
            f"- {name}: {link.description}" if link.description else f"- {name}"
            for name, link in sorted(self.links.items())
        ]
        return "\n".join(lines)

    def _agent_spec(
        self, intro: str, more: dict[str, Any] | None = None, required: Sequence[str] = ()
    ) -> ToolSpec:
        """The spec of a tool that names one linked agent (``agent``, required) and takes
        ``more`` properties (of them ``required``); its description: ``intro``, then the
        catalogue of the links."""
        return ToolSpec(
            name=self.ref,
            description=f"{intro} Linked agents:\n{self._catalogue()}",
            parameters={
                "type": "object",
                "properties": {"agent": _AGENT_ARGUMENT, **(more or {})},
                "required": ["agent", *required],
                "additionalProperties": False,
            },
        )


_AGENT_ARGUMENT = {"type": "string", "minLength": 1, "maxLength": 63}


class AgentsList(_LinkedAgentTool):
    """``agents_list``: the linked agents this agent may call, with their descriptions."""

    ref = "agents_list"

    def __init__(
        self, links: Sequence[AgentLink], delegation: Delegation, permitted: Callable[[str], bool]
    ) -> None:
        super().__init__(links, delegation, permitted)
        self.spec = ToolSpec(
            name=self.ref,
            description="List the agents you may call with agents_exec, with what each is for.",
            parameters={"type": "object", "properties": {}, "additionalProperties": False},
        )

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        return [
            {"agent": name, "description": link.description}
            for name, link in sorted(self.links.items())
            if self.permitted(f"{AGENT_PREFIX}{name}")
        ]


class AgentsInfo(_LinkedAgentTool):
    """``agents_info(agent)``: what a linked agent is (its description, tools, output)."""

    ref = "agents_info"

    def __init__(
        self, links: Sequence[AgentLink], delegation: Delegation, permitted: Callable[[str], bool]
    ) -> None:
        super().__init__(links, delegation, permitted)
        self.spec = self._agent_spec("Describe one agent you may call with agents_exec.")

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        name = str(arguments["agent"])
        info = await self.delegation.describe(ctx.namespace, name)
        return {"agent": name, "description": self.links[name].description, **info}


class AgentsExec(_LinkedAgentTool):
    """``agents_exec(agent, input, session?)``: run a linked agent on ``input``; its
    answer is the result (the calling run waits for the child run, durably)."""

    ref = "agents_exec"
    starts_children = True

    def __init__(
        self,
        links: Sequence[AgentLink],
        delegation: Delegation,
        permitted: Callable[[str], bool],
        max_depth: int = DEFAULT_MAX_DEPTH,
    ) -> None:
        super().__init__(links, delegation, permitted)
        self.max_depth = max_depth
        self.spec = self._agent_spec(
            "Give a task to another agent and get its answer. The input is all it sees "
            "(unless you name a session of its own to continue).",
            {
                "input": {"type": "string", "minLength": 1, "maxLength": MAX_CHILD_INPUT_CHARS},
                "session": {"type": "string", "minLength": 1, "maxLength": 64},
            },
            required=["input"],
        )

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        name = str(arguments["agent"])
        session = arguments.get("session")
        return await self.delegation.start_child(
            ctx,
            name,
            str(arguments["input"]),
            None if session is None else str(session),
            key=child_key(ctx, arguments),
            max_depth=self.max_depth,
        )


class HandOff(_LinkedAgentTool):
    """``handoff(agent, reason?)``: the conversation goes on under a linked agent (its
    instructions, model, tools and limits), which sees everything said so far."""

    ref = "handoff"

    def __init__(
        self, links: Sequence[AgentLink], delegation: Delegation, permitted: Callable[[str], bool]
    ) -> None:
        super().__init__(links, delegation, permitted)
        self.spec = self._agent_spec(
            "Hand the conversation over to another agent: it answers from now on, seeing "
            "everything said so far. Call it alone, as your last call.",
            {"reason": {"type": "string", "maxLength": MAX_HANDOFF_REASON_CHARS}},
        )

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        name = str(arguments["agent"])
        await self.delegation.describe(ctx.namespace, name)  # gone: unavailable, now
        return Handoff(name, str(arguments.get("reason") or ""))


def child_key(ctx: ToolContext, arguments: dict[str, Any]) -> str:
    """The idempotency key of the child run a call starts: :meth:`ToolContext.key_with`
    (the call's own key, the same on every replay, and a digest of its arguments)."""
    return f"child:{ctx.key_with(arguments)}"


def linked_agent_tools(
    links: Sequence[AgentLink],
    delegation: Delegation,
    permitted: Callable[[str], bool],
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> list[Tool]:
    """The four tools of an agent with ``links`` (none without); ``permitted`` says whether
    the agent's roles allow a ref (``agents_list`` lists only those), ``max_depth`` is the
    agent's ``limits.max_depth``."""
    if not links:
        return []
    return [
        AgentsList(links, delegation, permitted),
        AgentsInfo(links, delegation, permitted),
        AgentsExec(links, delegation, permitted, max_depth),
        HandOff(links, delegation, permitted),
    ]
