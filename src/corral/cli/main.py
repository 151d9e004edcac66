"""The ``corral`` command.

The CLI is a thin front door: it parses arguments, calls the library and
renders what comes back. Errors are one clear line on stderr (a traceback only
with ``--debug``) and map to exit codes:

    0  succeeded
    1  failed (the run failed, a model or tool could not be reached)
    2  bad input (invalid YAML, unknown reference, unknown name)
    3  the run waits for approval
"""

from __future__ import annotations

import sys
from collections.abc import Coroutine
from typing import Any, NoReturn, TypeVar

import typer

from corral import __version__

T = TypeVar("T")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_WAITING_APPROVAL = 3

app = typer.Typer(
    name="corral",
    help="Run LLM agents as durable, governed workloads.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: typer's rich help pulls in rich's markdown renderer (~0.2 s per start).
    rich_markup_mode=None,
)


class _State:
    debug = False


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
) -> None:
    _State.debug = debug


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    """Print one error line and exit (inside a command: click turns the Exit into the code)."""
    _print_error(message)
    raise typer.Exit(code)


def _print_error(message: str) -> None:
    from rich.console import Console

    Console(stderr=True, highlight=False, soft_wrap=True).print(
        f"[bold red]error:[/] {message}", markup=True
    )


def session_id_option(value: str | None) -> str | None:
    """A typer callback: the session id, checked by the API's rule (exit 2 otherwise)."""
    from corral.core.sessions import InvalidSessionIdError, check_session_id

    if value is None:
        return None
    try:
        return check_session_id(value)
    except InvalidSessionIdError as exc:
        fail(exc.message, EXIT_BAD_INPUT)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine for a command, turning Corral errors into one line and an exit code."""
    from corral.core.errors import CorralError, UserError
    from corral.core.redaction import install_log_redaction

    install_log_redaction()  # every command that runs agents logs through here
    try:
        import asyncio  # here, not at the top: `corral --help` never needs it

        return asyncio.run(coro)
    except CorralError as exc:
        if _State.debug:
            raise
        fail(_escape(exc.message), EXIT_BAD_INPUT if isinstance(exc, UserError) else EXIT_FAILED)
    except KeyboardInterrupt:
        fail("interrupted", 130)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


@app.command()
def version() -> None:
    """Print Corral's version."""
    typer.echo(f"corral {__version__}")


def _register_commands() -> None:
    # Each command group lives in its own module and adds itself to `app`.
    from corral.cli import resources_cmd, run_cmd, serve_cmd, tasks_cmd, token_cmd

    resources_cmd.register(app)
    run_cmd.register(app)
    tasks_cmd.register(app)
    serve_cmd.register(app)
    token_cmd.register(app)


#: how much of an unexpected exception's text the one error line keeps
_INTERNAL_TEXT_CHARS = 300


def main() -> None:
    """Console-script entry point: one line and exit 1 for an unexpected error (a traceback
    only with ``--debug``)."""
    _register_commands()
    for index, argument in enumerate(sys.argv[1:], 1):
        # bytes that are not UTF-8 arrive as lone surrogates, which no store or API takes
        if any("\udc80" <= char <= "\udcff" for char in argument):
            _print_error(f"argument {index} is not UTF-8 text")
            sys.exit(EXIT_BAD_INPUT)
    try:
        app()
    except SystemExit:
        raise
    except Exception as exc:
        if _State.debug or "--debug" in sys.argv:
            raise
        # Out here click no longer turns typer.Exit into an exit code: exit directly.
        text = " ".join(str(exc).split())
        if len(text) > _INTERNAL_TEXT_CHARS:
            text = text[:_INTERNAL_TEXT_CHARS] + "…"
        _print_error(
            _escape(f"internal error: {type(exc).__name__}: {text} (run with --debug for details)")
        )
        sys.exit(EXIT_FAILED)
