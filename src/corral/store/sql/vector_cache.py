"""The vectors of Memory scopes, kept in this process as numpy matrices for exact search.

A vector search compares the query with every vector of a scope (exact cosine: the
vectors are unit length, so a dot product). Doing that per row in SQL costs a function
call per row (SQLite) or an ``unnest`` per row (PostgreSQL without
pgvector); numpy over a matrix of the same vectors, and its int8 copy, takes a few
milliseconds at 100,000 entries of 384 dimensions (:mod:`corral.store.sql.vector_scan`).
:class:`VectorCache` keeps one matrix per (namespace, memory, scope key, embedder), with
the entry id of each row.

It is kept correct by the scope's generation (``memory_generations``, migration 0012):
every write, delete and prune of the scope raises it in the same transaction, and a
search reads it (one indexed row) before using the matrix, so a change made by another
process (serve and workers sharing one store) is seen by the next search. The same
transaction notes which entries it wrote or deleted (``memory_changes``, migration
0013): a matrix of an older generation is brought up to date by reading those entries'
vectors again (:meth:`Matrix.updated`: their old rows marked dead, the new ones appended
in spare rows) - a write of a few entries neither reloads nor copies the scope - when the notes of every generation since are still kept and name fewer than a
quarter of its rows; else the scope is loaded whole. The generation is read before the
notes and the vectors are, so a matrix is never filed under a generation newer than its
contents (on PostgreSQL, where each read sees the latest commit, its contents may be
newer: reading an entry again is idempotent, so the next update still ends right).

The cache is bounded by bytes (``CORRAL_MEMORY_VECTOR_CACHE_BYTES``): the least
recently used matrices are dropped to make room, and a scope larger than the whole
budget is searched from a matrix loaded for that search alone (still exact, slower).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from corral.store.sql.scope_cache import ScopeCache
from corral.store.sql.vector_scan import (
    FIRST_PASS,
    FIRST_PASS_MIN_ROWS,
    Codes,
    best,
    candidates,
    exact,
    quantise,
)

#: the default byte budget of one store's cache (``CORRAL_MEMORY_VECTOR_CACHE_BYTES``)
DEFAULT_CACHE_BYTES = 256 * 1024 * 1024

#: (namespace, memory, scope key, embedder)
Key = tuple[str, str, str, str]


#: the id of a row whose entry changed after the row was read (a search skips it)
DEAD = -1


class _Rows:
    """The rows behind the matrices of one scope (float32, and their int8 codes when the
    first pass runs): a matrix is a view of the first rows, and the spare rows after
    them take the vectors of later writes, no copy made. Only the matrix that ends at
    ``used`` may append (under ``lock``): one derived from an older one copies instead,
    so no view ever sees its rows written over."""

    def __init__(self, buffer: npt.NDArray[np.float32], codes: Codes | None, used: int) -> None:
        self.buffer = buffer
        self.codes = codes
        self.used = used
        self.lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes) + (self.codes.nbytes if self.codes is not None else 0)


@dataclass(frozen=True)
class Matrix:
    """A scope's vectors: ``ids[i]`` is the entry of row ``i`` of ``vectors`` (float32,
    unit rows, C-contiguous) and of ``codes`` (the same rows in int8, see
    :mod:`corral.store.sql.vector_scan`; ``None`` without simsimd), as of ``generation``;
    ``dead`` rows (id :data:`DEAD`) are older vectors of entries changed since, skipped
    by :meth:`nearest`."""

    generation: int
    ids: npt.NDArray[np.int64]
    vectors: npt.NDArray[np.float32]
    codes: Codes | None
    dead: int = 0
    rows: _Rows | None = field(default=None, compare=False, repr=False)

    @property
    def nbytes(self) -> int:
        if self.rows is not None:
            return int(self.ids.nbytes) + self.rows.nbytes
        codes = self.codes.nbytes if self.codes is not None else 0
        return int(self.ids.nbytes + self.vectors.nbytes) + codes

    @staticmethod
    def of(generation: int, ids: list[int], rows: npt.NDArray[np.float32]) -> Matrix:
        """Rows of vectors (any float type) normalised once into a float32 matrix, with
        a sixteenth more rows spare for later writes."""
        vectors = np.ascontiguousarray(rows, dtype=np.float32)
        if len(ids):
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            norms[norms == 0] = 1.0
            vectors /= norms
        codes = quantise(vectors) if FIRST_PASS else None
        return _with_spare(generation, np.asarray(ids, dtype=np.int64), [(vectors, codes)], 0)

    def updated(self, changed: npt.NDArray[np.int64], fresh: Matrix) -> Matrix:
        """This matrix at ``fresh.generation``: the rows of the ``changed`` entries dead,
        and their vectors now (``fresh``; a changed entry not in it was deleted, or lost
        its vector) appended in the spare rows - no copy of the rest, which a search may
        be reading. Copied into a new matrix, dead rows dropped, when the spare rows run
        out, another update appended first, or a quarter of the rows would be dead."""
        n, width = len(self.ids), self.vectors.shape[1]
        if len(fresh.ids) and n > self.dead and fresh.vectors.shape[1] != width:
            raise ValueError("vector dimensions differ")
        stale = np.isin(self.ids, changed)
        dead = self.dead + int(stale.sum())
        added = len(fresh.ids)
        rows = self.rows
        if rows is not None and dead <= n // 4 and (not added or n > self.dead):
            with rows.lock:
                if rows.used == n and n + added <= len(rows.buffer):
                    if added:
                        rows.buffer[n : n + added] = fresh.vectors
                        if rows.codes is not None and fresh.codes is not None:
                            rows.codes.put(n, fresh.codes)
                    rows.used = n + added
                    ids = np.concatenate([np.where(stale, DEAD, self.ids), fresh.ids])
                    codes = rows.codes.take(slice(0, n + added)) if rows.codes is not None else None
                    return Matrix(
                        fresh.generation, ids, rows.buffer[: n + added], codes, dead, rows
                    )
        keep = ~stale & (self.ids != DEAD)
        parts: list[_Part] = []
        if keep.any():
            parts.append(
                (self.vectors[keep], self.codes.take(keep) if self.codes is not None else None)
            )
        if added:
            parts.append((fresh.vectors, fresh.codes))
        return _with_spare(
            fresh.generation, np.concatenate([self.ids[keep], fresh.ids]), parts, width
        )

    def nearest(
        self,
        query: list[float],
        limit: int,
        allowed: npt.NDArray[np.int64] | None = None,
        *,
        first_pass: bool | None = None,
    ) -> list[tuple[int, float]]:
        """The ``limit`` rows closest to ``query`` (unit length) as (entry id, cosine),
        best first, ties by ascending id; only entries in ``allowed`` when it is given.
        The int8 first pass runs when ``first_pass`` says so, by default over at least
        :data:`~corral.store.sql.vector_scan.FIRST_PASS_MIN_ROWS` live rows; its answer
        is the float32 pass's, to the bit."""
        ids = self.ids
        live: npt.NDArray[np.bool_] | None = None
        if allowed is not None:
            live = np.isin(ids, allowed, assume_unique=not self.dead) & (ids != DEAD)
        elif self.dead:
            live = ids != DEAD
        count = len(ids) - self.dead if live is None else int(live.sum())
        limit = min(limit, count)
        if limit <= 0:
            return []
        if self.vectors.shape[1] != len(query):
            raise ValueError("vector dimensions differ")
        vector = np.asarray(query, dtype=np.float32)
        if first_pass is None:  # a filter keeping few rows: those alone, in float32
            first_pass = count >= FIRST_PASS_MIN_ROWS
        rows = None
        if first_pass and self.codes is not None:
            rows = candidates(self.codes, vector, limit, live)
        if rows is None:  # every (live) row scored exactly
            rows = np.flatnonzero(live) if live is not None else None
            scores = exact(self.vectors if rows is None else self.vectors[rows], vector)
            rows = np.arange(len(ids)) if rows is None else rows
        else:
            scores = exact(self.vectors[rows], vector)
        picked = best(ids[rows], scores, limit)
        return [(int(ids[rows[n]]), float(scores[n])) for n in picked]


