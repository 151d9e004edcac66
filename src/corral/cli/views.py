"""How each API body is shown by :mod:`corral.cli.output`: its kind, name and columns.

One :class:`~corral.cli.output.View` per body, shared by every command that shows it
(``tasks list`` and ``tasks get``, ``submit`` and ``cancel`` print the same task).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from corral.api import (
    AppliedResource,
    ApprovalOut,
    ResourceOut,
    SessionMessageOut,
    SessionOut,
    Task,
    TokenOut,
)
from corral.cli.output import Column, View, age_of, ago, one_line

if TYPE_CHECKING:
    from corral.resources.kinds import Spec

NONE = "<none>"


def _or_none(value: object) -> str:
    return NONE if value in (None, "") else str(value)


def run_error(task: Task) -> str:
    """``code: reason`` of a failed run, ``<none>`` otherwise."""
    if not task.error:
        return NONE
    code = task.error.get("code", "error")
    message = task.error.get("message") or task.error.get("reason") or ""
    return f"{code}: {one_line(str(message))}" if message else str(code)


def run_labels(task: Task) -> str:
    """A run's labels as ``key=value,...``, ``<none>`` without any."""
    return ",".join(f"{k}={v}" for k, v in sorted(task.labels.items())) or NONE


def task_agent(task: Task) -> str:
    """The submitted agent, and the one the run went on under after a handoff:
    ``triage→billing``."""
    if task.active_agent is None or task.active_agent == task.agent:
        return task.agent
    return f"{task.agent}→{task.active_agent}"


def _tokens(task: Task) -> str:
    return f"{task.usage.input_tokens}+{task.usage.output_tokens}"


TASK: View[Task] = View(
    kind=lambda _: "task",
    name=lambda t: t.id,
    columns=[
        Column("ID", lambda t: t.id),
        Column("AGENT", task_agent),
        Column("STATE", lambda t: t.state.value),
        Column("ATTEMPTS", lambda t: f"{t.attempts}/{t.max_attempts}"),
        Column("STEPS", lambda t: str(t.steps)),
        Column("AGE", lambda t: age_of(t.created_at)),
        Column("SESSION", lambda t: _or_none(t.session_id), wide=True),
        Column("TOKENS", _tokens, wide=True),
        Column("LABELS", run_labels, wide=True, free_text=True),
        Column("ERROR", run_error, wide=True, free_text=True),
    ],
)

APPROVAL: View[ApprovalOut] = View(
    kind=lambda _: "approval",
    name=lambda a: a.id,
    columns=[
        Column("ID", lambda a: a.id),
        Column("RUN", lambda a: a.run_id),
        Column("AGENT", lambda a: a.agent),
        Column("TOOL", lambda a: a.tool),
        Column("STATE", lambda a: a.state.value),
        Column("AGE", lambda a: age_of(a.requested_at)),
        Column("DECIDED BY", lambda a: _or_none(a.decided_by), wide=True),
        Column("DECIDED", lambda a: ago(a.decided_at), wide=True),
        Column("ARGUMENTS", lambda a: a.arguments, wide=True, free_text=True),
        Column("REASON", lambda a: a.reason, free_text=True),
    ],
)

TOKEN: View[TokenOut] = View(
    kind=lambda _: "token",
    name=lambda t: t.id,
    columns=[
        Column("ID", lambda t: t.id),
        Column("NAMESPACE", lambda t: t.namespace),
        Column("ROLE", lambda t: t.role.value),
        Column("NAME", lambda t: _or_none(t.name)),
        Column("STATUS", lambda t: "revoked" if t.revoked_at is not None else "active"),
        Column("AGE", lambda t: age_of(t.created_at)),
        Column("LAST USED", lambda t: ago(t.last_used_at), wide=True),
        Column("DESCRIPTION", lambda t: _or_none(t.description), wide=True, free_text=True),
    ],
)

SESSION: View[SessionOut] = View(
    kind=lambda _: "session",
    name=lambda s: s.id,
    columns=[
        Column("ID", lambda s: s.id),
        Column("AGENT", lambda s: s.agent),
        Column("LAST USED", lambda s: ago(s.updated_at)),
        Column("AGE", lambda s: age_of(s.created_at)),
        Column("NAMESPACE", lambda s: s.namespace, wide=True),
    ],
)


def _flags(m: SessionMessageOut) -> str:
    return "compacted" if m.hidden else "summary" if m.summary else ""


