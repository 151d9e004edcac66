"""``corral run``, ``corral chat`` and ``corral prompt-object``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from corral.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_WAITING_APPROVAL,
    fail,
    namespace_option,
    run_async,
    session_id_option,
)

if TYPE_CHECKING:
    from corral.api import TaskDetail
    from corral.core.runs import RunState

NAMESPACE = typer.Option(
    None,
    "-n",
    "--namespace",
    help="Namespace of the agent (default: the context's, else 'default').",
    callback=namespace_option,
    show_default=False,
)


def register(app: typer.Typer) -> None:
    app.command(name="run")(run)
    app.command(name="chat")(chat)
    app.command(name="prompt-object")(prompt_object)


def run(
    args: list[str] = typer.Argument(
        ..., metavar="[AGENT] PROMPT", help="The agent (optional with -f) and the prompt."
    ),
    file: list[Path] = typer.Option(
        [], "-f", "--file", help="Apply these YAML files or directories first."
    ),
    namespace: str = NAMESPACE,
    output: str = typer.Option("text", "-o", "--output", help="text, or json: the run record."),
    session: str | None = typer.Option(
        None,
        "--session",
        help="Carry the conversation of this session (created if new).",
        callback=session_id_option,
    ),
) -> None:
    """Run an agent on a prompt, streaming what it does.

    The run is durable: it is queued, executed here (or by a worker that claims it
    first) and journaled. Exit code 0 succeeded, 1 failed, 2 bad input, 3 waiting
    for approval.
    """
    if output not in ("text", "json"):
        fail(f"unknown output format {output!r} (use text or json)", EXIT_BAD_INPUT)
    if len(args) > 2 or (len(args) == 1 and not file):
        fail('usage: corral run AGENT "PROMPT"  or  corral run -f FILE "PROMPT"', EXIT_BAD_INPUT)
    agent = args[0] if len(args) == 2 else None
    prompt = args[-1]
    record = run_async(
        _run(agent, prompt, file, namespace, output == "json", None, session=session)
    )
    raise typer.Exit(_exit_code(record.state))


def prompt_object(
    agent: str = typer.Argument(..., help="The agent to ask."),
    prompt: str = typer.Argument(..., help="The prompt."),
    schema: Path | None = typer.Option(
        None, "--schema", help="A JSON Schema file; defaults to the agent's output_schema."
    ),
    namespace: str = NAMESPACE,
) -> None:
    """Ask an agent for JSON that validates against a schema; print only the JSON."""
    schema_doc: dict[str, Any] | None = None
    if schema is not None:
        schema_doc = _read_schema(schema)
    record = run_async(_run(agent, prompt, [], namespace, True, schema_doc, structured=True))
    from corral.core.runs import RunState  # here, not at the top: `corral --help` never needs it

    if record.state is RunState.SUCCEEDED:
        typer.echo(json.dumps(record.output, indent=2, ensure_ascii=False))
    elif record.error:
        fail(str(record.error.get("message", record.error)), EXIT_FAILED)
    raise typer.Exit(_exit_code(record.state))


def chat(
    agent: str = typer.Argument(..., help="The agent to chat with."),
    namespace: str = NAMESPACE,
    session: str | None = typer.Option(
        None,
        "--session",
        help="Continue this session (default: a new one).",
        callback=session_id_option,
    ),
) -> None:
    """Talk to an agent turn by turn in a session (Ctrl-D or /exit to leave)."""
    from rich.console import Console

    from corral.core.ids import new_id
    from corral.core.runs import RunState

    console = Console(stderr=True)
    session = session or new_id("chat")
    console.print(f"[dim]chatting with {agent} in session {session} — Ctrl-D or /exit to leave[/]")
    while True:
        try:
            line = console.input("[bold]you>[/] ")
        except EOFError:
            console.print()
            break
        if line.strip() in ("/exit", "/quit"):
            break
        if not line.strip():
            continue
        record = run_async(_run(agent, line, [], namespace, False, None, session=session))
        if record.state is RunState.WAITING_APPROVAL:
            console.print("[yellow]the run waits for approval; the chat cannot go on[/]")
            raise typer.Exit(EXIT_WAITING_APPROVAL)


async def _run(
    agent: str | None,
    prompt: str,
    files: list[Path],
    namespace: str,
    quiet: bool,
    schema: dict[str, Any] | None,
    *,
    structured: bool = False,
    session: str | None = None,
) -> TaskDetail:
    from rich.console import Console

    from corral.cli.connect import open_backend
    from corral.cli.render import EventPrinter, body_json
    from corral.cli.resources_cmd import Applied

    err = Console(stderr=True, highlight=False)
    out = Console(highlight=False, soft_wrap=True)
    async with open_backend() as backend:
        if files:
            applied = Applied(await backend.apply(files, namespace))
            for line in applied.lines:
                err.print(f"[dim]{line}[/]")
            if agent is None:
                agents = applied.agents
                if len(agents) != 1:
                    fail(
                        f"the files define {len(agents)} agents; name the one to run",
                        EXIT_BAD_INPUT,
                    )
                agent = agents[0]
        assert agent is not None
        printer = None if quiet else EventPrinter(out, err)
        record = await backend.run(
            agent,
            prompt,
            namespace=namespace,
            session=session,
            output_schema=schema,
            show=printer,
            loading=_spinner(err),
        )
    if printer is not None:
        printer.finish(record)
    elif not structured:
        out.print(body_json(record), markup=False)
    return record


def _spinner(console: Any) -> Any:
    @contextmanager
    def loading(name: str) -> Iterator[None]:
        if not console.is_terminal:
            yield
            return
        with console.status(f"loading model {name}…", spinner="dots"):
            yield

    return loading


def _read_schema(path: Path) -> dict[str, Any]:
    from corral.core.errors import CorralError
    from corral.core.settings import Settings

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        fail(f"cannot read schema {path}: {exc.strerror}", EXIT_BAD_INPUT)
    except UnicodeDecodeError:
        fail(f"cannot read schema {path}: not UTF-8 text", EXIT_BAD_INPUT)
    try:
        doc = Settings.from_env().document_limits.loads_json(text, str(path))
    except CorralError as exc:  # too complex, or a limit's variable is not a number
        fail(exc.message, EXIT_BAD_INPUT)
    except json.JSONDecodeError as exc:
        fail(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}", EXIT_BAD_INPUT)
    if not isinstance(doc, dict):
        fail(f"{path}: a JSON Schema must be an object", EXIT_BAD_INPUT)
    return doc


def _exit_code(state: RunState) -> int:
    from corral.core.runs import RunState

    exits = {RunState.SUCCEEDED: EXIT_OK, RunState.WAITING_APPROVAL: EXIT_WAITING_APPROVAL}
    return exits.get(state, EXIT_FAILED)
