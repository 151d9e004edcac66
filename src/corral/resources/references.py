"""References between resources, and the check that every one of them resolves.

A reference points from a field of one resource to another resource of a
known kind in the same namespace: an Agent's ``model`` to a ModelEndpoint, a
``tools`` entry to a Tool (or ``mcp:SERVER/...`` to a McpServer), a role to an
AgentRole, a role's permissions to ToolPermissions, and every ``secret:`` to a
Secret, an Agent's ``links`` to other Agents (never itself), its ``memory``
entries to Memories, a Memory's ``embedding.model`` to a ModelEndpoint, and an
AgentSystem's entry and nodes to Agents.
:func:`references_of` lists them; :func:`check_references` makes sure
each exists in the batch being applied or in the store, and reports every
missing one with file, line and field.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from corral.core.errors import Location, ResourceError
from corral.resources.kinds import (
    AgentRoleSpec,
    AgentSpec,
    EnvValue,
    HttpAuth,
    McpServerSpec,
    ModelEndpointSpec,
    Resource,
    Spec,
    ToolSpecModel,
    is_valid_name,
)
from corral.resources.loader import FieldPath, LoadedResource, format_path
from corral.resources.memory import MemorySpec
from corral.resources.systems import AgentSystemSpec

MCP_PREFIX = "mcp:"
_MCP_TOOL = re.compile(r"^mcp:(?P<server>[^/]+)/(?P<tool>.+)$")


class HasSpec(Protocol):
    """A resource, or the API's view of a stored one: what its references are read from."""

    @property
    def spec(self) -> Spec: ...


R = TypeVar("R", bound=HasSpec)

ExistsLookup = Callable[[str, str, str], Awaitable[bool]]
"""``(namespace, kind, name) -> exists`` over what is already stored."""


@dataclass(frozen=True)
class Reference:
    """One field of one resource naming another resource."""

    kind: str
    name: str
    field: FieldPath


@dataclass(frozen=True)
class MalformedReference:
    """A field that should name a resource but cannot be read as one."""

    field: FieldPath
    reason: str


def parse_tool_ref(entry: str) -> tuple[str, str] | None:
    """``add`` -> ``("Tool", "add")``; ``mcp:files/read`` -> ``("McpServer", "files")``.

    Returns ``None`` when the entry is neither form.
    """
    if entry.startswith(MCP_PREFIX):
        match = _MCP_TOOL.match(entry)
        if match is None or not is_valid_name(match["server"]) or "/" in match["tool"]:
            return None
        return "McpServer", match["server"]
    if is_valid_name(entry):
        return "Tool", entry
    return None


def references_of(resource: HasSpec) -> list[Reference | MalformedReference]:
    """Every reference ``resource`` makes, with the field that makes it."""
    return list(_references(resource))


