"""The ``AgentSystem`` kind: a declared graph of agents that pass their outputs on.

``spec.entry`` receives the system's input; ``spec.graph`` maps each agent (a node)
to the agents its output goes to (``next``), how a node with several inputs joins
them (``join``) and how a node picks among its ``next`` agents (``route``);
``spec.limits`` bound the whole system run, ``spec.output`` names the node whose
output is the system's. How a system run executes is :mod:`corral.runtime.systems`.

The shape of the graph is checked here (:func:`graph_problems`: every problem with
the field it is about), at apply, by the store, in the apply's transaction
(:func:`check_systems`, which also checks what needs the other resources: a
``by_output`` node's Agent must declare an ``output_schema``). That each node names
an Agent is a reference (:mod:`corral.resources.references`), so deleting an Agent
a system uses is refused like deleting any referenced resource.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Annotated, Any, Literal

from pydantic import Field

from corral.core.errors import Location, ResourceError
from corral.resources.spec import Spec

_NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"
_NAME_RE = re.compile(_NAME_PATTERN)
NodeName = Annotated[str, Field(pattern=_NAME_PATTERN)]

#: the most nodes (agents) one system may have: a graph is walked at every step of its
#: runs, and a bigger one is a mistake rather than a design
MAX_SYSTEM_NODES = 64
#: the most ``next`` agents of one node
MAX_NEXT = 32
#: the hard ceilings of the limits (a runaway system stops well before them)
MAX_HOPS_CEILING = 1000
MAX_MESSAGES_CEILING = 10_000

Join = Literal["all", "any", "first"]
Route = Literal["fixed", "by_output"]


class SystemNode(Spec):
    """One node of the graph: where its agent's output goes, and how its inputs join."""

    next: list[NodeName] = Field(
        default_factory=list, max_length=MAX_NEXT, description="agents that receive its output"
    )
    join: Join | None = Field(
        default=None,
        description=(
            "a node with several inputs: all (once, with every input's output), any (once "
            "per input), first (once, with the first input; later ones are dropped)"
        ),
    )
    route: Route = Field(
        default="fixed",
        description=(
            "fixed: every next agent receives the output; by_output: the output's 'next' "
            "field (a name or a list of names among next) picks them"
        ),
    )


class SystemLimits(Spec):
    """Limits of one system run, over all its node runs."""

    max_hops: int | None = Field(
        default=None,
        ge=1,
        le=MAX_HOPS_CEILING,
        description="the longest path of messages from the input; required by a graph with a cycle",
    )
    max_messages: int = Field(
        default=100, ge=1, le=MAX_MESSAGES_CEILING, description="messages of one system run"
    )
    timeout_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="wall time of a system run: at its deadline the run fails, a node that "
        "hangs with it",
    )
    max_cost_usd: float | None = Field(
        default=None,
        ge=0,
        description="the cost of all its node runs together; each node run is capped at "
        "what is left",
    )


class AgentSystemSpec(Spec):
    """A graph of agents: the entry receives the input, outputs flow along ``next``."""

    entry: NodeName
    graph: dict[str, SystemNode] = Field(
        default_factory=dict,
        max_length=MAX_SYSTEM_NODES,
        description=f"agent -> its node; at most {MAX_SYSTEM_NODES} agents in all",
    )
    limits: SystemLimits = Field(default_factory=SystemLimits)
    output: NodeName | None = Field(
        default=None,
        description="the agent whose output is the system's (default: the one node without next)",
    )

    def node(self, agent: str) -> SystemNode:
        """The node of ``agent`` (a node named only as a ``next`` has the defaults)."""
        return self.graph.get(agent) or SystemNode()

    def nodes(self) -> list[str]:
        """Every agent of the graph: the entry, the graph's keys, every ``next``."""
        seen = dict.fromkeys([self.entry, *self.graph])
        for node in self.graph.values():
            seen.update(dict.fromkeys(node.next))
        return list(seen)

    def inputs(self, agent: str) -> list[str]:
        """The agents whose output goes to ``agent``, in graph order."""
        return [name for name, node in self.graph.items() if agent in node.next]

    def output_node(self) -> str | None:
        """The agent whose output is the system's: ``output``, else the one sink."""
        if self.output is not None:
            return self.output
        sinks = [name for name in self.nodes() if not self.node(name).next]
        return sinks[0] if len(sinks) == 1 else None

    def has_cycle(self) -> bool:
        """Whether some agent's output can come back to it."""
        state: dict[str, int] = {}  # 1: on the path, 2: done
        for start in self.nodes():
            if start in state:
                continue
            stack: list[tuple[str, Iterator[str]]] = [(start, iter(self.node(start).next))]
            state[start] = 1
            while stack:
                name, successors = stack[-1]
                following = next(successors, None)
                if following is None:
                    state[name] = 2
                    stack.pop()
                elif state.get(following) == 1:
                    return True
                elif following not in state:
                    state[following] = 1
                    stack.append((following, iter(self.node(following).next)))
        return False


