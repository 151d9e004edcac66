"""Sessions: conversations that carry across runs; list, get, messages, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response

from corral.api import (
    SessionId,
    SessionMessageOut,
    SessionMessagePage,
    SessionOut,
    SessionPage,
)
from corral.core.errors import NotFoundError
from corral.core.sessions import Session
from corral.resources.kinds import NAME_PATTERN
from corral.server import pagination
from corral.server.auth import Operator, Principal, Viewer
from corral.server.context import ServerContext, context_of
from corral.server.problems import responses

router = APIRouter(prefix="/v1", tags=["sessions"])

SessionIdPath = Annotated[SessionId, Path(description="The session.")]


async def _own(context: ServerContext, session_id: str, who: Principal) -> Session:
    """The session of this id in the caller's namespace (sessions are namespaced)."""
    session = await context.store.get_session(who.namespace, session_id)
    if session is None:
        raise NotFoundError(f"session {session_id!r} not found")
    return session


@router.get("/sessions", response_model=SessionPage, summary="List sessions", responses=responses())
async def list_sessions(
    who: Viewer,
    request: Request,
    agent: Annotated[
        str | None, Query(pattern=NAME_PATTERN, description="Only this agent's sessions.")
    ] = None,
    limit: pagination.Limit = 100,
    cursor: pagination.Cursor = None,
) -> SessionPage:
    """The namespace's sessions, most recently used first."""
    found = await context_of(request).store.list_sessions(
        who.namespace, agent, limit=limit + 1, after=pagination.position(cursor, (float, str))
    )
    page, next_cursor = pagination.keyset_page(found, limit, lambda s: (s.updated_at, s.id))
    return SessionPage(items=[SessionOut.from_session(s) for s in page], next_cursor=next_cursor)


@router.get(
    "/sessions/{session_id}",
    response_model=SessionOut,
    summary="Get a session",
    responses=responses(404),
)
async def get_session(session_id: SessionIdPath, who: Viewer, request: Request) -> SessionOut:
    return SessionOut.from_session(await _own(context_of(request), session_id, who))


@router.get(
    "/sessions/{session_id}/messages",
    response_model=SessionMessagePage,
    summary="A session's messages",
    responses=responses(404),
)
async def session_messages(
    session_id: SessionIdPath,
    who: Viewer,
    request: Request,
    include_hidden: Annotated[
        bool, Query(description="Also the messages compaction hid (kept for audit).")
    ] = False,
    limit: pagination.Limit = 100,
    cursor: pagination.Cursor = None,
) -> SessionMessagePage:
    """The messages in conversation order (a compaction summary sits before the
    messages it left visible)."""
    context = context_of(request)
    await _own(context, session_id, who)
    messages = await context.store.session_messages(
        who.namespace, session_id, include_hidden=include_hidden
    )
    # The order is by position, not seq (a summary is placed early): the cursor is an offset.
    start = int(pagination.decode(cursor, (int,))[0]) if cursor is not None else 0
    page = messages[start : start + limit]
    end = start + len(page)
    next_cursor = pagination.encode((end,)) if end < len(messages) else None
    return SessionMessagePage(
        items=[SessionMessageOut.from_stored(m) for m in page], next_cursor=next_cursor
    )


@router.delete(
    "/sessions/{session_id}",
    status_code=204,
    response_class=Response,
    summary="Delete a session",
    responses=responses(404, 409),
)
async def delete_session(session_id: SessionIdPath, who: Operator, request: Request) -> Response:
    """Delete a session and its messages (its finished runs stay). 409 naming the run
    while a run of the session is queued, running or waiting for approval."""
    await context_of(request).store.delete_session(who.namespace, session_id)
    return Response(status_code=204)