def session_messages(session_id: str) -> View[SessionMessageOut]:
    """A session's messages (``sessions show -o ...``); ``-o name`` names the session's
    messages ``session/ID#SEQ``."""
    return View(
        kind=lambda _: "session",
        name=lambda m: f"{session_id}#{m.seq}",
        columns=[
            Column("SEQ", lambda m: str(m.seq)),
            Column("ROLE", lambda m: m.message.role),
            Column("FLAGS", lambda m: _flags(m) or NONE, wide=True),
            Column("RUN", lambda m: _or_none(m.run_id), wide=True),
            Column("AGE", lambda m: age_of(m.created_at)),
            Column("CONTENT", lambda m: m.message.content, free_text=True),
        ],
    )


# --------------------------------------------------------------------------- resources


def _attr(*path: str) -> Callable[[ResourceOut], str]:
    def cell(resource: ResourceOut) -> str:
        value: Any = resource.spec
        for part in path:
            value = getattr(value, part, None)
        if isinstance(value, list):
            return ", ".join(str(v) for v in value) or "-"
        return "-" if value in (None, "") else str(value)

    return cell


def _target(resource: ResourceOut) -> str:
    spec: Spec = resource.spec
    command = getattr(spec, "command", None) or []
    return getattr(spec, "url", None) or " ".join(command) or "-"


def _secret_source(resource: ResourceOut) -> str:
    # Only where the value comes from: never the value, never the ciphertext.
    env = getattr(resource.spec, "from_env", None)
    return f"env:{env}" if env else "encrypted"


def _labels(resource: ResourceOut) -> str:
    labels = resource.metadata.labels
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or NONE


#: the columns of each kind after NAME and NAMESPACE
KIND_COLUMNS: dict[str, list[Column[ResourceOut]]] = {
    "Agent": [Column("MODEL", _attr("model")), Column("TOOLS", _attr("tools"), free_text=True)],
    "ModelEndpoint": [Column("PROVIDER", _attr("provider")), Column("MODEL", _attr("model"))],
    "Tool": [Column("TYPE", _attr("type")), Column("RISK", _attr("risk"))],
    "McpServer": [
        Column("TRANSPORT", _attr("transport")),
        Column("TARGET", _target, free_text=True),
    ],
    "Secret": [Column("SOURCE", _secret_source)],
    "AgentRole": [Column("PERMISSIONS", _attr("permissions"), free_text=True)],
    "ToolPermission": [
        Column("EFFECT", _attr("effect")),
        Column("TOOLS", _attr("tools"), free_text=True),
    ],
    "NamespacePolicy": [
        Column("ISOLATION", _attr("execution", "isolation")),
        Column("NETWORK", _attr("execution", "network")),
        Column("TOOL TYPES", _attr("execution", "allowed_tool_types"), free_text=True),
        Column("WASM MB", _attr("wasm", "max_memory_mb")),
    ],
    "Memory": [Column("BACKEND", _attr("backend")), Column("SCOPE", _attr("scope"))],
}


def resource_view(
    kind: str | None,
    extra: list[Column[ResourceOut]] | None = None,
    *,
    namespace_first: bool = False,
) -> View[ResourceOut]:
    """The view of resources of ``kind`` (``None``: of any kind), ``extra`` wide columns
    after the kind's own (``get agents -o wide``: the runs); ``namespace_first`` puts
    NAMESPACE before NAME, as kubectl does across namespaces (``get -A``)."""
    from corral.cli.render import resource_document

    columns: list[Column[ResourceOut]] = [
        Column("NAME", lambda r: r.metadata.name),
        Column("NAMESPACE", lambda r: r.metadata.namespace),
    ]
    if namespace_first:
        columns.reverse()
    if kind is None:
        columns.insert(0, Column("KIND", lambda r: r.kind))
    else:
        columns.extend(KIND_COLUMNS.get(kind, []))
    columns += [
        Column("AGE", lambda r: age_of(r.status.created_at)),
        Column("GENERATION", lambda r: str(r.status.generation), wide=True),
        *(extra or []),
        Column("LABELS", _labels, wide=True, free_text=True),
    ]
    return View(
        kind=lambda r: r.kind.lower(),
        name=lambda r: r.metadata.name,
        columns=columns,
        shown_as=resource_document,
    )


APPLIED: View[AppliedResource] = View(
    kind=lambda o: o.kind.lower(),
    name=lambda o: o.name,
    columns=[
        Column("KIND", lambda o: o.kind),
        Column("NAME", lambda o: o.name),
        Column("ACTION", lambda o: str(o.action)),
    ],
)
