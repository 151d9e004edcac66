"""``corral serve``: the HTTP API, with embedded workers by default."""

from __future__ import annotations

import typer

from corral.cli.common import run_async


def register(app: typer.Typer) -> None:
    app.command(name="serve")(serve)


def serve(
    host: str | None = typer.Option(
        None, "--host", help="Interface to listen on (default CORRAL_API_HOST or 127.0.0.1)."
    ),
    port: int | None = typer.Option(
        None, "--port", min=0, max=65535, help="Port (default CORRAL_API_PORT or 8080)."
    ),
    workers: int = typer.Option(
        8,
        "--workers",
        min=0,
        help="Runs the embedded worker executes at once; 0 serves the API only "
        "(standalone `corral worker` processes execute the runs).",
    ),
    lease_seconds: float = typer.Option(30.0, "--lease-seconds", min=1.0),
    grace_seconds: float = typer.Option(
        30.0, "--grace-seconds", min=0.0, help="On SIGTERM, how long in-flight runs may finish."
    ),
    poll_seconds: float = typer.Option(
        0.5, "--poll-seconds", min=0.01, help="How often the worker looks for runs."
    ),
) -> None:
    """Serve the HTTP API (/v1, /openapi.json, /metrics) until SIGTERM or Ctrl-C.

    The first start on a store without tokens creates an admin token for namespace
    'default', prints it once and writes it to $CORRAL_HOME/admin.token (mode 0600).
    """
    import logging

    from corral.cli.connect import require_local
    from corral.runtime.process import exit_past_leftover_threads

    require_local("serve")

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    async def go() -> None:
        from corral.core.settings import Settings
        from corral.runtime.heap import freeze_startup_heap
        from corral.server.serve import serve as serve_api

        settings = Settings.from_env()
        await serve_api(
            settings,
            host=host or settings.api_host,
            port=settings.api_port if port is None else port,
            workers=workers,
            worker_options={
                "lease_seconds": lease_seconds,
                "grace_seconds": grace_seconds,
                "poll_seconds": poll_seconds,
            },
            graceful_seconds=grace_seconds + 30.0,
            on_server=lambda _: freeze_startup_heap(),  # built, about to listen
        )

    run_async(go())
    exit_past_leftover_threads()
