"""``corral worker --metrics-port``: a standalone worker's own Prometheus endpoint.

The API server counts only the runs its embedded workers execute; a
``corral worker`` process on another machine reports its runs here instead:
``GET /metrics`` (the same families as the server's, less the HTTP ones, which
stay at zero) and ``GET /healthz`` (also at ``/readyz``), which answers 503 with
the reason while the worker cannot claim runs, as the server's ``/readyz`` does.
The store's figures (runs by state, queue depth) are the whole deployment's,
read at scrape time. No token: like the server's ``/metrics``, no label carries
a name.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.core.errors import UserError
from corral.runtime.health import WorkerHealth
from corral.server.metrics import CONTENT_TYPE_LATEST, Metrics
from corral.store.base import Store


def metrics_app(metrics: Metrics, store: Store, health: WorkerHealth) -> Starlette:
    """The routes of a worker's metrics endpoint."""

    async def scrape(request: Request) -> Response:
        return Response(await metrics.render(store), media_type=CONTENT_TYPE_LATEST)

    async def healthz(request: Request) -> Response:
        problem = health.problem()
        if problem is None:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "not_ready", "detail": problem}, status_code=503)

    return Starlette(
        routes=[
            Route("/metrics", scrape),
            Route("/healthz", healthz),
            Route("/readyz", healthz),
        ]
    )


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; ``UserError`` saying why not."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise UserError(f"cannot serve metrics on {host}:{port}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(64)
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
    return sock


class _QuietServer(uvicorn.Server):
    """uvicorn's server without its signal handlers: the worker handles SIGTERM itself."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_metrics(app: Starlette, sock: socket.socket, stop: anyio.Event) -> None:
    """Serve ``app`` on ``sock`` until ``stop`` is set."""
    config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
    server = _QuietServer(config)
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve, [sock])
        await stop.wait()
        server.should_exit = True
