"""``corral sessions list|show|delete``: conversations that carry across runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from corral.cli.common import NAMESPACE, run_async, session_id_option

if TYPE_CHECKING:
    from corral.api import SessionMessageOut, SessionOut

sessions_app = typer.Typer(help="Conversations that carry across runs.", no_args_is_help=True)

SESSION_ID = typer.Argument(..., help="The session's id.", callback=session_id_option)


def register(app: typer.Typer) -> None:
    app.add_typer(sessions_app, name="sessions")


@sessions_app.command("list")
def sessions_list(namespace: str = NAMESPACE) -> None:
    """Sessions, most recently used first."""

    async def go() -> list[SessionOut]:
        from corral.cli.connect import open_backend

        async with open_backend() as backend:
            return await backend.list_sessions(namespace)

    for s in run_async(go()):
        typer.echo(f"{s.id}\t{s.agent}")


@sessions_app.command("show")
def sessions_show(
    session_id: str = SESSION_ID,
    all_messages: bool = typer.Option(False, "--all", help="Include compacted messages."),
    namespace: str = NAMESPACE,
) -> None:
    """A session's messages."""

    async def go() -> list[SessionMessageOut]:
        from corral.cli.connect import open_backend

        async with open_backend() as backend:
            return await backend.session_messages(
                namespace, session_id, include_hidden=all_messages
            )

    for m in run_async(go()):
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
