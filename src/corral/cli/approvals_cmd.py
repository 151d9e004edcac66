"""``corral approvals list|approve|reject``: tool calls that wait for a human."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from corral.cli.common import NAMESPACE, run_async
from corral.cli.output import CHANGE_FORMATS, output_option
from corral.cli.watch import WATCH, WATCH_INTERVAL, WATCH_TIMEOUT

if TYPE_CHECKING:
    from corral.api import ApprovalOut, Task

approvals_app = typer.Typer(help="Decide tool calls that wait for a human.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(approvals_app, name="approvals")


@approvals_app.command("list")
def approvals_list(
    namespace: str = NAMESPACE,
    all_states: bool = typer.Option(False, "--all", help="Also decided and expired ones."),
    state: list[str] = typer.Option(
        [], "--state", help="Only these states (comma separated, or repeated); default pending."
    ),
    output: str = output_option(),
    watch: bool = WATCH,
    watch_timeout: float | None = WATCH_TIMEOUT,
    watch_interval: float = WATCH_INTERVAL,
) -> None:
    """Tool calls waiting for a decision (``-o wide``: with arguments and decisions;
    ``-w``: then each approval again as it is requested, decided or expires)."""
    from corral.cli.output import print_list
    from corral.cli.tasks_cmd import choices
    from corral.cli.views import APPROVAL
    from corral.core.runs import ApprovalState

    states: list[str] | None = choices(state, [s.value for s in ApprovalState], "state")
    if not states:
        states = None if all_states else [ApprovalState.PENDING.value]

    async def go() -> list[ApprovalOut]:
        from corral.cli.connect import open_backend

        async with open_backend() as backend:
            return await backend.list_approvals(namespace, states)

    if not watch:
        print_list(APPROVAL, run_async(go()), output, namespace=namespace)
        return

    async def watching() -> None:
        from corral.cli.connect import open_backend
        from corral.cli.watch import watch_list

        async with open_backend() as backend:

            async def listing() -> list[ApprovalOut]:
                return await backend.list_approvals(namespace, states)

            async def ended(gone: list[ApprovalOut]) -> list[ApprovalOut]:
                # decided or expired: read as they are now, by their runs
                ids = {a.id for a in gone}
                found: list[ApprovalOut] = []
                for run_id in dict.fromkeys(a.run_id for a in gone):
                    found += [
                        a
                        for a in await backend.list_approvals(namespace, None, run_id=run_id)
                        if a.id in ids
                    ]
                return found

            await watch_list(
                APPROVAL,
                listing,
                lambda a: a.id,
                lambda a: (a.state, a.decided_by),
                output,
                namespace=namespace,
                ended=ended,
                interval=watch_interval,
                seconds=watch_timeout,
            )

    run_async(watching())


@approvals_app.command("approve")
def approvals_approve(
    approval_id: str = typer.Argument(...),
    reason: str | None = typer.Option(None, "--reason"),
    output: str | None = output_option(None, CHANGE_FORMATS),
) -> None:
    """Approve a call: the run resumes on a worker and the call runs once."""
    _decide(approval_id, True, reason, output)


@approvals_app.command("reject")
def approvals_reject(
    approval_id: str = typer.Argument(...),
    reason: str | None = typer.Option(None, "--reason", help="Told to the model."),
    output: str | None = output_option(None, CHANGE_FORMATS),
) -> None:
    """Reject a call: the model is told, and the run goes on without it."""
    _decide(approval_id, False, reason, output)


def _decide(approval_id: str, approved: bool, reason: str | None, output: str | None) -> None:
    from rich.console import Console

    from corral.cli.approval_hints import print_pickup

    async def go() -> tuple[ApprovalOut, Task | None]:
        from corral.cli.approval_hints import picked_up
        from corral.cli.connect import open_backend

        async with open_backend() as backend:
            decided = await backend.decide(approval_id, approved, reason)
            return decided, await picked_up(backend, decided.run_id)

    approval, run = run_async(go())
    if output is not None:
        from corral.cli.output import print_change
        from corral.cli.views import APPROVAL

        print_change(APPROVAL, [approval], output)
    else:
        typer.echo(f"{approval.id} {approval.state.value} (run {approval.run_id})")
    print_pickup(Console(stderr=True, highlight=False), approval.run_id, run)
