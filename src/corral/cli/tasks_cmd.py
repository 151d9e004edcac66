"""Durable runs from the CLI: ``submit``, ``tasks``, ``logs``, ``approvals``, ``sessions``, ``worker``."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import typer

from corral.api import MAX_DELAY_SECONDS, MAX_PAGE_ITEMS, MAX_PRIORITY
from corral.cli.main import EXIT_BAD_INPUT, fail, run_async, session_id_option

if TYPE_CHECKING:
    from corral.core.runs import RunRecord

NAMESPACE = typer.Option("default", "-n", "--namespace", help="The namespace.")

tasks_app = typer.Typer(help="List, inspect and cancel tasks (durable runs).", no_args_is_help=True)
approvals_app = typer.Typer(help="Decide tool calls that wait for a human.", no_args_is_help=True)
sessions_app = typer.Typer(help="Conversations that carry across runs.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.command(name="submit")(submit)
    app.command(name="logs")(logs)
    app.command(name="worker")(worker)
    app.command(name="gc")(gc)
    app.add_typer(tasks_app, name="tasks")
    app.add_typer(approvals_app, name="approvals")
    app.add_typer(sessions_app, name="sessions")


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
    namespace: str = NAMESPACE,
) -> None:
    """Queue a run for a worker and print its task id."""
    record, created = run_async(
        submit_task(
            agent,
            prompt,
            namespace=namespace,
            session=session,
            idempotency_key=idempotency_key,
            priority=priority,
            delay=delay,
        )
    )
    if not created:
        typer.echo(f"(idempotency key seen before: task {record.id} is {record.state})", err=True)
    typer.echo(record.id)


async def submit_task(agent: str, prompt: str, **options: Any) -> tuple[RunRecord, bool]:
    from corral.cli.backend import open_backend

    async with open_backend() as backend:
        return await backend.submit(agent, prompt, **options)


# --------------------------------------------------------------------------- tasks


@tasks_app.command("list")
def tasks_list(
    namespace: str = NAMESPACE,
    agent: str | None = typer.Option(None, "--agent", help="Only this agent's tasks."),
    state: list[str] = typer.Option([], "--state", help="Only tasks in these states."),
    limit: int = typer.Option(50, "--limit", min=1, max=MAX_PAGE_ITEMS),
    output: str = typer.Option("table", "-o", "--output", help="table, or json."),
) -> None:
    """The newest tasks, newest first."""
    from rich.console import Console
    from rich.table import Table

    from corral.core.runs import RunState

    try:
        states = [RunState(s) for s in state] or None
    except ValueError:
        fail(f"unknown state; states are {', '.join(s.value for s in RunState)}", EXIT_BAD_INPUT)

    async def go() -> list[RunRecord]:
        from corral.cli.backend import open_backend

        async with open_backend() as backend:
            chosen = [s.value for s in states] if states else None
            return await backend.list_runs(namespace, agent, limit, chosen)

    records = run_async(go())
    if output == "json":
        from corral.cli.render import record_json

        typer.echo("[" + ",\n".join(record_json(r) for r in records) + "]")
        return
    table = Table(box=None, header_style="bold")
    for column in ("ID", "AGENT", "STATE", "ATTEMPTS", "STEPS", "AGE"):
        table.add_column(column, no_wrap=True)
    for r in records:
        table.add_row(r.id, r.agent, r.state.value, str(r.attempts), str(r.steps), _age(r))
    Console().print(table)


@tasks_app.command("get")
def tasks_get(task_id: str = typer.Argument(..., help="The task (run) id.")) -> None:
    """The task's full record as JSON."""
    from corral.cli.render import record_json

    typer.echo(record_json(run_async(_get_run(task_id))))


@tasks_app.command("cancel")
def tasks_cancel(task_id: str = typer.Argument(..., help="The task (run) id.")) -> None:
    """Cancel a queued, waiting or running task (a running one stops promptly)."""

    async def go() -> RunRecord:
        from corral.cli.backend import open_backend

        async with open_backend() as backend:
            return await backend.cancel(task_id)

    record = run_async(go())
    if record.state.finished:
        typer.echo(f"{record.id} {record.state.value}")
    else:
        typer.echo(f"{record.id} cancellation requested")


async def _get_run(run_id: str) -> RunRecord:
    from corral.cli.backend import open_backend
    from corral.core.errors import NotFoundError

    async with open_backend() as backend:
        record = await backend.get_run(run_id)
    if record is None:
        raise NotFoundError(f"task {run_id!r} not found")
    return record


def _age(record: RunRecord) -> str:
    from corral.cli.resources_cmd import _age as age

    return age(time.time() - record.created_at)


# --------------------------------------------------------------------------- logs


