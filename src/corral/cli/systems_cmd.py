"""``corral systems run NAME "input"``: run an AgentSystem and stream its whole tree.

Embedded mode executes the system run and its node runs in this process (a worker
on the same store may take some of them: those are followed); remote mode submits
it to the server and follows the system run and each node run it starts. Exit code
0 succeeded, 1 failed or cancelled, 2 bad input, 3 a node waits for approval.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from corral.cli.common import EXIT_BAD_INPUT, NAMESPACE, exit_code, fail, run_async
from corral.cli.interrupts import spinner

if TYPE_CHECKING:
    from corral.api import EventOut, TaskDetail

systems_app = typer.Typer(help="Agent systems: run a graph of agents.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(systems_app, name="systems")


@systems_app.command("run")
def run(
    name: str = typer.Argument(..., help="The AgentSystem."),
    prompt: str = typer.Argument(..., help="The system's input, to its entry agent."),
    namespace: str = NAMESPACE,
    output: str = typer.Option("text", "-o", "--output", help="text, or json: the run record."),
    timestamps: bool = typer.Option(False, "--timestamps", help="Prefix each line with its time."),
) -> None:
    """Run an AgentSystem on an input, streaming the events of the system run and of each
    node run (indented by branch), then the system's output."""
    from rich.console import Console

    from corral.cli.connect import open_backend
    from corral.cli.events_view import EventPrinter
    from corral.cli.render import body_json
    from corral.cli.systems_view import TreePrinter

    if output not in ("text", "json"):
        fail(f"unknown output format {output!r} (use text or json)", EXIT_BAD_INPUT)
    err = Console(stderr=True, highlight=False)
    out = Console(highlight=False, soft_wrap=True)
    quiet = output == "json"

    async def go() -> TaskDetail:
        async with open_backend() as backend:
            tree: TreePrinter | None = None

            async def show(event: EventOut) -> None:
                nonlocal tree
                if tree is None:  # the system run's run.start comes first
                    tree = TreePrinter(err, event.run_id, timestamps=timestamps)
                if not quiet:
                    tree.render(event)

            return await backend.run_system(
                name, prompt, namespace=namespace, show=show, loading=spinner(err)
            )

    record = run_async(go())
    if quiet:
        out.print(body_json(record), markup=False)
    else:
        EventPrinter(out, err).finish(record)
    raise typer.Exit(exit_code(record.state))
