"""``corral run`` and ``corral prompt-object`` (``corral chat`` is :mod:`corral.cli.chat_cmd`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from corral.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    escape,
    exit_code,
    fail,
    namespace_option,
    run_async,
    session_id_option,
)
from corral.cli.interrupts import (
    Interrupted,
    exit_interrupted,
    interruptible,
    say_interrupted,
    spinner,
)
from corral.cli.tasks_cmd import LABEL, labels_option

if TYPE_CHECKING:
    from corral.api import ApprovalOut, TaskDetail
    from corral.cli.backend import Backend

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
    wait: bool = typer.Option(
        False,
        "--wait",
        help="When the run stops for approval, wait for the decision and follow it on "
        "until it finishes.",
    ),
    label: list[str] = LABEL,
) -> None:
    """Run an agent on a prompt, streaming what it does.

    The run is durable: it is queued, executed here (or by a worker that claims it
    first) and journaled. Exit code 0 succeeded, 1 failed, 2 bad input, 3 waiting
    for approval, 130 interrupted (Ctrl-C: the run stays stored, released for any
    worker to resume).
    """
    if output not in ("text", "json"):
        fail(f"unknown output format {output!r} (use text or json)", EXIT_BAD_INPUT)
    if len(args) > 2 or (len(args) == 1 and not file):
        fail('usage: corral run AGENT "PROMPT"  or  corral run -f FILE "PROMPT"', EXIT_BAD_INPUT)
    agent = args[0] if len(args) == 2 else None
    prompt = args[-1]
    labels = labels_option(label)
    try:
        record = run_async(
            _run(
                agent,
                prompt,
                file,
                namespace,
                output == "json",
                None,
                session=session,
                wait=wait,
                labels=labels,
            )
        )
    except Interrupted:
        exit_interrupted()
    raise typer.Exit(exit_code(record.state))


def prompt_object(
    agent: str = typer.Argument(..., help="The agent to ask."),
    prompt: str = typer.Argument(..., help="The prompt."),
    schema: Path | None = typer.Option(
        None, "--schema", help="A JSON Schema file; defaults to the agent's output_schema."
    ),
    namespace: str = NAMESPACE,
    label: list[str] = LABEL,
) -> None:
    """Ask an agent for JSON that validates against a schema; print only the JSON on
    stdout (progress and retries go to stderr). Without ``--schema`` the agent must
    have an ``output_schema`` (exit 2 otherwise)."""
    schema_doc: dict[str, Any] | None = None
    if schema is not None:
        schema_doc = _read_schema(schema)
    labels = labels_option(label)
    try:
        record = run_async(
            _run(agent, prompt, [], namespace, True, schema_doc, structured=True, labels=labels)
        )
    except Interrupted:
        exit_interrupted()
    from corral.core.runs import RunState  # here, not at the top: `corral --help` never needs it

    if record.state is RunState.SUCCEEDED:
        typer.echo(json.dumps(record.output, indent=2, ensure_ascii=False))
    elif record.error:
        fail(str(record.error.get("message", record.error)), EXIT_FAILED)
    raise typer.Exit(exit_code(record.state))


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
    wait: bool = False,
    labels: dict[str, str] | None = None,
) -> TaskDetail:
    """Apply ``files``, run the agent and render the run; ``Interrupted`` (said why on
    stderr) when Ctrl-C stopped it. ``structured`` (``prompt-object``): progress on
    stderr only, the answer left to the caller; an agent without an output schema
    when ``schema`` is ``None`` is exit 2."""
    from rich.console import Console

    from corral.cli.approval_hints import print_approval_hint
    from corral.cli.backend import RunControl
    from corral.cli.connect import open_backend
    from corral.cli.events_view import EventPrinter
    from corral.cli.render import body_json
    from corral.cli.resources_cmd import Applied
    from corral.core.runs import RunState

    err = Console(stderr=True, highlight=False)
    out = Console(highlight=False, soft_wrap=True)
    control = RunControl()
    async with open_backend() as backend, interruptible(control, err):

        async def paused(task: TaskDetail) -> None:
            if printer is not None:
                printer.finish(task, output=False)
            approvals = await backend.list_approvals(task.namespace, ["pending"], run_id=task.id)
            print_approval_hint(err, task, approvals, waits=True)

        if wait:
            control.on_pause = paused
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
        if structured and schema is None:
            await _check_output_schema(backend, namespace, agent)
        printer = None if quiet else EventPrinter(out, err)
        if structured:  # progress and retries on stderr; stdout is the JSON alone
            printer = EventPrinter(out, err, show_text=False)
        record = await backend.run(
            agent,
            prompt,
            namespace=namespace,
            session=session,
            output_schema=schema,
            show=printer,
            loading=spinner(err),
            control=control,
            labels=labels,
        )
        waiting: list[ApprovalOut] = []
        if record.state is RunState.WAITING_APPROVAL and not control.stop.is_set():
            waiting = await backend.list_approvals(record.namespace, ["pending"], run_id=record.id)
    if control.stop.is_set():
        say_interrupted(err, record)
        raise Interrupted
    if printer is not None:
        printer.finish(record, output=not structured)
    elif not structured:
        out.print(body_json(record), markup=False)
    print_approval_hint(err, record, waiting)
    return record


async def _check_output_schema(backend: Backend, namespace: str, agent: str) -> None:
    """Exit 2 when ``agent`` has no output schema (``prompt-object`` without ``--schema``
    could only get text); an unknown agent is left to the run to report."""
    found = await backend.get_resource(namespace, "Agent", agent)
    if found is not None and getattr(found.spec, "output_schema", None) is None:
        fail(
            f"agent {escape(agent)!r} has no output_schema: give prompt-object a JSON Schema "
            "with --schema FILE, or set spec.output_schema on the agent",
            EXIT_BAD_INPUT,
        )


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
