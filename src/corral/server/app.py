"""The ASGI application of ``corral serve``: routes, auth, limits, problems, metrics, workers.

The server holds no business logic: each route parses and authorizes the
request, calls the library (``runtime/operations.py``, the store, the follower)
and renders the answer. With ``workers > 0`` the app's lifespan also runs an
embedded :class:`~corral.runtime.worker.Worker` executing up to that many runs
at once, sharing the app's bus (a submit over HTTP wakes it at once) and
reporting its runs' events to the metrics.

Shutdown: ``context.begin_shutdown()`` comes first (from :mod:`corral.server.serve`
when a signal arrives): event streams end, prompt requests answer 202, readiness
turns 503 and the worker stops claiming and drains - in-flight runs get its
grace period to finish, then are released for another worker. The lifespan
returns once the worker has drained.

Readiness also fails while the embedded worker cannot claim runs (its store
errors are retried with backoff) and after its loop ended on an unexpected
error, which is logged and never ends the server silently.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from corral import __version__
from corral.bus.base import Bus
from corral.core.settings import Settings
from corral.runtime.agent_tokens import AgentTokenIssuer, AgentTokenSigner
from corral.runtime.fanout import FanOut, FanOutBus
from corral.runtime.worker import Worker
from corral.server import (
    problems,
    routes_agents,
    routes_approvals,
    routes_capabilities,
    routes_links,
    routes_memory,
    routes_ops,
    routes_resources,
    routes_sessions,
    routes_systems,
    routes_tasks,
    routes_tokens,
)
from corral.server.context import ServerContext
from corral.server.limits import BodyLimitMiddleware, RateLimiter
from corral.server.metrics import HttpMetricsMiddleware, Metrics
from corral.server.verifier import TokenVerifier
from corral.store.base import Store

_DESCRIPTION = """The HTTP API of Corral, a self-hosted runtime for LLM agents.

Every `/v1` operation needs `Authorization: Bearer <token>`. A token belongs to one
namespace and has a role: **viewer** reads, **operator** also submits, cancels,
decides approvals, prompts and deletes sessions, **admin** also applies and deletes
resources and manages tokens. Objects of other namespaces answer 404.

Errors are `application/problem+json` with a stable `code`; lists answer
`{items, next_cursor}` (pass `next_cursor` back as `cursor`)."""


def create_app(
    store: Store,
    bus: Bus,
    settings: Settings,
    *,
    workers: int = 0,
    worker_options: dict[str, Any] | None = None,
    poll_seconds: float = 1.0,
    keepalive_seconds: float = 15.0,
) -> FastAPI:
    """The API over ``store`` and ``bus``; with ``workers > 0`` an embedded worker too.

    ``worker_options`` go to :class:`Worker` (``lease_seconds``, ``grace_seconds``,
    ``poll_seconds``). The caller owns ``store`` and ``bus`` and closes them after
    the app has shut down.
    """
    metrics = Metrics()
    fan_out = FanOut(store)
    # The embedded worker announces through this bus, so the fan-out knows how fresh
    # a shared read of a run's events must be.
    bus = FanOutBus(bus, fan_out)
    context = ServerContext(
        store=store,
        agent_tokens=AgentTokenSigner.from_settings(settings),
        public_url=settings.public_url,
        bus=bus,
        fan_out=fan_out,
        settings=settings,
        verifier=TokenVerifier(store),
        limiter=RateLimiter(settings.api_rate_limit, settings.api_rate_burst),
        auth_failures=RateLimiter(settings.api_auth_failure_rate, settings.api_auth_failure_burst),
        metrics=metrics,
        poll_seconds=poll_seconds,
        keepalive_seconds=keepalive_seconds,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        context.stopping = anyio.Event()
        async with anyio.create_task_group() as group:
            if workers > 0:
                worker = Worker(
                    store,
                    settings,
                    concurrency=workers,
                    bus=bus,
                    observer=metrics.observe,
                    on_error=metrics.count_worker_error,
                    # the URL is known once the server listens, after the worker started
                    tokens=AgentTokenIssuer(context.agent_tokens, lambda: context.public_url),
                    **(worker_options or {}),
                )
                context.worker_health = worker.health
                group.start_soon(_serve_worker, worker, context.stopping)
            yield
            # Normally begun already, when the server began to shut down.
            context.begin_shutdown()

    app = FastAPI(
        title="Corral",
        version=__version__,
        description=_DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        # operationId = the route function's name (submit_task, list_tasks, ...): what
        # client generators turn into method names.
        generate_unique_id_function=lambda route: route.name,
    )
    app.state.corral = context
    problems.install(app)
    for module in (
        *_a2a_routes(),
        routes_resources,
        routes_tasks,
        routes_systems,
        routes_approvals,
        routes_sessions,
        routes_memory,
        routes_agents,
        routes_tokens,
        routes_capabilities,
        routes_links,
        routes_ops,
    ):
        app.include_router(module.router)
    # The last added is the outermost: metrics see every answer, 413s included.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.api_max_body_bytes)
    app.add_middleware(HttpMetricsMiddleware, metrics=metrics)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _a2a_routes() -> list[Any]:
    """The A2A routes, when the ``a2a`` extra (``a2a-sdk``) is installed; else a 501 for each."""
    try:
        from corral.server import routes_a2a
    except ImportError as exc:
        if not (exc.name or "").startswith(("a2a", "google", "sse_starlette")):
            raise
        from corral.server import routes_a2a_missing

        return [routes_a2a_missing]
    return [routes_a2a]


def _not_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A parameter's schema without the ``null`` FastAPI adds for an optional one.

    HTTP has no null parameter: an optional one is left out. Published as nullable,
    clients would send ``?cursor=null`` or ``Last-Event-ID: null``, which are refused.
    """
    variants = schema.get("anyOf")
    if not isinstance(variants, list):
        return schema
    kept = [v for v in variants if v != {"type": "null"}]
    if len(kept) != 1:
        return schema
    rest = {k: v for k, v in schema.items() if k != "anyOf"}
    return {**kept[0], **rest}


async def _serve_worker(worker: Worker, stop: anyio.Event) -> None:
    """The embedded worker until ``stop``; if its loop crashes, the API goes on serving
    (the crash is logged and readiness fails: see ``Worker.health``)."""
    try:
        await worker.serve(stop)
    except Exception:  # noqa: BLE001 - recorded by worker.health.crash, which logged it
        return


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, with error bodies declared as ``application/problem+json``,
    optional parameters not nullable and the apply body's document schemas."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            for parameter in operation.get("parameters", []):
                parameter["schema"] = _not_null(parameter["schema"])
            for response in operation.get("responses", {}).values():
                content = response.get("content", {})
                ref = content.get("application/json", {}).get("schema", {}).get("$ref", "")
                if ref.endswith("/Problem"):
                    content[problems.PROBLEM_JSON] = content.pop("application/json")
    components = schema.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    for name, definition in routes_resources.DOCUMENT_COMPONENTS.items():
        # The specs FastAPI published for the responses are the same models in the same
        # (validation) mode (Spec's json_schema_mode_override): the first one stays.
        components.setdefault(name, definition)
    app.openapi_schema = schema
    return schema
