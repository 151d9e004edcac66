"""``corral tasks describe``: a task for a human, kubectl ``describe`` style.

What a user asks of a run that went wrong, at a glance: its input, state, error
(code and reason), attempts, the approvals it asked for and who decided them, its
times and usage. Rendered from the API's bodies, so embedded and remote answer alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from corral.cli.output import ago, when
from corral.cli.views import run_labels

if TYPE_CHECKING:
    from corral.api import ApprovalOut, Task, TaskDetail

#: the width of a field's label
LABEL = 20


def _field(label: str, value: object, indent: int = 0) -> str:
    width = max(LABEL - indent, len(label) + 2)
    return " " * indent + f"{label + ':':<{width}}{value}"


def _block(label: str, text: str, indent: int = 0) -> list[str]:
    """A multi-line value under its label, indented."""
    lines = text.splitlines() or [""]
    if len(lines) == 1 and len(lines[0]) <= 60:
        return [_field(label, lines[0], indent)]
    return [" " * indent + f"{label}:", *(" " * (indent + 2) + line for line in lines)]


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{rest:02d}s" if hours else f"{minutes}m{rest:02d}s"


def _output(value: Any) -> str:
    from corral.cli.common import printable
    from corral.cli.render import render_output

    return printable(render_output(value))


def describe_task(
    task: TaskDetail, approvals: Sequence[ApprovalOut], children: Sequence[Task] = ()
) -> str:
    """The task, its approvals and its child tasks as ``Label: value`` lines."""
    lines = [
        _field("Name", task.id),
        _field("Namespace", task.namespace),
        _field("Labels", run_labels(task)),
        _field("Agent", task.agent),
        _field("State", task.state.value + (" (cancel requested)" if _cancelling(task) else "")),
        _field("Attempts", f"{task.attempts}/{task.max_attempts}"),
        _field("Priority", task.priority),
        _field("Session", task.session_id or "<none>"),
        _field("Idempotency Key", task.idempotency_key or "<none>"),
    ]
    if task.active_agent is not None:
        lines.append(_field("Active Agent", f"{task.active_agent} (after a handoff)"))
    if task.parent_run_id is not None:
        lines.append(_field("Parent", f"{task.parent_run_id} (depth {task.depth})"))
    if task.lease_owner and not task.state.finished:
        lines.append(_field("Worker", f"{task.lease_owner} (lease {ago(task.lease_expires_at)})"))
    lines += _block("Input", task.input)
    if task.output is not None:
        lines += _block("Output", _output(task.output))
    if task.error:
        lines += _error(task.error)
    lines += [
        "Times:",
        _field("Created", when(task.created_at), 2),
        _field("Not Before", when(task.not_before), 2) if task.not_before > task.created_at else "",
        _field("Started", when(task.started_at), 2),
        _field("Finished", when(task.finished_at), 2),
    ]
    lines = [line for line in lines if line]
    if task.started_at is not None and task.finished_at is not None:
        lines.append(_field("Duration", _duration(task.finished_at - task.started_at), 2))
    usage = task.usage
    lines += [
        "Usage:",
        _field("Steps", task.steps, 2),
        _field("Tokens", f"{usage.input_tokens} input, {usage.output_tokens} output", 2),
        _field("Model Requests", usage.requests, 2),
        _field("Cost", f"${task.cost_usd:.6f}", 2),
    ]
    caps = [
        *([f"${task.max_cost_usd:.6f}"] if task.max_cost_usd is not None else []),
        *([f"{task.max_tokens} tokens"] if task.max_tokens is not None else []),
    ]
    if caps:  # what its parent (or the token that started it) left it, over its agent's limits
        lines.append(_field("Capped At", ", ".join(caps), 2))
    lines += _approvals(approvals)
    lines += _children(children)
    return "\n".join(lines)


def _children(children: Sequence[Task]) -> list[str]:
    """The child tasks (``agents_exec``), when the task started any."""
    if not children:
        return []
    lines = ["Children:"]
    for child in children:
        lines.append(f"  {child.id}  {child.agent}  {child.state.value}")
    return lines


def _cancelling(task: TaskDetail) -> bool:
    return task.cancel_requested and not task.state.finished


def _error(error: dict[str, Any]) -> list[str]:
    lines = ["Error:", _field("Code", error.get("code", "error"), 2)]
    reason = str(error.get("message") or error.get("reason") or "")
    lines += _block("Reason", reason, 2)
    if "retryable" in error:
        lines.append(_field("Retryable", "yes" if error["retryable"] else "no", 2))
    for key, value in error.items():  # what else the error says (a budget's limit...)
        if key not in ("code", "message", "reason", "retryable", "details"):
            lines += _block(key.replace("_", " ").title(), str(value), 2)
    details = error.get("details")
    if details:
        import json

        lines += _block("Details", json.dumps(details, ensure_ascii=False, indent=2), 2)
    return lines


def _approvals(approvals: Sequence[ApprovalOut]) -> list[str]:
    if not approvals:
        return [_field("Approvals", "<none>")]
    lines = ["Approvals:"]
    for a in approvals:
        lines += [
            f"  {a.id}:",
            _field("Tool", a.tool, 4),
            *_block("Arguments", a.arguments, 4),
            *_block("Reason", a.reason, 4),
            _field("State", a.state.value, 4),
            _field("Requested", when(a.requested_at), 4),
        ]
        if a.decided_at is not None:
            decided = f"by {a.decided_by or '<unknown>'} {ago(a.decided_at)}"
            lines.append(_field("Decided", decided, 4))
        elif a.expires_at is not None:
            lines.append(_field("Expires", when(a.expires_at), 4))
        if a.decision_reason:
            lines += _block("Decision Reason", a.decision_reason, 4)
    return lines