FieldPath = tuple[str | int, ...]


def graph_problems(spec: AgentSystemSpec) -> list[tuple[FieldPath, str]]:
    """What is wrong with the graph's shape, each with the field it is about."""
    problems: list[tuple[FieldPath, str]] = []
    nodes = spec.nodes()
    if len(nodes) > MAX_SYSTEM_NODES:
        return [
            (
                ("spec", "graph"),
                f"a system has at most {MAX_SYSTEM_NODES} agents; this one has {len(nodes)}",
            )
        ]
    for name in spec.graph:
        if not _valid_name(name):
            problems.append(
                (("spec", "graph", name), "a node is an Agent's name (lower case, digits, '.-_')")
            )
    for name, node in spec.graph.items():
        if len(set(node.next)) != len(node.next):
            problems.append((("spec", "graph", name, "next"), "an agent is named twice"))
    reachable = _reachable(spec)
    for name in nodes:
        if name not in reachable:
            at: FieldPath = ("spec", "graph", name) if name in spec.graph else ("spec", "graph")
            problems.append((at, f"agent {name!r} cannot be reached from the entry {spec.entry!r}"))
    for name, node in spec.graph.items():
        inputs = len(spec.inputs(name))
        if node.join is not None and inputs < 2:
            problems.append(
                (
                    ("spec", "graph", name, "join"),
                    f"a join needs at least two inputs; {name!r} has {inputs}",
                )
            )
    for name in nodes:
        if len(spec.inputs(name)) >= 2 and spec.node(name).join is None:
            at = ("spec", "graph", name, "join") if name in spec.graph else ("spec", "graph")
            problems.append(
                (at, f"agent {name!r} has several inputs: say how they join (all, any, first)")
            )
    for name, node in spec.graph.items():
        if node.join in ("all", "first") and name in _reachable(spec, name):
            # its join runs once per system run: every later round would be dropped
            problems.append(
                (
                    ("spec", "graph", name, "join"),
                    f"agent {name!r} is on a cycle: a join {node.join!r} runs once per system "
                    "run and would drop every later round; use join 'any'",
                )
            )
    if spec.has_cycle() and spec.limits.max_hops is None:
        problems.append(
            (("spec", "limits", "max_hops"), "the graph has a cycle: set limits.max_hops")
        )
    if spec.output is not None and spec.output not in nodes:
        problems.append((("spec", "output"), f"agent {spec.output!r} is not a node of the graph"))
    elif spec.output_node() is None:
        problems.append(
            (
                ("spec", "output"),
                "the graph has no single agent without next: name the agent whose output "
                "is the system's",
            )
        )
    return problems


def _valid_name(name: str) -> bool:
    return _NAME_RE.match(name) is not None


def _reachable(spec: AgentSystemSpec, start: str | None = None) -> set[str]:
    """The agents reachable from the entry; from ``start``'s next (not ``start`` itself
    unless a path leads back to it), when given."""
    seen = {spec.entry} if start is None else set[str]()
    todo = [spec.entry] if start is None else list(spec.node(start).next)
    seen.update(todo)
    while todo:
        for following in spec.node(todo.pop()).next:
            if following not in seen:
                seen.add(following)
                todo.append(following)
    return seen


SpecLookup = Callable[[str, str, str], Awaitable[Any]]
"""``(namespace, kind, name) -> spec`` of what is already stored (``None``: absent)."""


async def check_systems(
    items: Sequence[Any],
    stored_spec: SpecLookup,
    locate: Callable[[Any, FieldPath], Location],
    resource_of: Callable[[Any], Any],
) -> None:
    """Raise one :class:`ResourceError` listing what is wrong with the AgentSystems of an
    applied batch: the graph's shape, and a ``by_output`` node whose Agent (in the batch,
    else stored) has no ``output_schema``. An Agent that does not exist is left to the
    references check."""
    batch_specs = {resource_of(item).key: resource_of(item).spec for item in items}
    problems: list[tuple[Location, str]] = []
    for item in items:
        resource = resource_of(item)
        spec = resource.spec
        if not isinstance(spec, AgentSystemSpec):
            continue
        shape = graph_problems(spec)
        problems += [(locate(item, path), reason) for path, reason in shape]
        if shape:
            continue
        for name, node in spec.graph.items():
            if node.route != "by_output":
                continue
            key = (resource.namespace, "Agent", name)
            agent = batch_specs[key] if key in batch_specs else await stored_spec(*key)
            if agent is not None and getattr(agent, "output_schema", None) is None:
                problems.append(
                    (
                        locate(item, ("spec", "graph", name, "route")),
                        f"route by_output needs agent {name!r} to declare an output_schema "
                        "(its output names the next agents)",
                    )
                )
    if problems:
        raise ResourceError(problems)


__all__ = [
    "MAX_SYSTEM_NODES",
    "AgentSystemSpec",
    "SystemLimits",
    "SystemNode",
    "check_systems",
    "graph_problems",
]
