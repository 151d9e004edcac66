"""What every command shares: exit codes, the one-line error, running a command's coroutine.

The commands import these from here, never from :mod:`corral.cli.main` (which
imports the commands to register them). Exit codes:

    0  succeeded
    1  failed (the run failed, a model or tool could not be reached)
    2  bad input (invalid YAML, unknown reference, unknown name)
    3  the run waits for approval
"""

from __future__ import annotations

import re
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer

if TYPE_CHECKING:
    from corral.cli.contexts import Connection
    from corral.core.runs import RunState

T = TypeVar("T")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_WAITING_APPROVAL = 3


def exit_code(state: RunState) -> int:
    """The exit code of a command that saw a run through (``run``, ``logs -f``): 0
    succeeded, 3 waits for approval (``waiting_children``: a child run it waits for does),
    1 any other end (failed, cancelled, dead letter)."""
    from corral.core.runs import RunState

    exits = {
        RunState.SUCCEEDED: EXIT_OK,
        RunState.WAITING_APPROVAL: EXIT_WAITING_APPROVAL,
        RunState.WAITING_CHILDREN: EXIT_WAITING_APPROVAL,
    }
    return exits.get(state, EXIT_FAILED)


class Options:
    """The root command's options, set once per command by ``corral``'s callback."""

    debug = False
    #: ``--context``, ``--url``, ``--token``: None when not given
    context: str | None = None
    url: str | None = None
    token: str | None = None
    #: ``-n`` when given
    namespace: str | None = None
    #: where the command goes (:func:`connection`), resolved once
    connection: Connection | None = None

    @classmethod
    def reset(cls) -> None:
        cls.debug = False
        cls.context = cls.url = cls.token = cls.namespace = None
        cls.connection = None


def namespace_option(value: str | None) -> str:
    """A typer callback: ``-n`` when given, else the context's namespace, else ``default``."""
    if value is not None:
        Options.namespace = value
        Options.connection = None
        return value
    return connection().namespace


def connection() -> Connection:
    """Where this command goes (resolved once; a bad config file is exit 2)."""
    if Options.connection is None:
        from corral.cli.contexts import ConfigError, resolve

        try:
            Options.connection = resolve(
                Options.context, Options.url, Options.token, Options.namespace
            )
        except ConfigError as exc:
            fail(escape(exc.message), EXIT_BAD_INPUT)
    return Options.connection


#: the variable a completion script sets when it asks ``corral`` for completions
COMPLETE_ENV = "_CORRAL_COMPLETE"

#: ``-n``: the namespace a command works in
NAMESPACE = typer.Option(
    None,
    "-n",
    "--namespace",
    help="The namespace (default: the context's, else 'default').",
    callback=namespace_option,
    show_default=False,
)


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    """Print one error line and exit (inside a command: click turns the Exit into the code)."""
    print_error(message)
    raise typer.Exit(code)


def print_error(message: str) -> None:
    """``error: message`` on stderr (``message`` is rich markup: escape what it quotes)."""
    from rich.console import Console

    Console(stderr=True, highlight=False, soft_wrap=True).print(
        f"[bold red]error:[/] {message}", markup=True
    )


#: characters a terminal acts on rather than shows (C0 but newline and tab, DEL, C1): ESC
#: starts the sequences that move the cursor, clear the screen or retitle the window
TERMINAL_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with every terminal control character shown as U+FFFD: text a model, a
    tool or a remote wrote can neither move the cursor nor hide what came before it."""
    return TERMINAL_CONTROLS.sub("\ufffd", text)


def escape(text: str) -> str:
    """``text`` shown as it is inside rich markup, control characters made harmless
    (:func:`printable`)."""
    from rich.markup import escape as rich_escape

    return rich_escape(printable(text))


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
    from corral.core.log_lines import install_log_filters

    install_log_filters()  # every command that runs agents logs through here
    try:
        import asyncio  # here, not at the top: `corral --help` never needs it

        return asyncio.run(coro)
    except CorralError as exc:
        if Options.debug:
            raise
        fail(escape(exc.message), EXIT_BAD_INPUT if isinstance(exc, UserError) else EXIT_FAILED)
    except KeyboardInterrupt:
        fail("interrupted", 130)
