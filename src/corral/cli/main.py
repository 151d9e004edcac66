"""The ``corral`` command: the typer app, its root options and the console-script entry point.

The CLI is a thin front door: it parses arguments, calls the library and
renders what comes back. Errors are one clear line on stderr (a traceback only
with ``--debug``) and map to the exit codes of :mod:`corral.cli.common`. Each
command group lives in a module of its own that :func:`main` registers.
"""

from __future__ import annotations

import functools
import os
import sys

import typer

from corral import __version__
from corral.cli.common import (
    COMPLETE_ENV,
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    Options,
    escape,
    print_error,
)

app = typer.Typer(
    name="corral",
    help="Run LLM agents as durable, governed workloads.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: typer's rich help pulls in rich's markdown renderer (~0.2 s per start).
    rich_markup_mode=None,
)


def _context_names(incomplete: str) -> list[str]:
    from corral.cli.context_cmd import context_names

    return context_names(incomplete)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"corral {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
    context: str | None = typer.Option(
        None,
        "--context",
        help="The context of the config file to use (default: its current-context).",
        metavar="NAME",
        autocompletion=_context_names,
    ),
    url: str | None = typer.Option(
        None, "--url", help="The Corral API (overrides CORRAL_URL and the context).", metavar="URL"
    ),
    token: str | None = typer.Option(
        None,
        "--token",
        help="The API token (overrides CORRAL_TOKEN and the context; visible to other "
        "users in the process list: prefer CORRAL_TOKEN or a context's token-file).",
        metavar="TOKEN",
    ),
    version: bool = typer.Option(
        False,
        "--version",
        help="Print Corral's version and exit.",
        callback=_print_version,
        is_eager=True,
    ),
) -> None:
    Options.reset()
    Options.debug = debug
    Options.context, Options.url, Options.token = context, url, token


@app.command()
def version() -> None:
    """Print Corral's version."""
    typer.echo(f"corral {__version__}")


@functools.cache
def registered_app() -> typer.Typer:
    """``app`` with every command group added (once): what :func:`main` runs, and what a
    test invokes in-process."""
    # Each command group lives in its own module and adds itself to `app`.
    from corral.cli import (
        approvals_cmd,
        chat_cmd,
        context_cmd,
        doctor_cmd,
        memory_cmd,
        resources_cmd,
        run_cmd,
        serve_cmd,
        sessions_cmd,
        systems_cmd,
        tasks_cmd,
        token_cmd,
        worker_cmd,
    )

    resources_cmd.register(app)
    run_cmd.register(app)
    chat_cmd.register(app)
    tasks_cmd.register(app)
    worker_cmd.register(app)
    approvals_cmd.register(app)
    sessions_cmd.register(app)
    serve_cmd.register(app)
    token_cmd.register(app)
    context_cmd.register(app)
    doctor_cmd.register(app)
    memory_cmd.register(app)
    systems_cmd.register(app)
    return app


#: how much of an unexpected exception's text the one error line keeps
_INTERNAL_TEXT_CHARS = 300


def main() -> None:
    """Console-script entry point: one line and exit 1 for an unexpected error (a traceback
    only with ``--debug``)."""
    registered_app()
    for index, argument in enumerate(sys.argv[1:], 1):
        # bytes that are not UTF-8 arrive as lone surrogates, which no store or API takes
        if any("\udc80" <= char <= "\udcff" for char in argument):
            print_error(f"argument {index} is not UTF-8 text")
            sys.exit(EXIT_BAD_INPUT)
    if COMPLETE_ENV in os.environ:
        from corral.cli.context_cmd import completion_init

        completion_init()  # the shells' classes, before typer answers the completion request
    try:
        # one name whichever way it started (console script, python -m corral), so the
        # completion scripts and the usage lines name the command the shell runs
        app(prog_name="corral", complete_var=COMPLETE_ENV)
    except SystemExit:
        raise
    except Exception as exc:
        if Options.debug or "--debug" in sys.argv:
            raise
        # Out here click no longer turns typer.Exit into an exit code: exit directly.
        text = " ".join(str(exc).split())
        if len(text) > _INTERNAL_TEXT_CHARS:
            text = text[:_INTERNAL_TEXT_CHARS] + "…"
        print_error(
            escape(f"internal error: {type(exc).__name__}: {text} (run with --debug for details)")
        )
        sys.exit(EXIT_FAILED)
