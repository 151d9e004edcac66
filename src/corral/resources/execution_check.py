"""Apply's check of execution policies: the ``NamespacePolicy`` name, and each Agent's tools.

Runs in the apply's transaction next to :func:`~corral.resources.references.check_references`,
against the batch and the stored resources. An Agent in the batch is refused when it
would loosen its namespace's policy, or when its effective policy
(:func:`~corral.resources.execution.effective_policy`) refuses one of its tools: a type
not in ``allowed_tool_types``, ``isolation.mode: none`` under ``required``, or a tool
that calls out over the network under ``network: deny``.

A wasm Tool in the batch is refused when it asks more memory than its namespace's
``wasm.max_memory_mb``.

Applying a NamespacePolicy does not re-check the agents already stored: an agent
the new policy refuses fails at its next run's build, with the same reason
(:func:`agent_tool_problems` is shared with :mod:`corral.runtime.builder`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from corral.core.errors import Location, ResourceError
from corral.resources.execution import (
    NAMESPACE_POLICY_KIND,
    NAMESPACE_POLICY_NAME,
    EffectivePolicy,
    ExecutionSpec,
    NamespacePolicySpec,
    effective_policy,
    loosening_problems,
    namespace_defaults,
    tool_problem,
)
from corral.resources.isolation import IsolationSpec
from corral.resources.kinds import AgentSpec, McpServerSpec, Resource, Spec, ToolSpecModel
from corral.resources.loader import LoadedResource
from corral.resources.references import locate, parse_tool_ref, resource_of

__all__ = [
    "SpecLookup",
    "agent_tool_problems",
    "check_execution_policies",
    "namespace_execution",
    "namespace_wasm_cap",
    "tool_facts",
]

SpecLookup = Callable[[str, str, str], Awaitable[Spec | None]]
"""``(namespace, kind, name) -> spec`` of what is already stored (``None``: absent)."""


#: the Tool types whose calls go out over the network from the server's process
OUTBOUND_TOOL_TYPES = frozenset({"http", "a2a"})


def tool_facts(spec: Spec) -> tuple[str, IsolationSpec | None, bool] | None:
    """A Tool's or McpServer's type as policies name it, its own isolation (if any), and
    whether the server calls out over the network for it."""
    if isinstance(spec, ToolSpecModel):
        isolation = spec.exec.isolation if spec.exec is not None else None
        return spec.type, isolation, spec.type in OUTBOUND_TOOL_TYPES
    if isinstance(spec, McpServerSpec):
        stdio = spec.transport == "stdio"
        return "mcp", spec.isolation if stdio else None, not stdio
    return None


async def agent_tool_problems(
    agent: AgentSpec, policy: EffectivePolicy, namespace: str, lookup: SpecLookup
) -> list[tuple[int, str]]:
    """``(index in tools, reason)`` for each of the agent's tools its policy refuses."""
    problems: list[tuple[int, str]] = []
    for index, entry in enumerate(agent.tools):
        parsed = parse_tool_ref(entry)
        if parsed is None:
            continue  # reported by check_references
        spec = await lookup(namespace, *parsed)
        facts = tool_facts(spec) if spec is not None else None
        if facts is None:
            continue  # missing: reported by check_references (or by the build)
        problem = tool_problem(policy, entry, *facts)
        if problem is not None:
            problems.append((index, problem))
    return problems


async def namespace_execution(namespace: str, lookup: SpecLookup) -> ExecutionSpec | None:
    """The execution defaults of ``namespace``'s NamespacePolicy, if it has one."""
    spec = await lookup(namespace, NAMESPACE_POLICY_KIND, NAMESPACE_POLICY_NAME)
    return spec.execution if isinstance(spec, NamespacePolicySpec) else None


async def namespace_wasm_cap(namespace: str, lookup: SpecLookup) -> int | None:
    """The NamespacePolicy's cap on a wasm tool's ``max_memory_mb``, if it sets one."""
    spec = await lookup(namespace, NAMESPACE_POLICY_KIND, NAMESPACE_POLICY_NAME)
    return spec.wasm.max_memory_mb if isinstance(spec, NamespacePolicySpec) else None


async def check_execution_policies(
    batch: Sequence[Resource | LoadedResource], stored: SpecLookup
) -> None:
    """Raise one :class:`ResourceError` naming every policy problem of ``batch``."""
    in_batch = {resource_of(item).key: resource_of(item).spec for item in batch}

    async def lookup(namespace: str, kind: str, name: str) -> Spec | None:
        found = in_batch.get((namespace, kind, name))
        return found if found is not None else await stored(namespace, kind, name)

    problems: list[tuple[Location, str]] = []
    for item in batch:
        resource = resource_of(item)
        prefix = "" if isinstance(item, LoadedResource) else f"{resource.kind} {resource.name!r}: "
        if resource.kind == NAMESPACE_POLICY_KIND and resource.name != NAMESPACE_POLICY_NAME:
            problems.append(
                (
                    locate(item, ("metadata", "name")),
                    f"{prefix}a NamespacePolicy is named {NAMESPACE_POLICY_NAME!r} "
                    "(one per namespace)",
                )
            )
        spec = resource.spec
        if isinstance(spec, ToolSpecModel) and spec.wasm is not None:
            cap = await namespace_wasm_cap(resource.namespace, lookup)
            if cap is not None and spec.wasm.max_memory_mb > cap:
                problems.append(
                    (
                        locate(item, ("spec", "wasm", "max_memory_mb")),
                        f"{prefix}max_memory_mb {spec.wasm.max_memory_mb} is over the "
                        f"namespace policy's wasm.max_memory_mb ({cap})",
                    )
                )
        if not isinstance(spec, AgentSpec):
            continue
        defaults = await namespace_execution(resource.namespace, lookup)
        restricted = namespace_defaults(resource.namespace)
        for field, reason in loosening_problems(spec.execution, defaults, restricted):
            problems.append((locate(item, ("spec", "execution", field)), prefix + reason))
        policy = effective_policy(spec.execution, defaults, restricted)
        for index, reason in await agent_tool_problems(spec, policy, resource.namespace, lookup):
            problems.append((locate(item, ("spec", "tools", index)), prefix + reason))
    if problems:
        raise ResourceError(problems)
