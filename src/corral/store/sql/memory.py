"""Memory entries in the SQL store: write (idempotent, with retention), read, list,
delete and search them.

Full-text search is the same on both dialects: BM25 over each scope's words kept in
process (:mod:`corral.store.sql.fulltext`), brought up to date by the scope's generation
and noted changes like its vectors. A query is the words of
:func:`~corral.core.memory.query_terms`: no query text is ever read as query syntax. An
entry matches any of the words.

Every statement is written once, except where the dialects differ, which is
here and only here, one function per dialect:

- metadata filters: equality of one key's JSON value, by ``json_type`` and
  ``json_extract`` on SQLite and by ``jsonb`` equality on PostgreSQL.
- vectors (:mod:`corral.store.sql.vectors`): an entry written with a
  :class:`~corral.core.memory.MemoryVector` keeps it in ``memory_vectors``, in the same
  transaction; a search given the query's vector ranks the scope's vectors of the same
  embedder by cosine (pgvector's ``<=>`` in SQL, else the in-process matrix of
  :mod:`corral.store.sql.vector_cache`, kept current by the scope's generation, which
  every write, delete and prune raises in its transaction, noting the entries it changed
  in ``memory_changes``), and fuses that ranking with the full-text one
  (:func:`~corral.core.memory.fuse`, reciprocal rank fusion). Filters apply to both.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any

import anyio
import numpy as np
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.memory import (
    FULLTEXT,
    MAX_RESULTS,
    VECTOR,
    MemoryEntry,
    MemoryHit,
    MemoryInputError,
    MemoryPlace,
    MemoryStats,
    MemoryVector,
    Scalar,
    check_key,
    check_metadata,
    check_text,
    fuse,
    query_terms,
)
from corral.store.schema import memory_changes, memory_entries, memory_generations
from corral.store.sql.engine import RunTurns, SqlEngine, fetch_all, fetch_first
from corral.store.sql.fulltext import FulltextCaches, ranked
from corral.store.sql.memory_scopes import at_place, changed_entries, generation_of
from corral.store.sql.rows import MEMORY_ENTRIES
from corral.store.sql.statements import _insert
from corral.store.sql.vector_cache import (
    Matrix,
    VectorCache,
    decode_arrays,
    decode_blobs,
)
from corral.store.sql.vectors import (
    CACHED_INDEX,
    PGVECTOR,
    memory_vectors,
    pack,
    postgres_distance,
    postgres_embedding_type,
    postgres_param,
    postgres_value,
    sqlite_vector_index,
    unit,
)

_t = memory_entries
_COLUMNS = len(_t.columns)
_SECONDS_PER_DAY = 86_400.0
_v = memory_vectors
#: how many candidates each signal of a hybrid search ranks before they are fused
FUSION_POOL = 50
#: how many generations of a scope's changes ``memory_changes`` keeps: a process whose
#: cached vectors are older loads the scope whole
KEPT_GENERATIONS = 64
#: the most entries one statement of a batch write carries (bound parameters: SQLite
#: takes 32,766 per statement, asyncpg 32,767)
ROWS_PER_STATEMENT = 500
#: the most entry ids one statement reading vectors binds (the same limits)
IDS_PER_STATEMENT = 8_192


def entries_of_memory(namespace: str, memory: str) -> sa.Delete:
    """Delete every entry of a Memory, all scopes (the Memory itself is being deleted).
    Run :func:`memory_changed` in the same transaction."""
    return _t.delete().where(_t.c.namespace == namespace, _t.c.memory == memory)


def changes_of_memory(namespace: str, memory: str) -> sa.Delete:
    """Forget the changes of every scope of a Memory (its entries were deleted): with the
    generations raised by :func:`memory_changed`, a cache of its vectors finds its
    changes missing and loads the scope whole."""
    _c = memory_changes
    return _c.delete().where(_c.c.namespace == namespace, _c.c.memory == memory)


def memory_changed(namespace: str, memory: str) -> sa.Update:
    """Raise the generation of every scope of a Memory (its entries were deleted)."""
    _g = memory_generations
    return (
        _g.update()
        .where(_g.c.namespace == namespace, _g.c.memory == memory)
        .values(generation=_g.c.generation + 1)
    )


async def _changed(
    conn: AsyncConnection, dialect: str, changes: Mapping[MemoryPlace, Collection[int]]
) -> None:
    """Raise the generation of each scope of ``changes`` and note the ids of the entries
    it wrote or deleted under the new generation (``0`` for none), keeping the last
    :data:`KEPT_GENERATIONS`; in a stable order of scopes, so two transactions raising
    the same scopes never wait for each other crosswise."""
    _g, _c = memory_generations, memory_changes
    for place in sorted(changes, key=lambda p: (p.namespace, p.memory, p.scope_key)):
        upsert = _insert(dialect, _g).values(
            namespace=place.namespace,
            memory=place.memory,
            scope_key=place.scope_key,
            generation=1,
        )
        upsert = upsert.on_conflict_do_update(
            index_elements=["namespace", "memory", "scope_key"],
            set_={"generation": _g.c.generation + 1},
        ).returning(_g.c.generation)
        generation = int((await conn.execute(upsert)).scalar_one())
        where = {"namespace": place.namespace, "memory": place.memory}
        rows = [
            {**where, "scope_key": place.scope_key, "generation": generation, "entry_id": n}
            for n in sorted(set(changes[place])) or [0]
        ]
        await conn.execute(_c.insert(), rows)
        await conn.execute(
            _c.delete().where(
                _c.c.namespace == place.namespace,
                _c.c.memory == place.memory,
                _c.c.scope_key == place.scope_key,
                _c.c.generation <= generation - KEPT_GENERATIONS,
            )
        )


# --------------------------------------------------------------------------- per dialect


def _equals_sqlite(key: str, value: Scalar) -> sa.ColumnElement[bool]:
    path = f'$."{key}"'  # keys are plain (check_metadata): no quote to escape
    kind = sa.func.json_type(_t.c["metadata"], path)
    if value is None:
        return kind == "null"
    if isinstance(value, bool):
        return kind == ("true" if value else "false")
    extracted = sa.func.json_extract(_t.c["metadata"], path)
    if isinstance(value, str):
        return sa.and_(kind == "text", extracted == value)
    return sa.and_(kind.in_(("integer", "real")), extracted == value)


def _equals_postgresql(key: str, value: Scalar) -> sa.ColumnElement[bool]:
    # jsonb equality: the type counts ("1" is not 1), 1 and 1.0 are equal
    element: Any = _t.c["metadata"][key]
    return element == sa.type_coerce(value, _t.c["metadata"].type)  # type: ignore[no-any-return]


#: how each dialect searches, for describe and capabilities
INDEX = "full text: BM25 over each scope's words, indexed in process"
_EQUALS: Mapping[str, Callable[[str, Scalar], sa.ColumnElement[bool]]] = {
    "sqlite": _equals_sqlite,
    "postgresql": _equals_postgresql,
}


# --------------------------------------------------------------------------- operations


class SqlMemory(SqlEngine):
    """The memory operations of :class:`~corral.store.sql.SqlStore`."""

    async def write_memory(
        self,
        entry: MemoryEntry,
        *,
        max_entries: int | None = None,
        max_age_days: float | None = None,
        vector: MemoryVector | None = None,
    ) -> tuple[MemoryEntry, bool]:
        [written] = await self.write_memories(
            [entry],
            [vector] if vector is not None else None,
            max_entries=max_entries,
            max_age_days=max_age_days,
        )
        return written

    async def write_memories(
        self,
        entries: Sequence[MemoryEntry],
        vectors: Sequence[MemoryVector] | None = None,
        *,
        max_entries: int | None = None,
        max_age_days: float | None = None,
    ) -> list[tuple[MemoryEntry, bool]]:
        if vectors is not None and len(vectors) != len(entries):
            raise ValueError("write_memories: one vector per entry")
        prepared: list[tuple[MemoryEntry, dict[str, Any], MemoryVector | None]] = []
        for n, entry in enumerate(entries):
            check_key(entry.key)
            check_text(entry.text)
            vector = vectors[n] if vectors is not None else None
            if vector is not None:
                try:
                    vector = MemoryVector(vector.embedder, unit(vector.values))
                except ValueError as exc:
                    raise MemoryInputError(f"entry {entry.key!r}: {exc}") from None
            prepared.append((entry, check_metadata(entry.metadata), vector))
        now = time.time()
        places = list(dict.fromkeys(entry.place for entry in entries))

        async def write(conn: AsyncConnection) -> list[tuple[MemoryEntry, bool]]:
            changed: dict[MemoryPlace, set[int]] = {place: set() for place in places}
            done = await self._write_batch(conn, prepared, now, changed)
            for place in places:
                changed[place].update(await _prune(conn, place, now, max_entries, max_age_days))
            await _changed(conn, self._dialect, changed)
            return done

        name = entries[0].memory if entries else "?"
        return await self._write(f"write memory {name}", write)

    async def _write_batch(
        self,
        conn: AsyncConnection,
        prepared: list[tuple[MemoryEntry, dict[str, Any], MemoryVector | None]],
        now: float,
        changed: dict[MemoryPlace, set[int]],
    ) -> list[tuple[MemoryEntry, bool]]:
        """Write many entries with a few statements: replays looked up at once, then one
        upsert (and one vector insert) per :data:`ROWS_PER_STATEMENT` entries. A batch
        naming one key or idempotency key twice is written entry by entry, in order."""
        keys = [(entry.place, entry.key) for entry, _, _ in prepared]
        replays = [e.idempotency_key for e, _, _ in prepared if e.idempotency_key is not None]
        if len(set(keys)) < len(keys) or len(set(replays)) < len(replays):
            return [await self._write_one(conn, *item, now, changed) for item in prepared]
        results: dict[int, tuple[MemoryEntry, bool]] = {}
        if replays:
            written = await self._replayed(conn, [entry for entry, _, _ in prepared])
            for n, (entry, _, _) in enumerate(prepared):
                if entry.idempotency_key in written:
                    results[n] = (written[entry.idempotency_key], False)
        todo = [n for n in range(len(prepared)) if n not in results]
        for start in range(0, len(todo), ROWS_PER_STATEMENT):
            part = todo[start : start + ROWS_PER_STATEMENT]
            upsert = _insert(self._dialect, _t).values(
                [
                    MEMORY_ENTRIES.values(
                        prepared[n][0], metadata=prepared[n][1], created_at=now, updated_at=now
                    )
                    for n in part
                ]
            )
            upsert = upsert.on_conflict_do_update(
                index_elements=["namespace", "memory", "scope_key", "key"],
                set_={
                    "text": upsert.excluded.text,
                    "metadata": upsert.excluded["metadata"],
                    "idempotency_key": upsert.excluded.idempotency_key,
                    "updated_at": upsert.excluded.updated_at,
                },
            ).returning(*_t.columns)
            rows = {
                (row.namespace, row.memory, row.scope_key, row.key): row
                for row in (await conn.execute(upsert)).all()
            }
            ids: list[int] = []
            vectors: list[dict[str, Any]] = []
            for n in part:
                entry, _, vector = prepared[n]
                row = rows[(entry.namespace, entry.memory, entry.scope_key, entry.key)]
                results[n] = (MEMORY_ENTRIES.record(row), True)
                changed[entry.place].add(row.id)
                ids.append(row.id)
                if vector is not None:
                    vectors.append(
                        {"entry_id": row.id, "embedder": vector.embedder, "values": vector.values}
                    )
            # a rewritten entry's old vector no longer says what its text means
            await conn.execute(_v.delete().where(_v.c.entry_id.in_(ids)))
            if vectors:
                await self._insert_vectors(conn, vectors)
        return [results[n] for n in range(len(prepared))]

    async def _replayed(
        self, conn: AsyncConnection, entries: list[MemoryEntry]
    ) -> dict[str, MemoryEntry]:
        """The entries already written under the idempotency keys of ``entries``."""
        found: dict[str, MemoryEntry] = {}
        memories: dict[tuple[str, str], list[str]] = {}
        for entry in entries:
            if entry.idempotency_key is not None:
                memories.setdefault((entry.namespace, entry.memory), []).append(
                    entry.idempotency_key
                )
        for (namespace, memory), keys in memories.items():
            for start in range(0, len(keys), ROWS_PER_STATEMENT):
                query = sa.select(_t).where(
                    _t.c.namespace == namespace,
                    _t.c.memory == memory,
                    _t.c.idempotency_key.in_(keys[start : start + ROWS_PER_STATEMENT]),
                )
                for row in (await conn.execute(query)).all():
                    found[row.idempotency_key] = MEMORY_ENTRIES.record(row)
        return found

    async def _insert_vectors(self, conn: AsyncConnection, vectors: list[dict[str, Any]]) -> None:
        """Insert ``{entry_id, embedder, values}`` rows, as one statement run for many."""
        kind = await self._vector_kind(conn)
        if kind == "blob":
            statement = _v.insert()
            params = [
                {
                    "entry_id": v["entry_id"],
                    "embedder": v["embedder"],
                    "embedding": pack(v["values"]),
                }
                for v in vectors
            ]
        else:
            statement = _v.insert().values(
                entry_id=sa.bindparam("entry_id"),
                embedder=sa.bindparam("embedder"),
                embedding=postgres_param(kind),
            )
            params = [
                {
                    "entry_id": v["entry_id"],
                    "embedder": v["embedder"],
                    "embedding": postgres_value(kind, v["values"]),
                }
                for v in vectors
            ]
        await conn.execute(statement, params)

    async def _write_one(
        self,
        conn: AsyncConnection,
        entry: MemoryEntry,
        metadata: dict[str, Any],
        vector: MemoryVector | None,
        now: float,
        changed: dict[MemoryPlace, set[int]],
    ) -> tuple[MemoryEntry, bool]:
        if entry.idempotency_key is not None:
            done = (
                await conn.execute(
                    sa.select(_t).where(
                        _t.c.namespace == entry.namespace,
                        _t.c.memory == entry.memory,
                        _t.c.idempotency_key == entry.idempotency_key,
                    )
                )
            ).first()
            if done is not None:  # this call wrote already (a replay): not again
                return MEMORY_ENTRIES.record(done), False
        upsert = _insert(self._dialect, _t).values(
            **MEMORY_ENTRIES.values(entry, metadata=metadata, created_at=now, updated_at=now)
        )
        upsert = upsert.on_conflict_do_update(
            index_elements=["namespace", "memory", "scope_key", "key"],
            set_={
                "text": upsert.excluded.text,
                "metadata": upsert.excluded["metadata"],
                "idempotency_key": upsert.excluded.idempotency_key,
                "updated_at": upsert.excluded.updated_at,
            },
        ).returning(*_t.columns)
        row = (await conn.execute(upsert)).one()
        changed[entry.place].add(row.id)
        await conn.execute(_v.delete().where(_v.c.entry_id == row.id))
        if vector is not None:
            await self._insert_vectors(
                conn, [{"entry_id": row.id, "embedder": vector.embedder, "values": vector.values}]
            )
        return MEMORY_ENTRIES.record(row), True

    async def _vector_kind(self, conn: AsyncConnection) -> str:
        """``vector`` or ``real[]`` on PostgreSQL (the migration's choice), ``blob`` on SQLite."""
        kind: str | None = getattr(self, "_memory_vector_kind", None)
        if kind is None:
            if self._dialect == "sqlite":
                kind = "blob"
            else:
                kind = str((await conn.execute(postgres_embedding_type())).scalar_one())
            self._memory_vector_kind = kind
        return kind

    async def memory_by_idempotency_key(
        self, namespace: str, memory: str, idempotency_key: str
    ) -> MemoryEntry | None:
        query = sa.select(_t).where(
            _t.c.namespace == namespace,
            _t.c.memory == memory,
            _t.c.idempotency_key == idempotency_key,
        )
        row = await self._read(f"read memory {memory}", fetch_first(query))
        return MEMORY_ENTRIES.record(row) if row is not None else None

    async def memory_vector_index(self) -> str:
        if self._dialect == "sqlite":
            return sqlite_vector_index()

        async def read(conn: AsyncConnection) -> str:
            return await self._vector_kind(conn)

        kind = await self._read("read the memory vector index", read)
        if kind == "vector":
            return "pgvector (exact cosine, <=>)"
        return f"{CACHED_INDEX} (real[]; pgvector could not be created here)"

    async def read_memory(self, place: MemoryPlace, key: str) -> MemoryEntry | None:
        query = sa.select(_t).where(at_place(place), _t.c.key == key)
        row = await self._read(f"read memory {place.memory}", fetch_first(query))
        return MEMORY_ENTRIES.record(row) if row is not None else None

    async def list_memory(
        self,
        place: MemoryPlace,
        *,
        prefix: str = "",
        limit: int = 20,
        after: str | None = None,
    ) -> list[MemoryEntry]:
        query = sa.select(_t).where(at_place(place))
        if prefix:
            # substr, not LIKE: no wildcard to escape, and case-sensitive on both dialects
            query = query.where(sa.func.substr(_t.c.key, 1, len(prefix)) == prefix)
        if after is not None:
            query = query.where(_t.c.key > after)
        query = query.order_by(_t.c.key).limit(max(1, min(limit, MAX_RESULTS)))
        rows = await self._read(f"list memory {place.memory}", fetch_all(query))
        return [MEMORY_ENTRIES.record(row) for row in rows]

    async def delete_memory_entry(self, place: MemoryPlace, key: str) -> bool:
        delete = _t.delete().where(at_place(place), _t.c.key == key).returning(_t.c.id)

        async def write(conn: AsyncConnection) -> bool:
            deleted = list((await conn.execute(delete)).scalars())
            if deleted:
                await _changed(conn, self._dialect, {place: deleted})
            return bool(deleted)

        return await self._write(f"delete from memory {place.memory}", write)

    async def search_memory(
        self,
        place: MemoryPlace,
        query: str,
        *,
        top_k: int = 5,
        filters: Mapping[str, Any] | None = None,
        vector: MemoryVector | None = None,
    ) -> list[MemoryHit]:
        top_k = max(1, min(top_k, MAX_RESULTS))
        conditions = [at_place(place)]
        equals = _EQUALS[self._dialect]
        for key, value in check_metadata(dict(filters or {}), what="filter").items():
            conditions.append(equals(key, value))
        terms = query_terms(query)
        if vector is None:
            return await self._fulltext(place, terms, conditions, top_k) if terms else []
        try:
            values = unit(vector.values)
        except ValueError as exc:
            raise MemoryInputError(f"the query's embedding: {exc}") from None
        pool = max(top_k, FUSION_POOL)
        rankings: dict[str, list[MemoryHit]] = {FULLTEXT: [], VECTOR: []}
        failed: list[Exception] = []

        async def rank(signal: str, ranking: Awaitable[list[MemoryHit]]) -> None:
            try:
                rankings[signal] = await ranking
            except Exception as exc:  # noqa: BLE001 - raised below as itself, not in a group
                failed.append(exc)

        # both signals at once, each on a connection of its own: the database's work for
        # one overlaps the matrix product of the other (neither holds the GIL meanwhile)
        async with anyio.create_task_group() as group:
            if terms:
                group.start_soon(rank, FULLTEXT, self._fulltext(place, terms, conditions, pool))
            nearest = self._nearest(
                place, vector.embedder, values, conditions, pool, filtered=len(conditions) > 1
            )
            group.start_soon(rank, VECTOR, nearest)
        if failed:
            raise failed[0]
        return fuse(rankings, top_k)

    async def _fulltext(
        self,
        place: MemoryPlace,
        terms: list[str],
        conditions: list[sa.ColumnElement[bool]],
        limit: int,
    ) -> list[MemoryHit]:
        return await self._read(
            f"search memory {place.memory}",
            functools.partial(ranked, place, terms, conditions, limit, self.memory_fulltext),
        )

    @property
    def memory_fulltext(self) -> FulltextCaches:
        """This store's scope indexes for full text (:mod:`.fulltext`)."""
        kept: FulltextCaches | None = getattr(self, "_memory_fulltext", None)
        if kept is None:
            kept = FulltextCaches(self._memory_cache_bytes)
            self._memory_fulltext = kept
        return kept

    @property
    def memory_vector_cache(self) -> VectorCache:
        """This store's cache of scope vectors (see :mod:`corral.store.sql.vector_cache`)."""
        cache: VectorCache | None = getattr(self, "_memory_vector_cache", None)
        if cache is None:
            cache = VectorCache(self._memory_cache_bytes)
            self._memory_vector_cache = cache
        return cache

    async def _nearest(
        self,
        place: MemoryPlace,
        embedder: str,
        values: list[float],
        conditions: list[sa.ColumnElement[bool]],
        limit: int,
        filtered: bool,
    ) -> list[MemoryHit]:
        """The ``limit`` entries nearest ``values``, exactly: pgvector's ``<=>`` in SQL
        where it exists, else a matrix product over the scope's cached vectors."""

        async def read(conn: AsyncConnection) -> list[MemoryHit]:
            kind = await self._vector_kind(conn)
            if kind == PGVECTOR:
                return await _nearest_in_sql(conn, kind, embedder, values, conditions, limit)
            try:
                matrix = await self._matrix(conn, kind, place, embedder)
            except ValueError as exc:  # rows of several sizes under one embedder's name
                raise MemoryInputError(f"the scope's vectors of {embedder!r}: {exc}") from None
            allowed = None
            if filtered:  # the ids of the entries the filters keep: scored alone
                ids = (await conn.execute(sa.select(_t.c.id).where(*conditions))).scalars()
                allowed = np.fromiter(ids, dtype=np.int64)
            try:
                best = matrix.nearest(values, limit, allowed)
            except ValueError as exc:
                raise MemoryInputError(f"the query's embedding: {exc}") from None
            if not best:
                return []
            query = sa.select(_t).where(_t.c.id.in_([entry_id for entry_id, _ in best]))
            rows = {row.id: row for row in (await conn.execute(query)).all()}
            return [
                MemoryHit(MEMORY_ENTRIES.record(rows[entry_id]), score, (VECTOR,))
                for entry_id, score in best
                if entry_id in rows  # deleted by another process since the matrix was read
            ]

        return await self._read(f"search memory {place.memory}", read)

    async def _matrix(
        self, conn: AsyncConnection, kind: str, place: MemoryPlace, embedder: str
    ) -> Matrix:
        """The scope's vectors of ``embedder``: cached if the scope's generation has not
        moved since, brought up to date from the scope's changes if it moved a little,
        else read whole (the generation first: never filed under a newer one)."""
        cache = self.memory_vector_cache
        key = (place.namespace, place.memory, place.scope_key, embedder)
        generation = int((await conn.execute(generation_of(place))).scalar() or 0)
        cached = cache.latest(key)
        if cached is not None and cached.generation == generation:
            return cached
        # one search of the scope at a time loads or updates it, the others then use it
        loading: RunTurns | None = getattr(self, "_memory_vector_loading", None)
        if loading is None:
            loading = self._memory_vector_loading = RunTurns()
        if cache.too_large.get(key) != generation:  # a scope kept: loaded once
            async with loading.turn("\x00".join(key)):
                cached = cache.latest(key)
                if cached is not None and cached.generation == generation:
                    return cached
                if cache.too_large.get(key) != generation:
                    return await self._matrix_read(conn, kind, place, embedder, generation, cached)
        # too large to keep: each search loads it for itself, at once
        return await self._matrix_read(conn, kind, place, embedder, generation, cached)

    async def _matrix_read(
        self,
        conn: AsyncConnection,
        kind: str,
        place: MemoryPlace,
        embedder: str,
        generation: int,
        cached: Matrix | None,
    ) -> Matrix:
        cache = self.memory_vector_cache
        key = (place.namespace, place.memory, place.scope_key, embedder)
        if cached is not None and cached.generation < generation:
            matrix = await self._updated(conn, kind, place, embedder, cached, generation)
            if matrix is not None:
                cache.put(key, matrix, updated=True)
                return matrix
        matrix = await _load(conn, kind, place, embedder, generation, None)
        cache.put(key, matrix)
        return matrix

    async def _updated(
        self,
        conn: AsyncConnection,
        kind: str,
        place: MemoryPlace,
        embedder: str,
        cached: Matrix,
        generation: int,
    ) -> Matrix | None:
        """``cached`` brought to ``generation`` by reading again the entries changed
        since; ``None`` when some generation's changes are no longer kept, or when they
        touch so many entries that reading the scope whole is as quick."""
        changed = await changed_entries(conn, place, cached.generation, generation)
        if changed is None or len(changed) > max(64, len(cached.ids) // 4):
            return None
        fresh = await _load(conn, kind, place, embedder, generation, changed)
        # a copy when the spare rows run out: tenths of a second for a large scope
        return await anyio.to_thread.run_sync(
            cached.updated, np.asarray(changed, dtype=np.int64), fresh
        )

    async def memory_stats(self, namespace: str, memory: str) -> MemoryStats:
        of_memory = sa.and_(_t.c.namespace == namespace, _t.c.memory == memory)
        with_vectors = (
            sa.select(sa.func.count())
            .select_from(_v.join(_t, _v.c.entry_id == _t.c.id))
            .where(of_memory)
            .scalar_subquery()
        )
        query = sa.select(
            sa.func.count(),
            sa.func.coalesce(sa.func.sum(sa.func.length(_t.c.text)), 0),
            sa.func.count(sa.distinct(_t.c.scope_key)),
            with_vectors,
        ).where(of_memory)
        row = await self._read(f"describe memory {memory}", fetch_first(query))
        assert row is not None  # an aggregate without GROUP BY has one row
        entries, chars, scopes, vectors = tuple[Any, ...](row)
        index = INDEX
        if vectors:
            index += f"; vectors: {await self.memory_vector_index()}"
        return MemoryStats(int(entries), int(chars), int(scopes), index, int(vectors))

    async def prune_memory(
        self,
        place: MemoryPlace,
        *,
        max_entries: int | None = None,
        max_age_days: float | None = None,
        now: float | None = None,
    ) -> int:
        when = time.time() if now is None else now

        async def write(conn: AsyncConnection) -> int:
            removed = await _prune(conn, place, when, max_entries, max_age_days)
            if removed:
                await _changed(conn, self._dialect, {place: removed})
            return len(removed)

        return await self._write(f"prune memory {place.memory}", write)


async def _load(
    conn: AsyncConnection,
    kind: str,
    place: MemoryPlace,
    embedder: str,
    generation: int,
    only: list[int] | None,
) -> Matrix:
    """The scope's vectors of ``embedder`` (of the entries ``only``, if given)."""
    # IN, not a join: the vectors are read in entry id order, no sort (half the time)
    # real[] goes out in its binary form (array_send): no Python float per element
    embedding = _v.c.embedding if kind == "blob" else sa.func.array_send(_v.c.embedding)
    ids: list[int] = []
    stored: list[bytes] = []
    # the ids of ``only`` (ascending) a statement's worth at a time: a quarter of a large
    # scope changed at once is more than a statement may bind
    parts = [None] if only is None else _parts(only, IDS_PER_STATEMENT)
    for part in parts:
        of_scope = sa.select(_t.c.id).where(at_place(place))
        if part is not None:
            of_scope = of_scope.where(_t.c.id.in_(part))
        statement = (
            sa.select(_v.c.entry_id, embedding)
            .where(_v.c.entry_id.in_(of_scope))
            .where(_v.c.embedder == embedder)
            .order_by(_v.c.entry_id)
        )
        for entry_id, value in (await conn.execute(statement)).all():
            ids.append(entry_id)
            stored.append(value)
    # decoding, normalising and quantising are tenths of a second for a large scope:
    # off the event loop, like the full-text index's tokenizing
    return await anyio.to_thread.run_sync(_decoded, kind, generation, ids, stored)


def _parts(ids: list[int], size: int) -> list[list[int] | None]:
    return [ids[start : start + size] for start in range(0, len(ids), size)]


def _decoded(kind: str, generation: int, ids: list[int], stored: list[bytes]) -> Matrix:
    """The matrix of the vectors ``stored`` (SQLite's blobs or ``array_send``'s bytes)."""
    if kind == "blob":
        vectors = decode_blobs(stored, len(stored[0]) // 4 if stored else 0)
    else:
        vectors = decode_arrays(stored)
    return Matrix.of(generation, ids, vectors)


async def _nearest_in_sql(
    conn: AsyncConnection,
    kind: str,
    embedder: str,
    values: list[float],
    conditions: list[sa.ColumnElement[bool]],
    limit: int,
) -> list[MemoryHit]:
    """pgvector: ``ORDER BY embedding <=> query LIMIT`` (exact: no ANN index is made)."""
    distance = postgres_distance(kind, values)
    statement = (
        sa.select(_t, distance.label("distance"))
        .select_from(_t.join(_v, _v.c.entry_id == _t.c.id))
        .where(_v.c.embedder == embedder, *conditions)
        .order_by(distance, _t.c.id)
        .limit(limit)
    )
    rows = (await conn.execute(statement)).all()
    return [
        MemoryHit(
            MEMORY_ENTRIES.record(tuple(row)[:_COLUMNS]), 1.0 - float(row.distance), (VECTOR,)
        )
        for row in rows
    ]


async def _prune(
    conn: AsyncConnection,
    place: MemoryPlace,
    now: float,
    max_entries: int | None,
    max_age_days: float | None,
) -> list[int]:
    """Apply a Memory's retention to one scope: drop entries older than ``max_age_days``
    and all but the ``max_entries`` most recently written. Returns the ids that went."""
    removed: list[int] = []
    if max_age_days is not None:
        cutoff = now - max_age_days * _SECONDS_PER_DAY
        old = _t.delete().where(at_place(place), _t.c.updated_at < cutoff).returning(_t.c.id)
        removed += (await conn.execute(old)).scalars()
    if max_entries is not None:
        kept = (
            sa.select(_t.c.id)
            .where(at_place(place))
            .order_by(_t.c.updated_at.desc(), _t.c.id.desc())
            .limit(max_entries)
        )
        extra = _t.delete().where(at_place(place), _t.c.id.not_in(kept)).returning(_t.c.id)
        removed += (await conn.execute(extra)).scalars()
    return removed
