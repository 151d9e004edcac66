"""Durable runs from the CLI: ``submit``, ``tasks list|get|describe|cancel`` and ``logs``."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import typer

from corral.cli.common import (
    EXIT_BAD_INPUT,
    NAMESPACE,
    escape,
    exit_code,
    fail,
    run_async,
    session_id_option,
)
from corral.cli.output import CHANGE_FORMATS, output_option
from corral.cli.resources_cmd import parsed_selector, selector_option
from corral.cli.tasks_tree import tasks_tree
from corral.cli.watch import WATCH, WATCH_INTERVAL, WATCH_TIMEOUT
from corral.core.limits import MAX_DELAY_SECONDS, MAX_PAGE_ITEMS, MAX_PRIORITY

if TYPE_CHECKING:
    from corral.api import ApprovalOut, EventOut, Task, TaskDetail

#: ``-l key=value`` of ``submit`` and ``run``: labels stored with the run
LABEL = typer.Option(
    [],
    "-l",
    "--label",
    help="A label for the run, key=value (repeat, or comma separate, for more).",
)

tasks_app = typer.Typer(help="List, inspect and cancel tasks (durable runs).", no_args_is_help=True)
tasks_app.command("tree")(tasks_tree)


def register(app: typer.Typer) -> None:
    app.command(name="submit")(submit)
    app.command(name="logs")(logs)
    app.add_typer(tasks_app, name="tasks")


# --------------------------------------------------------------------------- submit


def submit(
    agent: str = typer.Argument(..., help="The agent to run."),
    prompt: str = typer.Argument(..., help="The prompt."),
    session: str | None = typer.Option(
        None, "--session", help="Carry a conversation (an id).", callback=session_id_option
    ),
    idempotency_key: str | None = typer.Option(
        None, "--idempotency-key", help="Submitting the same key again returns the same task."
    ),
    priority: int = typer.Option(
        0, "--priority", min=-MAX_PRIORITY, max=MAX_PRIORITY, help="Higher runs first."
    ),
    delay: float = typer.Option(
        0.0, "--delay", min=0.0, max=MAX_DELAY_SECONDS, help="Seconds before the task may start."
    ),
    label: list[str] = LABEL,
    namespace: str = NAMESPACE,
    output: str | None = output_option(None, CHANGE_FORMATS),
) -> None:
    """Queue a run for a worker and print its task id (``-o json``: the task)."""
    labels = labels_option(label)
    task, created = run_async(
        submit_task(
            agent,
            prompt,
            namespace=namespace,
            session=session,
            idempotency_key=idempotency_key,
            priority=priority,
            delay=delay,
            labels=labels,
        )
    )
    if not created:
        typer.echo(f"(idempotency key seen before: task {task.id} is {task.state})", err=True)
    if output is not None:
        from corral.cli.output import print_change
        from corral.cli.views import TASK

        print_change(TASK, [task], output)
    else:
        typer.echo(task.id)


async def submit_task(agent: str, prompt: str, **options: Any) -> tuple[Task, bool]:
    from corral.cli.connect import open_backend

    async with open_backend() as backend:
        return await backend.submit(agent, prompt, **options)


# --------------------------------------------------------------------------- tasks


@tasks_app.command("list")
def tasks_list(
    namespace: str = NAMESPACE,
    agent: str | None = typer.Option(None, "--agent", help="Only this agent's tasks."),
    state: list[str] = typer.Option(
        [], "--state", help="Only tasks in these states (comma separated, or repeated)."
    ),
    selector: str | None = typer.Option(
        None,
        "-l",
        "--selector",
        help="Only tasks whose labels match: key=value, key!=value, key, !key; "
        "comma-separated, all must hold.",
        callback=selector_option,
        metavar="SELECTOR",
    ),
    limit: int = typer.Option(50, "--limit", min=1, max=MAX_PAGE_ITEMS),
    output: str = output_option(),
    watch: bool = WATCH,
    watch_timeout: float | None = WATCH_TIMEOUT,
    watch_interval: float = WATCH_INTERVAL,
) -> None:
    """The newest tasks, newest first (``-o wide``: with their session, tokens, labels and
    error; ``-w``: then each task again as it changes, until Ctrl-C)."""
    from corral.cli.output import print_list
    from corral.cli.views import TASK
    from corral.core.runs import RunState

    states = choices(state, [s.value for s in RunState], "state") or None
    chosen = parsed_selector(selector)

    async def go() -> list[Task]:
        from corral.cli.connect import open_backend

        async with open_backend() as backend:
            return await backend.list_runs(namespace, agent, limit, states, chosen)

    if not watch:
        print_list(TASK, run_async(go()), output, namespace=namespace)
        return

    async def watching() -> None:
        from corral.api import Task
        from corral.cli.connect import open_backend
        from corral.cli.watch import watch_list
        from corral.core.errors import NotFoundError

        async with open_backend() as backend:

            async def listing() -> list[Task]:
                return await backend.list_runs(namespace, agent, limit, states, chosen)

            async def ended(tasks: list[Task]) -> list[Task]:
                found: list[Task] = []
                for task in tasks:
                    with contextlib.suppress(NotFoundError):  # deleted meanwhile
                        detail = await backend.get_run(task.id)
                        found.append(Task.model_validate(detail.model_dump(exclude={"messages"})))
                return found

            await watch_list(
                TASK,
                listing,
                lambda t: t.id,
                _task_version,
                output,
                namespace=namespace,
                ended=ended,
                interval=watch_interval,
                seconds=watch_timeout,
            )

    run_async(watching())


def _task_version(task: Task) -> tuple[object, ...]:
    """What a watch of tasks reports a change of."""
    return (task.state, task.attempts, task.steps, task.cancel_requested)


def choices(values: list[str], allowed: Sequence[str], what: str) -> list[str]:
    """Repeated and comma separated ``values`` of an option, each one of ``allowed``;
    an unknown one is exit 2, the error echoing it and the values allowed."""
    found: list[str] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if part not in allowed:
                shown = escape(repr(part if len(part) <= 40 else part[:40] + "…"))
                fail(f"unknown {what} {shown} ({what}s are {', '.join(allowed)})", EXIT_BAD_INPUT)
            if part not in found:
                found.append(part)
    return found


def labels_option(pairs: list[str]) -> dict[str, str]:
    """``-l key=value`` options as labels (exit 2 naming what breaks the rule)."""
    from corral.core.labels import LabelError, parse_labels

    try:
        return parse_labels(pairs)
    except LabelError as exc:
        fail(escape(exc.message), EXIT_BAD_INPUT)


@tasks_app.command("get")
def tasks_get(
    task_id: str = typer.Argument(..., help="The task (run) id."),
    output: str = output_option(),
) -> None:
    """One task (``-o json``: its full record, with its conversation)."""
    from corral.cli.output import print_one
    from corral.cli.views import TASK

    print_one(TASK, run_async(_get_run(task_id)), output)


async def _get_run(task_id: str) -> TaskDetail:
    from corral.cli.connect import open_backend

    async with open_backend() as backend:
        return await backend.get_run(task_id)


@tasks_app.command("describe")
def tasks_describe(task_id: str = typer.Argument(..., help="The task (run) id.")) -> None:
    """Why a task is where it is: input, state, error, attempts, approvals, times, usage."""
    from corral.cli.describe import describe_task

    async def go() -> tuple[TaskDetail, list[ApprovalOut], list[Task]]:
        from corral.cli.connect import open_backend

        async with open_backend() as backend:
            task = await backend.get_run(task_id)
            approvals = await backend.list_approvals(task.namespace, None, run_id=task.id)
            return task, approvals, await backend.children(task.id)

    task, approvals, children = run_async(go())
    typer.echo(describe_task(task, approvals, children))


@tasks_app.command("cancel")
def tasks_cancel(
    task_id: str = typer.Argument(..., help="The task (run) id."),
    output: str | None = output_option(None, CHANGE_FORMATS),
) -> None:
    """Cancel a queued, waiting or running task (a running one stops promptly)."""

    async def go() -> Task:
        from corral.cli.connect import open_backend

        async with open_backend() as backend:
            return await backend.cancel(task_id)

    task = run_async(go())
    if output is not None:
        from corral.cli.output import print_change
        from corral.cli.views import TASK

        print_change(TASK, [task], output)
    elif task.state.finished:
        typer.echo(f"{task.id} {task.state.value}")
    else:
        typer.echo(f"{task.id} cancellation requested")


# --------------------------------------------------------------------------- logs


def logs(
    run_id: str = typer.Argument(..., help="The run (task) id."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Wait for new events."),
    timestamps: bool = typer.Option(
        False, "--timestamps", help="Prefix each line with its time (RFC 3339, UTC)."
    ),
    output: str = typer.Option("text", "-o", "--output", help="text, or json (one per line)."),
) -> None:
    """Print a run's stored events and a final line with its state; with --follow, until
    the run ends or waits for approval, and exit as `corral run` does (0 succeeded,
    1 failed or cancelled, 3 waits for approval)."""
    from rich.console import Console

    from corral.cli.events_view import EventPrinter
    from corral.cli.render import body_json

    if output not in ("text", "json"):
        fail(f"unknown output format {output!r} (use text or json)", EXIT_BAD_INPUT)
    printer = EventPrinter(
        Console(highlight=False, soft_wrap=True),
        Console(highlight=False, soft_wrap=True),
        timestamps=timestamps,
        header=True,
    )

    async def show(event: EventOut) -> None:
        if output == "json":
            typer.echo(body_json(event, indent=None))
        else:
            printer.render(event)

    async def go() -> tuple[TaskDetail, list[ApprovalOut]]:
        from corral.cli.connect import open_backend
        from corral.core.runs import RunState

        async with open_backend() as backend:
            task = await backend.get_run(run_id)
            if task.system is not None and task.branch_id is None and output == "text":
                # a system run: its node runs' events too, each under its agent
                from corral.cli.systems_view import TreePrinter, follow_tree

                tree = TreePrinter(printer.err, run_id, timestamps=timestamps)
                record = await follow_tree(backend.follow, run_id, tree, live=follow)
            else:
                record = await backend.follow(run_id, show, follow=follow)
            waiting: list[ApprovalOut] = []
            if output == "text" and record.state is RunState.WAITING_APPROVAL:
                waiting = await backend.list_approvals(
                    record.namespace, ["pending"], run_id=record.id
                )
            return record, waiting

    record, waiting = run_async(go())
    if output == "text":
        from corral.cli.approval_hints import print_approval_hint

        printer.finish(record)
        print_approval_hint(printer.err, record, waiting)
    if follow:
        raise typer.Exit(exit_code(record.state))
