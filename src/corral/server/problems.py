"""Errors as RFC 9457 problem details (``application/problem+json``), each with a stable code.

Every error response of the API has the same shape, :class:`Problem`: ``code``
is stable and meant for programs, ``detail`` for people, ``errors`` names the
field paths of a rejected request (``body.agent``, ``query.limit``,
``spec.limits.max_steps``). The mapping from the library's exception tree
(:mod:`corral.core.errors`):

    ResourceError                 422 invalid_resource  (field path and line of each problem)
    DocumentTooComplexError       422 document_too_complex (the limit named in detail and reason)
    NotFoundError                 404 not_found
    ConflictError                 409 conflict
    other UserError               400 bad_input
    StoreError                    503 store_unavailable (Retry-After; details only in the log)
    other CorralError             500 its own code, its message
    anything else                 500 internal_error    (traceback only in the server log)

Request validation (FastAPI) is 422 ``invalid_request``; the HTTP layer's own
refusals (401, 403, 404 of an unknown route, 405, 413, 415, 429) come as
:class:`ProblemError` or Starlette's ``HTTPException`` and are rendered the same way.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse
from starlette.routing import Match

from corral.core.errors import (
    ConflictError,
    CorralError,
    DocumentTooComplexError,
    NotFoundError,
    ResourceError,
    UserError,
)
from corral.core.memory import MemoryBackendError
from corral.resources.loader import format_path
from corral.store.base import StoreError

log = logging.getLogger("corral.server")

PROBLEM_JSON = "application/problem+json"

#: Stable codes of the HTTP layer's own statuses.
STATUS_CODES: dict[int, str] = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "rate_limited",
    500: "internal_error",
    503: "unavailable",
}


class FieldProblem(BaseModel):
    """One reason a request was rejected, and where."""

    field: str | None = Field(
        None,
        description="Path of the offending field: 'body.agent', 'query.limit', "
        "'spec.limits.max_steps' (within a resource document).",
    )
    reason: str
    line: int | None = Field(None, description="Line in a YAML request body, when known.")
    document: int | None = Field(
        None, description="Index of the document in a JSON request body, when known."
    )


class Problem(BaseModel):
    """An error response (RFC 9457 problem details)."""

    type: str = Field(description="A URI naming the kind of problem: urn:corral:problem:<code>.")
    title: str = Field(description="The HTTP status phrase.")
    status: int
    code: str = Field(description="A stable, machine-readable error code.")
    detail: str = Field(description="What went wrong, for a person.")
    errors: list[FieldProblem] = Field(default_factory=list[FieldProblem])


class ProblemError(Exception):
    """Raised by the HTTP layer to answer with a problem (status, stable code, detail)."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        code: str | None = None,
        errors: Sequence[FieldProblem] = (),
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code or STATUS_CODES.get(status, "error")
        self.detail = detail
        self.errors = list(errors)
        self.headers = dict(headers or {})


#: ``Retry-After`` of a 503 ``store_unavailable``
STORE_RETRY_AFTER_SECONDS = 1