def logs(
    run_id: str = typer.Argument(..., help="The run (task) id."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Wait for new events."),
    output: str = typer.Option("text", "-o", "--output", help="text, or json (one per line)."),
) -> None:
    """Print a run's stored events; with --follow, until the run ends or waits for approval."""
    from rich.console import Console

    from corral.cli.render import EventPrinter

    printer = EventPrinter(Console(highlight=False, soft_wrap=True), Console(highlight=False))

    async def show(event: Any) -> None:
        if output == "json":
            from corral.core.messages import dump

            typer.echo(json.dumps(dump(event), ensure_ascii=False))
        else:
            printer.render(event)

    async def go() -> None:
        from corral.cli.backend import open_backend

        async with open_backend() as backend:
            if await backend.get_run(run_id) is None:
                from corral.core.errors import NotFoundError

                raise NotFoundError(f"run {run_id!r} not found")
            await backend.follow(run_id, show, follow=follow)

    run_async(go())


# --------------------------------------------------------------------------- approvals


@approvals_app.command("list")
def approvals_list(
    namespace: str = NAMESPACE,
    all_states: bool = typer.Option(False, "--all", help="Also decided and expired ones."),
    output: str = typer.Option("table", "-o", "--output", help="table, or json."),
) -> None:
    """Tool calls waiting for a decision."""
    from rich.console import Console
    from rich.table import Table

    async def go() -> list[Any]:
        from corral.cli.backend import open_backend

        async with open_backend() as backend:
            return await backend.list_approvals(namespace, None if all_states else ["pending"])

    approvals = run_async(go())
    if output == "json":
        from corral.core.messages import dump

        typer.echo(json.dumps([dump(a) for a in approvals], indent=2, ensure_ascii=False))
        return
    table = Table(box=None, header_style="bold")
    for column in ("ID", "RUN", "AGENT", "TOOL", "ARGUMENTS", "STATE", "REASON"):
        table.add_column(column, overflow="fold")
    for a in approvals:
        table.add_row(a.id, a.run_id, a.agent, a.tool, a.arguments, a.state.value, a.reason)
    Console().print(table)


@approvals_app.command("approve")
def approvals_approve(
    approval_id: str = typer.Argument(...),
    reason: str | None = typer.Option(None, "--reason"),
) -> None:
    """Approve a call: the run resumes on a worker and the call runs once."""
    _decide(approval_id, True, reason)


@approvals_app.command("reject")
def approvals_reject(
    approval_id: str = typer.Argument(...),
    reason: str | None = typer.Option(None, "--reason", help="Told to the model."),
) -> None:
    """Reject a call: the model is told, and the run goes on without it."""
    _decide(approval_id, False, reason)


def _decide(approval_id: str, approved: bool, reason: str | None) -> None:
    async def go() -> Any:
        from corral.cli.backend import open_backend

        async with open_backend() as backend:
            return await backend.decide(approval_id, approved, reason)

    approval = run_async(go())
    typer.echo(f"{approval.id} {approval.state.value} (run {approval.run_id})")


# --------------------------------------------------------------------------- sessions


@sessions_app.command("list")
def sessions_list(namespace: str = NAMESPACE) -> None:
    """Sessions, most recently used first."""

    async def go() -> list[Any]:
        from corral.cli.backend import open_backend

        async with open_backend() as backend:
            return await backend.list_sessions(namespace)

    for s in run_async(go()):
        typer.echo(f"{s.id}\t{s.agent}")


SESSION_ID = typer.Argument(..., help="The session's id.", callback=session_id_option)


@sessions_app.command("show")
def sessions_show(
    session_id: str = SESSION_ID,
    all_messages: bool = typer.Option(False, "--all", help="Include compacted messages."),
    namespace: str = NAMESPACE,
) -> None:
    """A session's messages."""

    async def go() -> list[Any]:
        from corral.cli.backend import open_backend

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
        from corral.cli.backend import open_backend

        async with open_backend() as backend:
            await backend.delete_session(namespace, session_id)

    run_async(go())
    typer.echo(f"session/{session_id} deleted")


# --------------------------------------------------------------------------- gc

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``90``, ``45s``, ``30m``, ``12h``, ``7d`` as seconds; ``ValueError`` otherwise."""
    text = text.strip().lower()
    unit = _UNITS.get(text[-1:], 0)
    number = float(text[:-1] if unit else text)
    if number < 0:
        raise ValueError("a duration cannot be negative")
    return number * (unit or 1)


def gc(
    older_than: str | None = typer.Option(
        None, "--older-than", help="Delete finished runs older than this (e.g. 7d, 12h)."
    ),
    keep: int | None = typer.Option(
        None, "--keep", min=0, help="Keep only the N most recent finished runs per namespace."
    ),
    namespace: str | None = typer.Option(None, "-n", "--namespace", help="Only this namespace."),
) -> None:
    """Delete finished runs with their events and approvals (default: CORRAL_RUN_RETENTION_DAYS)."""
    from corral.cli.backend import require_local

    require_local("gc")

    async def go() -> int:
        from corral.cli.resources_cmd import open_cli_store

        async with open_cli_store() as (store, settings):
            cutoff: float | None = None
            if older_than is not None:
                try:
                    cutoff = time.time() - parse_duration(older_than)
                except ValueError:
                    fail(f"--older-than: not a duration: {older_than!r}", EXIT_BAD_INPUT)
            elif settings.run_retention_days is not None:
                cutoff = time.time() - settings.run_retention_days * 86400
            if cutoff is None and keep is None:
                fail(
                    "say what to delete: --older-than, --keep, or set CORRAL_RUN_RETENTION_DAYS",
                    EXIT_BAD_INPUT,
                )
            return await store.prune_runs(
                finished_before=cutoff, keep_last=keep, namespace=namespace
            )

    typer.echo(f"deleted {run_async(go())} finished runs")


# --------------------------------------------------------------------------- worker


def worker(
    concurrency: int = typer.Option(8, "--concurrency", min=1, help="Runs at once."),
    lease_seconds: float = typer.Option(30.0, "--lease-seconds", min=1.0),
    grace_seconds: float = typer.Option(30.0, "--grace-seconds", min=0.0),
    poll_seconds: float | None = typer.Option(
        None,
        "--poll-seconds",
        min=0.01,
        help="How often the store is swept for runs (default 0.5; 5 with CORRAL_NATS_URL, "
        "where runs are dispatched as they are announced).",
    ),
    metrics_port: int = typer.Option(
        0,
        "--metrics-port",
        min=0,
        max=65535,
        help="Serve Prometheus metrics of this worker's runs on this port (0: off).",
    ),
    metrics_host: str = typer.Option(
        "127.0.0.1", "--metrics-host", help="Address of the metrics port (0.0.0.0: every one)."
    ),
) -> None:
    """Claim and execute queued runs until SIGTERM or Ctrl-C (then drain and release).

    With CORRAL_NATS_URL the worker takes runs from NATS JetStream as they are
    announced, and sweeps the store now and then for anything no message announced.
    """
    import logging

    from corral.cli.backend import require_local

    require_local("worker")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    async def go() -> None:
        import signal

        import anyio

        from corral.bus import open_settings_bus
        from corral.cli.resources_cmd import open_cli_store
        from corral.runtime.heap import freeze_startup_heap
        from corral.runtime.worker import Worker, default_owner

        stop, drained = anyio.Event(), anyio.Event()
        owner = default_owner()
        metrics = sock = None
        if metrics_port:
            from corral.server.metrics import Metrics
            from corral.server.worker_metrics import listen

            sock = listen(metrics_host, metrics_port)  # before anything opens: a clear error
            metrics = Metrics()
        async with (
            open_cli_store() as (store, settings),
            await open_settings_bus(settings, name=f"corral worker {owner}") as bus,
        ):
            default_poll = 5.0 if bus.dispatches else 0.5
            w = Worker(
                store,
                settings,
                concurrency=concurrency,
                lease_seconds=lease_seconds,
                grace_seconds=grace_seconds,
                poll_seconds=default_poll if poll_seconds is None else poll_seconds,
                owner=owner,
                bus=bus,
                observer=metrics.observe if metrics is not None else None,
                on_error=metrics.count_worker_error if metrics is not None else None,
            )
            via = "NATS" if bus.dispatches else "the store"
            logging.getLogger("corral").info("worker %s started (runs from %s)", w.owner, via)
            freeze_startup_heap()
            async with anyio.create_task_group() as group:
                if metrics is not None and sock is not None:
                    from corral.server.worker_metrics import metrics_app, serve_metrics

                    # Served until the worker has drained, not only until the signal.
                    group.start_soon(
                        serve_metrics, metrics_app(metrics, store, w.health), sock, drained
                    )
                    logging.getLogger("corral").info(
                        "metrics on http://%s:%d/metrics", metrics_host, sock.getsockname()[1]
                    )

                async def signals() -> None:
                    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
                        async for _ in received:
                            stop.set()
                            return

                group.start_soon(signals)
                await w.serve(stop)
                drained.set()
                group.cancel_scope.cancel()

    run_async(go())
    _exit_without_abandoned_threads()


def _exit_without_abandoned_threads() -> None:
    """Exit now even if a cancelled synchronous tool still holds a thread.

    A python tool's function cannot be interrupted: after shutdown cancelled it, its
    thread runs on until the function returns, and interpreter exit would wait for
    it. Its run was already released (and journaled), so nothing is lost by not
    waiting.
    """
    import logging
    import os
    import sys
    import threading

    if threading.active_count() > 1:
        logging.getLogger("corral").warning("exiting with a cancelled tool's thread still running")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