def _references(resource: HasSpec) -> Iterator[Reference | MalformedReference]:
    spec = resource.spec
    if isinstance(spec, AgentSpec):
        yield Reference("ModelEndpoint", spec.model, ("spec", "model"))
        for i, name in enumerate(spec.fallback_models):
            yield Reference("ModelEndpoint", name, ("spec", "fallback_models", i))
        for i, entry in enumerate(spec.tools):
            parsed = parse_tool_ref(entry)
            field: FieldPath = ("spec", "tools", i)
            if parsed is None:
                yield MalformedReference(
                    field,
                    f"malformed tool reference {entry!r}: use a Tool name, "
                    "'mcp:SERVER/TOOL' or 'mcp:SERVER/*'",
                )
            else:
                yield Reference(parsed[0], parsed[1], field)
        for i, role in enumerate(spec.roles):
            yield Reference("AgentRole", role, ("spec", "roles", i))
        for i, link in enumerate(spec.links):
            at: FieldPath = ("spec", "links", i)
            own_name = getattr(resource, "name", None)
            if link.agent == own_name:
                yield MalformedReference(at, f"agent {own_name!r} cannot link to itself")
            else:
                yield Reference("Agent", link.agent, at)
        for i, memory in enumerate(spec.memory):
            yield Reference("Memory", memory.ref, ("spec", "memory", i, "ref"))
    elif isinstance(spec, AgentSystemSpec):
        yield Reference("Agent", spec.entry, ("spec", "entry"))
        for name, node in spec.graph.items():
            yield Reference("Agent", name, ("spec", "graph", name))
            for i, following in enumerate(node.next):
                yield Reference("Agent", following, ("spec", "graph", name, "next", i))
    elif isinstance(spec, AgentRoleSpec):
        for i, permission in enumerate(spec.permissions):
            yield Reference("ToolPermission", permission, ("spec", "permissions", i))
    elif isinstance(spec, ModelEndpointSpec):
        if spec.api_key is not None:
            yield Reference("Secret", spec.api_key.secret, ("spec", "api_key", "secret"))
    elif isinstance(spec, ToolSpecModel):
        if spec.exec is not None:
            yield from _env_secrets(spec.exec.env, ("spec", "exec", "env"))
        if spec.http is not None:
            yield from _auth_secret(spec.http.auth, ("spec", "http", "auth"))
        if spec.a2a is not None:
            yield from _auth_secret(spec.a2a.auth, ("spec", "a2a", "auth"))
    elif isinstance(spec, McpServerSpec):
        yield from _env_secrets(spec.env, ("spec", "env"))
        yield from _auth_secret(spec.auth, ("spec", "auth"))
    elif isinstance(spec, MemorySpec):
        if spec.http is not None:
            yield from _auth_secret(spec.http.auth, ("spec", "http", "auth"))
        if spec.embedding is not None:
            yield Reference("ModelEndpoint", spec.embedding.model, ("spec", "embedding", "model"))


def _env_secrets(env: dict[str, str | EnvValue], prefix: FieldPath) -> Iterator[Reference]:
    for key, value in env.items():
        if isinstance(value, EnvValue) and value.secret is not None:
            yield Reference("Secret", value.secret, (*prefix, key, "secret"))


def _auth_secret(auth: HttpAuth | None, prefix: FieldPath) -> Iterator[Reference]:
    if auth is not None:
        yield Reference("Secret", auth.secret, (*prefix, "secret"))


def locate(item: Resource | LoadedResource, field: FieldPath) -> Location:
    """Where ``field`` of ``item`` is: file and line when it was loaded from a file."""
    if isinstance(item, LoadedResource):
        return item.location(field)
    return Location(None, None, format_path(field))


def resource_of(item: Resource | LoadedResource) -> Resource:
    return item.resource if isinstance(item, LoadedResource) else item


async def check_references(
    batch: Sequence[Resource | LoadedResource], lookup: ExistsLookup
) -> None:
    """Raise one :class:`ResourceError` listing every reference that does not resolve.

    A reference resolves when the named resource is in ``batch`` or
    ``lookup`` finds it stored, in the referring resource's namespace.
    """
    in_batch = {resource_of(item).key for item in batch}
    known: dict[tuple[str, str, str], bool] = {}
    problems: list[tuple[Location, str]] = []
    for item in batch:
        resource = resource_of(item)
        for ref in references_of(resource):
            prefix = (
                "" if isinstance(item, LoadedResource) else f"{resource.kind} {resource.name!r}: "
            )
            if isinstance(ref, MalformedReference):
                problems.append((locate(item, ref.field), prefix + ref.reason))
                continue
            key = (resource.namespace, ref.kind, ref.name)
            if key not in in_batch and key not in known:
                known[key] = await lookup(*key)
            if key not in in_batch and not known[key]:
                problems.append(
                    (
                        locate(item, ref.field),
                        f"{prefix}{ref.kind} {ref.name!r} not found in namespace "
                        f"{resource.namespace!r}",
                    )
                )
    if problems:
        raise ResourceError(problems)


def referrers(target: tuple[str, str], candidates: Sequence[R]) -> list[tuple[R, FieldPath]]:
    """The resources among ``candidates`` that reference ``target`` = ``(kind, name)``."""
    found: list[tuple[R, FieldPath]] = []
    for resource in candidates:
        for ref in references_of(resource):
            if isinstance(ref, Reference) and (ref.kind, ref.name) == target:
                found.append((resource, ref.field))
    return found
