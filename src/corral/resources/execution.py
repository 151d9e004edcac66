"""Execution policies: what an agent's tools may be and how they must be isolated.

An ``Agent`` may say ``execution: {isolation, network, allowed_tool_types}``; a
``NamespacePolicy`` (one per namespace, named ``default``) gives the namespace's
default. :func:`effective_policy` is the one place they meet: each field is the
agent's own, else the namespace's, else the built-in default of the namespace.

The built-in defaults are secure outside the operator's namespace: in ``default``
isolation is ``preferred`` (each tool's own ``isolation``), network ``allow`` and
every type allowed; every other namespace gets :data:`RESTRICTED_DEFAULTS`
(isolation ``required``: every exec tool and stdio MCP server sandboxed, no
``isolation.mode: none``, python tools in a sandboxed subprocess) for each field
its NamespacePolicy leaves unset. Only the operator writes a NamespacePolicy, so
only the operator relaxes a namespace (``isolation: preferred`` in its policy).

An agent may tighten its namespace's policy (or its restricted defaults) but never
loosen it (a tenant's admin writes the agent, the operator writes the namespace policy):
:func:`loosening_problems` names what an agent would loosen, and apply refuses it.

The effective policy acts on tools in two places, both through this module:
:func:`tool_problem` (apply refuses, the builder raises a configuration error) and
:func:`isolation_under` (the isolation a tool of the agent actually runs with).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import Field, field_validator

from corral.resources.isolation import IsolationLimits, IsolationSpec
from corral.resources.spec import Spec

__all__ = [
    "DEFAULT_POLICY",
    "NAMESPACE_POLICY_NAME",
    "OPERATOR_NAMESPACE",
    "RESTRICTED_DEFAULTS",
    "TOOL_TYPES",
    "EffectivePolicy",
    "ExecutionSpec",
    "NamespacePolicySpec",
    "WasmPolicySpec",
    "effective_policy",
    "isolation_under",
    "loosening_problems",
    "namespace_defaults",
    "python_isolation_under",
    "tool_problem",
]

IsolationRule = Literal["required", "preferred", "off"]
NetworkRule = Literal["allow", "deny"]
#: the tool types a policy can allow: a Tool's ``type``, or ``mcp`` for an McpServer's tools
ToolType = Literal["python", "exec", "http", "mcp", "wasm", "a2a"]
TOOL_TYPES: tuple[str, ...] = get_args(ToolType)
#: the one name a NamespacePolicy may have
NAMESPACE_POLICY_NAME = "default"
#: the kind a namespace's policy is stored as
NAMESPACE_POLICY_KIND = "NamespacePolicy"

#: the operator's namespace: its agents get the permissive built-in defaults
OPERATOR_NAMESPACE = "default"

_STRICTNESS: dict[str, int] = {"off": 0, "preferred": 1, "required": 2}
_FIELDS = ("isolation", "network", "allowed_tool_types")


class ExecutionSpec(Spec):
    """An execution policy; an unset field takes the namespace's, then the built-in default."""

    isolation: IsolationRule | None = Field(
        default=None,
        description=(
            "required: every exec tool and stdio MCP server runs sandboxed or its calls fail "
            "(isolation_unavailable); preferred: as each tool's isolation says (default); off: "
            "'auto' tools run unsandboxed"
        ),
    )
    network: NetworkRule | None = Field(
        default=None, description="deny: sandboxes get no network, whatever a tool asks"
    )
    allowed_tool_types: list[ToolType] | None = Field(
        default=None,
        max_length=len(TOOL_TYPES),
        description="the tool types the agent may use (unset: all); 'mcp' covers McpServers",
    )

    @field_validator("isolation", mode="before")
    @classmethod
    def _yaml_off(cls, value: object) -> object:
        # YAML 1.1 reads an unquoted `off` as false: take it as what was written
        return "off" if value is False else value

    @field_validator("allowed_tool_types")
    @classmethod
    def _no_repeats(cls, types: list[ToolType] | None) -> list[ToolType] | None:
        if types is not None and len(set(types)) != len(types):
            raise ValueError("a tool type is listed twice")
        return types