def problem_response(
    status: int,
    code: str,
    detail: str,
    errors: Sequence[FieldProblem] = (),
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """A ``application/problem+json`` response."""
    body = Problem(
        type=f"urn:corral:problem:{code}",
        title=_phrase(status),
        status=status,
        code=code,
        detail=detail,
        errors=list(errors),
    )
    return ProblemResponse(
        body.model_dump(mode="json"),
        status_code=status,
        headers=dict(headers or {}),
        media_type=PROBLEM_JSON,
    )


class ProblemResponse(JSONResponse):
    """A problem as JSON, ASCII-escaped: a reason quoting broken input (a lone
    surrogate) must still render, or the error would become a 500."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def resource_problems(exc: ResourceError) -> list[FieldProblem]:
    """The field paths and lines of a rejected resource document."""
    return [
        FieldProblem(field=location.field, reason=reason, line=location.line)
        for location, reason in exc.problems
    ]


def too_complex(exc: DocumentTooComplexError, *, document: int | None = None) -> ProblemError:
    """422 ``document_too_complex``: the limit and where parsing stopped (line, or the
    index of the document in a JSON body)."""
    line = exc.location.line if document is None else None
    return ProblemError(
        422,
        exc.message,
        code=exc.code,
        errors=[FieldProblem(field="body", reason=exc.reason, line=line, document=document)],
    )


def from_corral_error(exc: CorralError) -> JSONResponse:
    """The response for an error the library raised on purpose."""
    if isinstance(exc, DocumentTooComplexError):
        problem = too_complex(exc)
        return problem_response(422, problem.code, problem.detail, problem.errors)
    if isinstance(exc, ResourceError):
        detail = "the resource documents are invalid; nothing was applied"
        return problem_response(422, exc.code, detail, resource_problems(exc))
    if isinstance(exc, NotFoundError):
        # "not_found", or a finer code (memory_entry_not_found: the Memory is there)
        return problem_response(404, exc.code, exc.message)
    if isinstance(exc, ConflictError):
        return problem_response(409, "conflict", exc.message)
    if isinstance(exc, UserError):
        return problem_response(400, exc.code, exc.message)
    if isinstance(exc, MemoryBackendError):
        # a Memory's remote service failed: the gateway's trouble, not this server's
        retryable = exc.code in ("memory_backend_unavailable", "memory_backend_timeout")
        headers = {"Retry-After": str(STORE_RETRY_AFTER_SECONDS)} if retryable else None
        return problem_response(503 if retryable else 502, exc.code, exc.message, headers=headers)
    if isinstance(exc, StoreError):
        # Driver messages may name files and statements: they stay in the server log.
        log.error("store error: %s", exc.message)
        # Nothing was stored: a client may send the same request again (with an
        # idempotency key for a submit), after the store's passing trouble.
        return problem_response(
            503,
            "store_unavailable",
            "the store could not complete the operation; try again",
            headers={"Retry-After": str(STORE_RETRY_AFTER_SECONDS)},
        )
    log.error("%s: %s", type(exc).__name__, exc.message)
    return problem_response(500, exc.code, exc.message)


def _validation_problems(errors: Sequence[Any]) -> list[FieldProblem]:
    found: list[FieldProblem] = []
    for error in errors:
        loc = tuple(error.get("loc", ()))
        reason = str(error.get("msg", "invalid"))
        if error.get("type") == "missing":
            reason = "required field is missing"
        elif error.get("type") == "extra_forbidden":
            reason = "unknown field"
        elif error.get("type") == "value_error":  # our own validators: their words alone
            reason = str(error.get("ctx", {}).get("error", reason))
        found.append(FieldProblem(field=format_path(loc) or None, reason=reason))
    return found


#: The methods a 405's ``Allow`` may name.
HTTP_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path, sorted.

    FastAPI makes one route per operation, and the 405 Starlette raises names only
    the methods of the first route whose path matched (``/v1/tasks`` answered
    ``Allow: POST`` though it serves GET too). So each method is asked of every
    route, through ``matches``, the one interface every kind of route has.
    """
    return [
        method
        for method in HTTP_METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL
            for route in request.app.router.routes
        )
    ]


def install(app: FastAPI) -> None:
    """Render every error of ``app`` as a problem."""

    async def on_problem(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ProblemError)
        return problem_response(exc.status, exc.code, exc.detail, exc.errors, exc.headers)

    async def on_corral(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, CorralError)
        return from_corral_error(exc)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = _validation_problems(exc.errors())
        return problem_response(422, "invalid_request", "the request is invalid", errors)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = STATUS_CODES.get(exc.status_code, "error")
        detail = exc.detail if isinstance(exc.detail, str) else _phrase(exc.status_code)
        headers = dict(exc.headers or {})
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no route {request.url.path!r}"
        elif exc.status_code == 405:
            allowed = allowed_methods(request)
            headers["Allow"] = ", ".join(allowed)
            detail = f"{request.method} is not allowed here; allowed: {', '.join(allowed)}"
        return problem_response(exc.status_code, code, detail, headers=headers)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Starlette re-raises after this response, so the server logs the traceback;
        # the client learns nothing about the code.
        return problem_response(500, "internal_error", "internal error; see the server log")

    app.add_exception_handler(ProblemError, on_problem)
    app.add_exception_handler(CorralError, on_corral)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)


#: The error responses every /v1 operation documents in OpenAPI.
COMMON_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem, "description": "Malformed request (a body that does not parse)."},
    401: {"model": Problem, "description": "Missing or invalid token."},
    403: {"model": Problem, "description": "The token's role does not allow this."},
    422: {"model": Problem, "description": "Invalid request; `errors` names the fields."},
    413: {"model": Problem, "description": "The request body is too large."},
    429: {"model": Problem, "description": "Rate limited; see Retry-After."},
    503: {"model": Problem, "description": "The store could not complete the operation."},
}


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for an operation: the common ones plus ``statuses``."""
    described = {
        404: "No such object in the token's namespace.",
        409: "The operation contradicts stored state.",
        415: "Unsupported request body type.",
        502: "A Memory's remote backend failed or answered outside its contract.",
    }
    found = dict(COMMON_RESPONSES)
    for status in statuses:
        found.setdefault(status, {"model": Problem, "description": described.get(status, "Error.")})
    return found