#: the float32 rows of a part of a matrix, and their codes
_Part = tuple[npt.NDArray[np.float32], Codes | None]


def _with_spare(
    generation: int, ids: npt.NDArray[np.int64], parts: list[_Part], width: int
) -> Matrix:
    """A matrix of the rows of ``parts`` one after another, in a buffer with spare rows."""
    used = sum(len(vectors) for vectors, _ in parts)
    width = parts[0][0].shape[1] if parts else width
    capacity = used + used // 16
    buffer = np.empty((capacity, width), dtype=np.float32)
    codes = Codes.empty(capacity, width) if FIRST_PASS else None
    at = 0
    for vectors, part_codes in parts:
        buffer[at : at + len(vectors)] = vectors
        if codes is not None:
            codes.put(at, part_codes if part_codes is not None else quantise(vectors))
        at += len(vectors)
    view = codes.take(slice(0, used)) if codes is not None else None
    return Matrix(generation, ids, buffer[:used], view, 0, _Rows(buffer, codes, used))


class VectorCache(ScopeCache[Key, Matrix]):
    """Matrices by key (:class:`~corral.store.sql.scope_cache.ScopeCache`)."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        super().__init__(max_bytes)


def decode_blobs(blobs: list[bytes], dims: int) -> npt.NDArray[np.float32]:
    """SQLite's little-endian float32 blobs as one (n, dims) matrix; a blob of another
    length is an error (the store takes any vector under an embedder's name: rows of
    several sizes read end to end would be vectors cut out of their neighbours)."""
    if any(size != 4 * dims for size in set(map(len, blobs))):
        raise ValueError("vector dimensions differ")
    joined = np.frombuffer(b"".join(blobs), dtype="<f4")
    return joined.reshape(len(blobs), dims).astype(np.float32, copy=True)


def decode_arrays(sent: list[bytes]) -> npt.NDArray[np.float32]:
    """PostgreSQL ``real[]`` values in ``array_send``'s binary form as one (n, dims) matrix.

    Each is a one-dimensional array: five big-endian int32 (dimensions, flags, element
    type, length, lower bound), then per element its byte length (4) and the float4."""
    if not sent:
        return np.zeros((0, 0), dtype=np.float32)
    if len(set(map(len, sent))) > 1:  # of several sizes (see decode_blobs)
        raise ValueError("vector dimensions differ")
    dims = (len(sent[0]) - _ARRAY_HEADER) // 8
    words = np.frombuffer(b"".join(sent), dtype=">f4").reshape(len(sent), -1)
    if words.shape[1] != _ARRAY_HEADER // 4 + 2 * dims:
        raise ValueError("vector dimensions differ")
    return words[:, _ARRAY_HEADER // 4 + 1 :: 2].astype(np.float32)


_ARRAY_HEADER = 20
