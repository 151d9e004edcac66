"""``corral approvals list|approve|reject``: tool calls that wait for a human."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from corral.cli.common import NAMESPACE, run_async
from corral.cli.output import CHANGE_FORMATS, output_option

if TYPE_CHECKING:
    from corral.api import ApprovalOut, Task

approvals_app = typer.Typer(help="Decide tool calls that wait for a human.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(approvals_app, name="approvals")


@approvals_app.command("list")
def approvals_list(
    namespace: str = NAMESPACE,
    all_states: bool = typer.Option(False, "--all", help="Also decided and expired ones."),
    output: str = output_option(),
) -> None:
    """Tool calls waiting for a decision (``-o wide``: with arguments and decisions)."""
    from corral.cli.output import print_list
    from corral.cli.views import APPROVAL

    async def go() -> list[ApprovalOut]:
        from corral.cli.connect import open_backend

        async with open_backend() as backend:
            return await backend.list_approvals(namespace, None if all_states else ["pending"])

    print_list(APPROVAL, run_async(go()), output, namespace=namespace)


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
