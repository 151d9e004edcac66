"""Memories: the entries of a Memory resource of the caller's namespace - list, write,
ingest, read, delete, search. A Memory of another namespace is 404, as every object is."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from corral.api.common import Id, Name, SessionId
from corral.api.memory import (
    SCOPE_HELP,
    Key,
    MemoryEntryOut,
    MemoryEntryPage,
    MemoryHitOut,
    MemoryIngestOut,
    MemoryIngestRequest,
    MemorySearchRequest,
    MemorySearchResult,
    MemoryStatsOut,
    MemoryWriteRequest,
)
from corral.core.ids import new_id
from corral.core.memory import MemoryScope
from corral.resources.kinds import NAME_PATTERN
from corral.runtime.memory import Memories
from corral.server import pagination
from corral.server.auth import Operator, Viewer
from corral.server.context import context_of
from corral.server.problems import responses

router = APIRouter(prefix="/v1", tags=["memories"])

MemoryName = Annotated[Name, Path(description="The Memory.")]
KeyPath = Annotated[Key, Path(description="The entry's key.")]


def _scope(
    agent: Annotated[
        str | None, Query(pattern=NAME_PATTERN, description=SCOPE_HELP["agent"])
    ] = None,
    session: Annotated[SessionId | None, Query(description=SCOPE_HELP["session"])] = None,
    system_run: Annotated[Id | None, Query(description=SCOPE_HELP["system_run"])] = None,
) -> MemoryScope:
    """Whose entries a GET or DELETE sees: a :class:`MemoryScope` from its query."""
    return MemoryScope(agent, session, system_run)


Scope = Annotated[MemoryScope, Depends(_scope)]


def _memories(request: Request) -> Memories:
    context = context_of(request)
    return Memories(context.store, context.settings)


@router.get(
    "/memories/{name}",
    response_model=MemoryStatsOut,
    summary="Describe a Memory's entries",
    responses=responses(404, 502),
)
async def memory_stats(name: MemoryName, who: Viewer, request: Request) -> MemoryStatsOut:
    """How many entries it holds (every scope), their size, and its search index."""
    return MemoryStatsOut.from_stats(await _memories(request).stats(who.namespace, name))


@router.get(
    "/memories/{name}/entries",
    response_model=MemoryEntryPage,
    summary="List a Memory's entries",
    responses=responses(404, 502),
)
async def list_memory_entries(
    name: MemoryName,
    who: Viewer,
    request: Request,
    scope: Scope,
    prefix: Annotated[
        str,
        # as a key: no control characters (PostgreSQL keeps no NUL in text)
        Query(max_length=255, pattern=r"^[^\x00-\x1f]*$", description="Only keys with this start."),
    ] = "",
    limit: pagination.Limit = 100,
    cursor: pagination.Cursor = None,
) -> MemoryEntryPage:
    """The entries by key."""
    after = pagination.position(cursor, (str,))
    found = await _memories(request).list_entries(
        who.namespace,
        name,
        prefix=prefix,
        limit=limit + 1,
        after=None if after is None else after[0],
        scope=scope,
    )
    page, next_cursor = pagination.keyset_page(found, limit, lambda e: (e.key,))
    return MemoryEntryPage(
        items=[MemoryEntryOut.from_entry(e) for e in page], next_cursor=next_cursor
    )


@router.post(
    "/memories/{name}/entries",
    response_model=MemoryEntryOut,
    status_code=201,
    summary="Write an entry",
    responses=responses(400, 404, 502),
)
async def write_memory_entry(
    name: MemoryName, body: MemoryWriteRequest, who: Operator, request: Request
) -> MemoryEntryOut:
    """Write one entry (replacing the entry of its key), the Memory's retention applied."""
    entry = await _memories(request).write(
        who.namespace,
        name,
        body.text,
        key=body.key or new_id("mem"),
        metadata=body.metadata,
        scope=body.scope,
    )
    return MemoryEntryOut.from_entry(entry)


@router.post(
    "/memories/{name}/ingest",
    response_model=MemoryIngestOut,
    summary="Ingest a long text, chunked",
    responses=responses(400, 404, 502),
)
async def ingest_memory(
    name: MemoryName, body: MemoryIngestRequest, who: Operator, request: Request
) -> MemoryIngestOut:
    """Cut the text by the Memory's ``spec.chunking``, each chunk one entry
    ``KEY_PREFIX#N`` (the prefix is ``source`` when none is given); the same text under
    the same prefix again writes nothing twice."""
    prefix, done = await _memories(request).ingest(
        who.namespace,
        name,
        body.text,
        source=body.source,
        key_prefix=body.key_prefix,
        metadata=body.metadata,
        scope=body.scope,
    )
    return MemoryIngestOut(
        key_prefix=prefix, chunks=done.chunks, written=done.written, keys=done.keys
    )


@router.get(
    "/memories/{name}/entries/{key:path}",
    response_model=MemoryEntryOut,
    summary="Read an entry",
    responses=responses(404, 502),
)
async def read_memory_entry(
    name: MemoryName,
    key: KeyPath,
    who: Viewer,
    request: Request,
    scope: Scope,
) -> MemoryEntryOut:
    entry = await _memories(request).read(who.namespace, name, key, scope=scope)
    return MemoryEntryOut.from_entry(entry)


@router.delete(
    "/memories/{name}/entries/{key:path}",
    status_code=204,
    response_class=Response,
    summary="Delete an entry",
    responses=responses(404, 502),
)
async def delete_memory_entry(
    name: MemoryName,
    key: KeyPath,
    who: Operator,
    request: Request,
    scope: Scope,
) -> Response:
    await _memories(request).delete(who.namespace, name, key, scope=scope)
    return Response(status_code=204)


@router.post(
    "/memories/{name}/search",
    response_model=MemorySearchResult,
    summary="Search a Memory",
    responses=responses(400, 404, 502),
)
async def search_memory(
    name: MemoryName, body: MemorySearchRequest, who: Viewer, request: Request
) -> MemorySearchResult:
    """Entries matching words of the query, best first (any text is taken as words)."""
    hits = await _memories(request).search(
        who.namespace,
        name,
        body.query,
        top_k=body.top_k,
        filters=body.filter,
        scope=body.scope,
    )
    return MemorySearchResult(items=[MemoryHitOut.from_hit(h) for h in hits])