class WasmPolicySpec(Spec):
    """What a namespace's ``wasm`` tools may ask for (over the server's own caps)."""

    max_memory_mb: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="the most linear memory a wasm tool of the namespace may declare, MiB",
    )


class NamespacePolicySpec(Spec):
    """The defaults of a namespace's agents; only the store's owner or a default admin sets it."""

    execution: ExecutionSpec = Field(default_factory=ExecutionSpec)
    wasm: WasmPolicySpec = Field(default_factory=WasmPolicySpec)
    max_tool_limits: IsolationLimits | None = Field(
        default=None,
        description=(
            "the most each call of an exec tool, stdio MCP server or sandboxed python tool of "
            "the namespace may use: "
            "a tool's larger limit is lowered to it, an unset one takes it"
        ),
    )


@dataclass(frozen=True)
class EffectivePolicy:
    """The policy an agent's tools run under, and where each field came from."""

    isolation: IsolationRule = "preferred"
    network: NetworkRule = "allow"
    allowed_tool_types: tuple[str, ...] = TOOL_TYPES
    #: the NamespacePolicy's ``max_tool_limits`` (``None``: none)
    max_tool_limits: IsolationLimits | None = None
    #: field -> ``agent``, ``namespace`` or ``default``
    sources: tuple[tuple[str, str], ...] = ()

    def allows(self, tool_type: str) -> bool:
        return tool_type in self.allowed_tool_types

    def to_dict(self) -> dict[str, Any]:
        """As ``run.start`` records it and ``describe`` shows it (``max_tool_limits`` only
        when the namespace sets it)."""
        described: dict[str, Any] = {
            "isolation": self.isolation,
            "network": self.network,
            "allowed_tool_types": list(self.allowed_tool_types),
            "sources": dict(self.sources),
        }
        if self.max_tool_limits is not None:
            described["max_tool_limits"] = self.max_tool_limits.model_dump(exclude_none=True)
        return described


DEFAULT_POLICY = EffectivePolicy()
#: what a namespace other than ``default`` gets for each field its NamespacePolicy leaves unset
RESTRICTED_DEFAULTS = ExecutionSpec(isolation="required")


def namespace_defaults(namespace: str) -> ExecutionSpec | None:
    """The built-in defaults of ``namespace`` over :data:`DEFAULT_POLICY` (``None``: none)."""
    return None if namespace == OPERATOR_NAMESPACE else RESTRICTED_DEFAULTS


def effective_policy(
    agent: ExecutionSpec | None,
    namespace: ExecutionSpec | None,
    restricted: ExecutionSpec | None = None,
) -> EffectivePolicy:
    """Each field: the agent's own, else the namespace's, else ``restricted`` (the
    namespace's built-in defaults, :func:`namespace_defaults`), else :data:`DEFAULT_POLICY`."""
    values: dict[str, Any] = {}
    sources: list[tuple[str, str]] = []
    layers = (("agent", agent), ("namespace", namespace), ("restricted", restricted))
    for field in _FIELDS:
        for source, spec in layers:
            value = getattr(spec, field) if spec is not None else None
            if value is not None:
                values[field] = tuple(value) if isinstance(value, list) else value
                sources.append((field, source))
                break
        else:
            values[field] = getattr(DEFAULT_POLICY, field)
            sources.append((field, "default"))
    return EffectivePolicy(**values, sources=tuple(sources))


def loosening_problems(
    agent: ExecutionSpec | None,
    namespace: ExecutionSpec | None,
    restricted: ExecutionSpec | None = None,
) -> list[tuple[str, str]]:
    """``(field, reason)`` for each field where ``agent`` is looser than ``namespace``
    (its fields unset taken from ``restricted``, the namespace's built-in defaults)."""
    unset: dict[str, Any] = {}
    if restricted is not None:
        base = namespace if namespace is not None else ExecutionSpec()
        unset = {
            f: getattr(restricted, f)
            for f in _FIELDS
            if getattr(base, f) is None and getattr(restricted, f) is not None
        }
        namespace = base.model_copy(update=unset)
    problems = _loosened(agent, namespace)
    return [
        (field, f"{reason} ({_RESTRICTED_NOTE})" if field in unset else reason)
        for field, reason in problems
    ]


