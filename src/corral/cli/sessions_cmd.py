"""``corral sessions list|show|delete``: conversations that carry across runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from corral.cli.common import NAMESPACE, run_async, session_id_option
from corral.cli.output import output_option

if TYPE_CHECKING:
    from corral.api import SessionMessageOut, SessionOut

sessions_app = typer.Typer(help="Conversations that carry across runs.", no_args_is_help=True)

SESSION_ID = typer.Argument(..., help="The session's id.", callback=session_id_option)


def register(app: typer.Typer) -> None:
    app.add_typer(sessions_app, name="sessions")


@sessions_app.command("list")
def sessions_list(namespace: str = NAMESPACE, output: str = output_option()) -> None:
    """Sessions, most recently used first."""
    from corral.cli.output import print_list
    from corral.cli.views import SESSION

    async def go() -> list[SessionOut]:
        from corral.cli.connect import open_backend

        async with open_backend() as backend:
            return await backend.list_sessions(namespace)

    print_list(SESSION, run_async(go()), output, namespace=namespace)


@sessions_app.command("show")
def sessions_show(
    session_id: str = SESSION_ID,
    all_messages: bool = typer.Option(False, "--all", help="Include compacted messages."),
    namespace: str = NAMESPACE,
    output: str | None = output_option(None),
) -> None:
    """A session's messages: the conversation, or a table or documents with ``-o``."""

    async def go() -> list[SessionMessageOut]:
        from corral.cli.connect import open_backend

        async with open_backend() as backend:
            return await backend.session_messages(
                namespace, session_id, include_hidden=all_messages
            )

    messages = run_async(go())
    if output is not None:
        from corral.cli.output import print_list
        from corral.cli.views import session_messages

        print_list(session_messages(session_id), messages, output, namespace=namespace)
        return
    for m in messages:
        flags = " (compacted)" if m.hidden else " (summary)" if m.summary else ""
        typer.echo(f"[{m.message.role}{flags}] {m.message.content}")


@sessions_app.command("delete")
def sessions_delete(session_id: str = SESSION_ID, namespace: str = NAMESPACE) -> None:
    """Delete a session and its messages (refused while a run of it is unfinished)."""

    async def go() -> None:
        from corral.cli.connect import open_backend

        async with open_backend() as backend:
            await backend.delete_session(namespace, session_id)

    run_async(go())
    typer.echo(f"session/{session_id} deleted")
