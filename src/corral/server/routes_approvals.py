"""Approvals: tool calls waiting for a human; list, get, approve, reject."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from corral.api import ID_PATTERN, ApprovalOut, ApprovalPage, Decision
from corral.core.runs import ApprovalState
from corral.runtime import operations
from corral.server import pagination
from corral.server.auth import Operator, Principal, Viewer
from corral.server.context import ServerContext, context_of
from corral.server.problems import responses

router = APIRouter(prefix="/v1", tags=["approvals"])

ApprovalId = Annotated[str, Path(max_length=64, pattern=ID_PATTERN, description="The approval.")]


@router.get(
    "/approvals", response_model=ApprovalPage, summary="List approvals", responses=responses()
)
async def list_approvals(
    who: Viewer,
    request: Request,
    state: Annotated[
        list[ApprovalState] | None, Query(description="Only these states (e.g. pending).")
    ] = None,
    run_id: Annotated[
        str | None, Query(max_length=64, pattern=ID_PATTERN, description="Only this run's.")
    ] = None,
    limit: pagination.Limit = 100,
    cursor: pagination.Cursor = None,
) -> ApprovalPage:
    """The namespace's approvals, oldest first."""
    states = [s.value for s in state] if state else None
    found = await context_of(request).store.list_approvals(
        who.namespace,
        run_id=run_id,
        states=states,
        limit=limit + 1,
        after=pagination.position(cursor, (float, str)),
    )
    page, next_cursor = pagination.keyset_page(found, limit, lambda a: (a.requested_at, a.id))
    return ApprovalPage(items=[ApprovalOut.from_approval(a) for a in page], next_cursor=next_cursor)


@router.get(
    "/approvals/{approval_id}",
    response_model=ApprovalOut,
    summary="Get an approval",
    responses=responses(404),
)
async def get_approval(approval_id: ApprovalId, who: Viewer, request: Request) -> ApprovalOut:
    store = context_of(request).store
    return ApprovalOut.from_approval(
        await operations.get_approval(store, approval_id, namespace=who.namespace)
    )


@router.post(
    "/approvals/{approval_id}/approve",
    response_model=ApprovalOut,
    summary="Approve a tool call",
    responses=responses(404, 409),
)
async def approve(
    approval_id: ApprovalId, who: Operator, request: Request, body: Decision | None = None
) -> ApprovalOut:
    """The run resumes on a worker and the approved call runs once. 409 when the
    approval was already decided or has expired."""
    return await _decide(context_of(request), approval_id, who, True, body)


@router.post(
    "/approvals/{approval_id}/reject",
    response_model=ApprovalOut,
    summary="Reject a tool call",
    responses=responses(404, 409),
)
async def reject(
    approval_id: ApprovalId, who: Operator, request: Request, body: Decision | None = None
) -> ApprovalOut:
    """The model is told the call was rejected (with the reason) and the run goes on."""
    return await _decide(context_of(request), approval_id, who, False, body)


async def _decide(
    context: ServerContext,
    approval_id: str,
    who: Principal,
    approved: bool,
    body: Decision | None,
) -> ApprovalOut:
    decided = await operations.decide(
        context.store,
        context.bus,
        approval_id,
        approved,
        by=who.label,
        reason=body.reason if body is not None else None,
        namespace=who.namespace,
    )
    return ApprovalOut.from_approval(decided)
