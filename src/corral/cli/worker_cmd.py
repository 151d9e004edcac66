"""``corral worker`` and ``corral gc``: the commands that keep a deployment going.

Both work on the store itself, so they have no remote mode.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import typer

from corral.cli.common import EXIT_BAD_INPUT, fail, run_async

if TYPE_CHECKING:
    import anyio

    from corral.runtime.worker import Worker
    from corral.store.base import Store


def register(app: typer.Typer) -> None:
    app.command(name="worker")(worker)
    app.command(name="gc")(gc)


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

    from corral.cli.connect import require_local
    from corral.runtime.process import WorkerOptions, exit_past_leftover_threads, run_worker

    require_local("worker")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    options = WorkerOptions(concurrency, lease_seconds, grace_seconds, poll_seconds)

    async def go() -> None:
        from corral.core.settings import Settings

        settings = Settings.from_env()
        if not metrics_port:
            await run_worker(settings, options)
            return
        from corral.server.metrics import Metrics
        from corral.server.worker_metrics import listen, metrics_app, serve_metrics

        sock = listen(metrics_host, metrics_port)  # before anything opens: a clear error
        metrics = Metrics()

        async def serve(store: Store, worker: Worker, drained: anyio.Event) -> None:
            # Served until the worker has drained, not only until the signal.
            logging.getLogger("corral").info(
                "metrics on http://%s:%d/metrics", metrics_host, sock.getsockname()[1]
            )
            await serve_metrics(metrics_app(metrics, store, worker.health), sock, drained)

        await run_worker(
            settings,
            options,
            observer=metrics.observe,
            on_error=metrics.count_worker_error,
            sidecar=serve,
        )

    run_async(go())
    exit_past_leftover_threads("exiting with a cancelled tool's thread still running")


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
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Say how many finished runs would be deleted; delete nothing."
    ),
) -> None:
    """Delete finished runs with their events and approvals (default: CORRAL_RUN_RETENTION_DAYS)."""
    from corral.cli.connect import require_local

    require_local("gc")

    async def go() -> int:
        from corral.cli.connect import open_cli_store

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
                finished_before=cutoff, keep_last=keep, namespace=namespace, dry_run=dry_run
            )

    count = run_async(go())
    if dry_run:
        where = f" in namespace {namespace!r}" if namespace else ""
        typer.echo(
            f"would delete {count} finished runs{where} with their events and approvals "
            "(dry run: nothing deleted)"
        )
    else:
        typer.echo(f"deleted {count} finished runs")
