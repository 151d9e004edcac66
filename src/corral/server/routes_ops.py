"""Operations endpoints, outside /v1 and without a token: health, readiness, metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from corral.api import Health, Readiness
from corral.server.context import context_of
from corral.server.metrics import CONTENT_TYPE_LATEST
from corral.store.base import StoreError

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health, summary="Liveness")
async def healthz() -> Health:
    """200 while the process serves requests."""
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    summary="Readiness",
    responses={
        503: {
            "model": Readiness,
            "description": "Shutting down, the store is unreachable, or the embedded worker "
            "cannot claim runs (`detail` says which).",
        }
    },
)
async def readyz(request: Request) -> JSONResponse:
    """200 when the store answers, the embedded worker (if any) can claim runs, and the
    server is not shutting down."""
    context = context_of(request)
    if context.stopping.is_set():
        return _readiness(503, "not_ready", "shutting down")
    problem = context.worker_health.problem() if context.worker_health is not None else None
    if problem is not None:
        return _readiness(503, "not_ready", problem)
    try:
        await context.store.get_run("run_readiness_probe")
    except StoreError:
        return _readiness(503, "not_ready", "the store does not answer")
    return _readiness(200, "ready")


def _readiness(status: int, state: str, detail: str = "") -> JSONResponse:
    body = Readiness.model_validate({"status": state, "detail": detail})
    return JSONResponse(body.model_dump(), status_code=status)


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}}}
    },
)
async def metrics(request: Request) -> Response:
    """Runs by state and queue depth (from the store), model latency, tokens, cost, tool
    calls and errors by code (runs of this process's workers), HTTP requests."""
    context = context_of(request)
    body = await context.metrics.render(context.store)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