_RESTRICTED_NOTE = (
    f"the built-in default of a namespace other than {OPERATOR_NAMESPACE!r}; "
    f"an admin of {OPERATOR_NAMESPACE!r} may relax it with a NamespacePolicy"
)


def _loosened(
    agent: ExecutionSpec | None, namespace: ExecutionSpec | None
) -> list[tuple[str, str]]:
    if agent is None or namespace is None:
        return []
    problems: list[tuple[str, str]] = []
    if (
        agent.isolation is not None
        and namespace.isolation is not None
        and _STRICTNESS[agent.isolation] < _STRICTNESS[namespace.isolation]
    ):
        problems.append(
            (
                "isolation",
                f"isolation {agent.isolation!r} would loosen the namespace policy's "
                f"{namespace.isolation!r}",
            )
        )
    if agent.network == "allow" and namespace.network == "deny":
        problems.append(("network", "network 'allow' would loosen the namespace policy's 'deny'"))
    if agent.allowed_tool_types is not None and namespace.allowed_tool_types is not None:
        extra = [t for t in agent.allowed_tool_types if t not in namespace.allowed_tool_types]
        if extra:
            problems.append(
                (
                    "allowed_tool_types",
                    f"the namespace policy does not allow {', '.join(extra)} "
                    f"(it allows {', '.join(namespace.allowed_tool_types) or 'none'})",
                )
            )
    return problems


def tool_problem(
    policy: EffectivePolicy,
    ref: str,
    tool_type: str,
    isolation: IsolationSpec | None,
    outbound: bool = False,
) -> str | None:
    """Why the agent's policy refuses tool ``ref`` of ``tool_type``, or ``None``.

    ``isolation`` is the tool's own block (exec tools, stdio MCP servers), else ``None``;
    ``outbound``: the tool calls out over the network itself (``http``, ``a2a``, an
    MCP server over HTTP), which ``network: deny`` refuses.
    """
    if not policy.allows(tool_type):
        allowed = ", ".join(policy.allowed_tool_types) or "none"
        return (
            f"tool {ref!r} is of type {tool_type!r}, which the agent's execution policy does "
            f"not allow (allowed_tool_types: {allowed})"
        )
    if policy.isolation == "required" and isolation is not None and isolation.mode == "none":
        note = (
            f" ({_RESTRICTED_NOTE})"
            if dict(policy.sources).get("isolation") == "restricted"
            else ""
        )
        return (
            f"tool {ref!r} says isolation.mode 'none', but the agent's execution policy "
            f"requires a sandbox (isolation: required){note}"
        )
    if policy.network == "deny" and outbound:
        return (
            f"tool {ref!r} calls out over the network, which the agent's execution policy "
            "denies (network: deny)"
        )
    return None


def isolation_under(policy: EffectivePolicy, isolation: IsolationSpec) -> IsolationSpec:
    """The isolation a tool runs with under ``policy`` (its own, tightened or relaxed).

    ``required`` turns ``auto`` into ``sandbox`` (a call fails closed where bubblewrap
    does not work); ``off`` turns ``auto`` into ``none``; ``deny`` turns the
    sandbox's network off. A tool's ``none`` under ``required`` is refused by
    :func:`tool_problem` before this is asked.
    """
    update: dict[str, Any] = {}
    if policy.isolation == "required" and isolation.mode == "auto":
        update["mode"] = "sandbox"
    elif policy.isolation == "off" and isolation.mode == "auto":
        update["mode"] = "none"
    if policy.network == "deny" and isolation.network:
        update["network"] = False
    return isolation.model_copy(update=update) if update else isolation


def python_isolation_under(policy: EffectivePolicy, isolation: str) -> str:
    """A python tool's ``isolation`` under ``policy``: ``required`` runs every python tool
    in the sandbox (``sandbox``, never in the server's process), whatever it says."""
    return "sandbox" if policy.isolation == "required" else isolation
