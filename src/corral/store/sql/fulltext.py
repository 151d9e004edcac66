"""Full-text search of Memory entries, the same on SQLite and PostgreSQL: BM25 over the
scope's index kept in this process (:mod:`corral.store.sql.fulltext_index`).

A search reads the scope's generation, takes the scope's :class:`TextIndex` as of it -
cached, brought up to date from the scope's noted changes, or built from its texts read
whole (one search of the scope at a time builds or updates it: the others wait for it
and use it) - scores every entry holding a query word with numpy, and takes the best
``limit`` by ``np.partition``. Filters are checked on the first few hundred in order,
else the ids they keep are read. A scope whose index does not fit the cache (or a store
whose cache budget is 0) is indexed for each search and not kept: the same answer,
slower.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.memory import MemoryHit, MemoryPlace
from corral.store.schema import memory_entries
from corral.store.sql.engine import RunTurns
from corral.store.sql.fulltext_index import Floats, Ints, TextIndex, TextIndexCache
from corral.store.sql.memory_scopes import at_place, changed_entries, generation_of
from corral.store.sql.rows import MEMORY_ENTRIES

_t = memory_entries

#: how many of the best matches a filtered search checks before reading the filters' ids
FILTER_CANDIDATES = 256
#: the most entries a scope's changes since its cached index may name for an update
MOST_CHANGED = 8_192


def _among(
    ids: list[int] | sa.Select[Any], conditions: list[sa.ColumnElement[bool]]
) -> sa.ColumnElement[bool]:
    """The entries of ``ids`` that meet ``conditions``, looked up by id: the conditions sit
    inside a function, where the database cannot use them to pick the scope's index
    instead (which would read the whole scope to keep a few ids)."""
    return sa.and_(_t.c.id.in_(ids), sa.func.coalesce(sa.and_(*conditions), sa.false()))


class FulltextCaches:
    """What one store keeps between full-text searches: the scopes' indexes within
    ``max_bytes`` (0 keeps none)."""

    def __init__(self, max_bytes: int) -> None:
        self.indexes = TextIndexCache(max_bytes)
        # one search at a time builds or updates a scope's index, the others then use it
        self.building = RunTurns()


async def ranked(
    place: MemoryPlace,
    terms: list[str],
    conditions: list[sa.ColumnElement[bool]],
    limit: int,
    kept: FulltextCaches,
    conn: AsyncConnection,
) -> list[MemoryHit]:
    """The best ``limit`` entries of ``place`` holding any of ``terms`` (the words of
    :func:`~corral.core.memory.query_terms`) under ``conditions`` (the scope's, then
    filters), by BM25 over the scope's index."""
    generation = int((await conn.execute(generation_of(place))).scalar() or 0)
    index = await _text_index(conn, place, generation, kept)
    if not index.live:
        return []
    scores, candidates = index.scores(terms)
    if len(conditions) > 1:  # filters: the best that pass them
        best = await _passing(conn, index, scores, candidates, conditions, limit)
    else:
        best = index.best(scores, candidates, limit)
    ids = [int(n) for n in index.ids[best]]
    if not ids:
        return []
    read_rows = await conn.execute(sa.select(_t).where(_t.c.id.in_(ids)))
    entries = {row.id: MEMORY_ENTRIES.record(row) for row in read_rows.all()}
    return [
        MemoryHit(entries[n], float(scores[row]))
        for n, row in zip(ids, best, strict=True)
        if n in entries  # deleted by another process since the generation was read
    ]


async def _passing(
    conn: AsyncConnection,
    index: TextIndex,
    scores: Floats,
    candidates: Ints,
    conditions: list[sa.ColumnElement[bool]],
    limit: int,
) -> Ints:
    """The first ``limit`` rows of ``candidates`` whose entries pass ``conditions``: of
    the first few hundred if enough of them do, else of the entries the filters keep."""
    first = index.best(scores, candidates, max(FILTER_CANDIDATES, 4 * limit))
    ids = [int(n) for n in index.ids[first]]
    if not ids:
        return first
    passing = set((await conn.execute(sa.select(_t.c.id).where(_among(ids, conditions)))).scalars())
    kept = [row for row, n in zip(first, ids, strict=True) if n in passing]
    if len(kept) >= limit or len(first) == len(candidates):
        return np.asarray(kept[:limit], dtype=np.int64)
    allowed = np.fromiter(
        (await conn.execute(sa.select(_t.c.id).where(*conditions))).scalars(), dtype=np.int64
    )
    return index.best(scores, candidates[np.isin(index.ids[candidates], allowed)], limit)


async def _text_index(
    conn: AsyncConnection, place: MemoryPlace, generation: int, kept: FulltextCaches
) -> TextIndex:
    """The scope's index at ``generation``: cached, else (one search of the scope at a
    time: searches at once do not each read the scope whole) brought up to date from the
    scope's changes, or built from its texts read whole (kept if it fits the cache)."""
    cache = kept.indexes
    key = (place.namespace, place.memory, place.scope_key)
    cached = cache.latest(key)
    if cached is not None and cached.generation == generation:
        return cached
    async with kept.building.turn("\x00".join(key)):
        return await _built(conn, place, generation, cache)


async def _built(
    conn: AsyncConnection, place: MemoryPlace, generation: int, cache: TextIndexCache
) -> TextIndex:
    key = (place.namespace, place.memory, place.scope_key)
    cached = cache.latest(key)  # again: the search before this one may have built it
    if cached is not None and cached.generation == generation:
        return cached
    if cached is not None and cached.generation < generation:
        changed = await changed_entries(conn, place, cached.generation, generation)
        if changed is not None and len(changed) <= MOST_CHANGED:
            fresh = await _texts(conn, place, changed)
            stale = np.asarray(changed, dtype=np.int64)
            index = await anyio.to_thread.run_sync(cached.updated_to, generation, stale, fresh)
            if index is not None:
                cache.put(key, index, updated=True)
                return index
    entries = await _texts(conn, place, None)
    # tokenizing is seconds for a large scope: off the event loop, like the update above
    index = await anyio.to_thread.run_sync(TextIndex.of, generation, entries)
    if cached is None or cached.generation < generation:  # never an older one filed
        cache.put(key, index)
    return index


async def _texts(
    conn: AsyncConnection, place: MemoryPlace, only: list[int] | None
) -> list[tuple[int, str, float]]:
    """The scope's entries (those of ``only``, if given) as (id, text, updated_at)."""
    statement = sa.select(_t.c.id, _t.c.text, _t.c.updated_at).where(at_place(place))
    if only is not None:
        rows = (await conn.execute(statement.where(_t.c.id.in_(only)).order_by(_t.c.id))).all()
        return [(int(n), str(text), float(updated_at)) for n, text, updated_at in rows]
    # the whole scope: the driver's own rows (a third of the time of SQLAlchemy's), in
    # this transaction; the statement has no list to expand, so it compiles as it runs
    compiled = statement.order_by(_t.c.id).compile(dialect=conn.dialect)
    params = [compiled.params[name] for name in compiled.positiontup or ()]
    raw = (await conn.get_raw_connection()).driver_connection
    if conn.dialect.name == "postgresql":  # asyncpg: records, read as tuples
        return [tuple(row) for row in await raw.fetch(str(compiled), *params)]  # type: ignore[union-attr]
    cursor = await raw.execute(str(compiled), params)  # type: ignore[union-attr]
    try:
        return list(await cursor.fetchall())
    finally:
        await cursor.close()
