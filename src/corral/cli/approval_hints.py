"""What to do next, said where it happens: a run that stops for approval, a decision
taken, a ``corral run`` interrupted. Each names the ids and the exact commands."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio
from rich.console import Console

from corral.cli.common import escape
from corral.core.errors import NotFoundError

if TYPE_CHECKING:
    from corral.api import ApprovalOut, Task
    from corral.cli.backend import Backend

_ARGUMENTS_PREVIEW = 120
#: how long ``approvals approve|reject`` watches whether a worker picks the run up
PICKUP_SECONDS = 2.0
PICKUP_LOOK_SECONDS = 0.2


def print_approval_hint(
    console: Console, record: Task, approvals: Sequence[ApprovalOut], *, waits: bool = False
) -> None:
    """For a run waiting for approval: each pending approval's id, its call, and the
    commands that decide it; then how the run goes on. ``waits``: this command keeps
    following the run (``corral run --wait``), so the decision can come from elsewhere."""
    from corral.core.runs import RunState

    if record.state is RunState.WAITING_CHILDREN:
        _say(
            console,
            f"[yellow]run {record.id} waits for its child tasks, one of which waits for a "
            f"human:[/] corral tasks tree {record.id}; corral approvals list",
        )
        return
    if record.state is not RunState.WAITING_APPROVAL:
        return
    if not approvals:  # decided meanwhile, or listed by another command
        _say(console, f"[yellow]run {record.id} waits for approval:[/] corral approvals list")
        return
    for approval in approvals:
        _say(console, approval_line(approval))
        _say(console, f"  approve: corral approvals approve {approval.id}")
        _say(
            console,
            f'  reject:  corral approvals reject {approval.id} --reason "..."',
        )
    if waits:
        _say(console, "[dim]waiting for the decision (Ctrl-C stops waiting; the run stays)[/]")
    else:
        _say(
            console,
            f"[dim]once decided, a worker resumes run {record.id} (`corral worker` or "
            f"`corral serve`); follow it: corral logs -f {record.id}[/]",
        )


def approval_line(approval: ApprovalOut) -> str:
    """``approval ID: tool(arguments)`` as markup, the arguments cut short."""
    arguments = " ".join(approval.arguments.split())
    if len(arguments) > _ARGUMENTS_PREVIEW:
        arguments = arguments[: _ARGUMENTS_PREVIEW - 1] + "…"
    return f"[yellow]approval {approval.id}[/]: {escape(approval.tool)}({escape(arguments)})"


async def picked_up(backend: Backend, run_id: str) -> Task | None:
    """The run a decision was about, once it left ``queued`` or after PICKUP_SECONDS.

    Corral keeps no registry of live workers (a worker is known by the leases it
    holds): whether one runs is seen by whether the queued run is claimed soon.
    ``None`` when the run is gone."""
    from corral.core.runs import RunState

    deadline = anyio.current_time() + PICKUP_SECONDS
    while True:
        try:
            run: Task = await backend.get_run(run_id)
        except NotFoundError:
            return None
        if run.state is not RunState.QUEUED or anyio.current_time() >= deadline:
            return run
        await anyio.sleep(PICKUP_LOOK_SECONDS)


def print_pickup(console: Console, run_id: str, run: Task | None) -> None:
    """After a decision: what the run does now, and what to do if nothing picks it up."""
    from corral.core.runs import RunState

    if run is None:
        _say(console, f"run {run_id} is gone")
        return
    state = run.state
    if state is RunState.QUEUED:
        _say(
            console,
            f"[yellow]run {run.id} queued; no worker has picked it up yet: start "
            "`corral worker` or `corral serve`[/]",
        )
    elif state is RunState.WAITING_APPROVAL:
        left = len(run.pending_approvals)
        _say(
            console,
            f"run {run.id} still waits for {left} more decision(s): corral approvals list",
        )
        return
    elif state is RunState.RUNNING:
        by = f" on worker {run.lease_owner}" if run.lease_owner else ""
        _say(console, f"run {run.id} resumed{by}")
    else:
        _say(console, f"run {run.id} {state.value}")
    _say(console, f"[dim]follow it: corral logs -f {run.id}[/]")


def _say(console: Console, markup: str) -> None:
    """One line of markup, never wrapped (ids and commands stay whole for copy and paste)."""
    console.print(markup, highlight=False, soft_wrap=True)
