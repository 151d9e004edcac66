"""The vectors of Memory scopes, kept in this process as numpy matrices for exact search.

A vector search compares the query with every vector of a scope (exact cosine: the
vectors are unit length, so a dot product). Doing that per row in SQL costs a function
call per row (SQLite without sqlite-vec) or an ``unnest`` per row (PostgreSQL without
pgvector); a float32 matrix product over the same vectors takes a few milliseconds at
100,000 entries of 384 dimensions. :class:`VectorCache` keeps one matrix per (namespace,
memory, scope key, embedder), with the entry id of each row.

It is kept correct by the scope's generation (``memory_generations``, migration 0012):
every write, delete and prune of the scope raises it in the same transaction, and a
search reads it (one indexed row) before using the matrix, so a change made by another
process (serve and workers sharing one store) is seen by the next search. The same
transaction notes which entries it wrote or deleted (``memory_changes``, migration
0013): a matrix of an older generation is brought up to date by reading those entries'
vectors again (:meth:`Matrix.updated`) - a write of a few entries does not reload the
scope - when the notes of every generation since are still kept and name fewer than a
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
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

#: the default byte budget of one store's cache (``CORRAL_MEMORY_VECTOR_CACHE_BYTES``)
DEFAULT_CACHE_BYTES = 256 * 1024 * 1024

#: (namespace, memory, scope key, embedder)
Key = tuple[str, str, str, str]


@dataclass(frozen=True)
class Matrix:
    """A scope's vectors: ``ids[i]`` is the entry of row ``i`` of ``vectors`` (float32,
    unit rows, C-contiguous), as of ``generation``."""

    generation: int
    ids: npt.NDArray[np.int64]
    vectors: npt.NDArray[np.float32]

    @property
    def nbytes(self) -> int:
        return int(self.ids.nbytes + self.vectors.nbytes)

    @staticmethod
    def of(generation: int, ids: list[int], rows: npt.NDArray[np.float32]) -> Matrix:
        """Rows of vectors (any float type) normalised once into a float32 matrix."""
        vectors = np.ascontiguousarray(rows, dtype=np.float32)
        if len(ids):
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            norms[norms == 0] = 1.0
            vectors /= norms
        return Matrix(generation, np.asarray(ids, dtype=np.int64), vectors)

    def updated(self, changed: npt.NDArray[np.int64], fresh: Matrix) -> Matrix:
        """This matrix at ``fresh.generation``: the rows of the ``changed`` entries
        replaced by their vectors now (``fresh``; a changed entry not in it was deleted,
        or lost its vector), copied once into a new matrix (a search may be reading this)."""
        keep = ~np.isin(self.ids, changed)
        kept = int(keep.sum())
        if kept and len(fresh.ids) and fresh.vectors.shape[1] != self.vectors.shape[1]:
            raise ValueError("vector dimensions differ")
        width = fresh.vectors.shape[1] if len(fresh.ids) else self.vectors.shape[1]
        vectors = np.empty((kept + len(fresh.ids), width), dtype=np.float32)
        if kept:
            np.compress(keep, self.vectors, axis=0, out=vectors[:kept])
        if len(fresh.ids):
            vectors[kept:] = fresh.vectors
        ids = np.concatenate([self.ids[keep], fresh.ids])
        return Matrix(fresh.generation, ids, vectors)

    def nearest(
        self,
        query: list[float],
        limit: int,
        allowed: npt.NDArray[np.int64] | None = None,
    ) -> list[tuple[int, float]]:
        """The ``limit`` rows closest to ``query`` (unit length) as (entry id, cosine),
        best first, ties by ascending id; only entries in ``allowed`` when it is given."""
        ids, vectors = self.ids, self.vectors
        if allowed is not None:
            keep = np.isin(ids, allowed, assume_unique=True)
            ids, vectors = ids[keep], vectors[keep]
        if not len(ids) or limit <= 0:
            return []
        if vectors.shape[1] != len(query):
            raise ValueError("vector dimensions differ")
        scores = vectors @ np.asarray(query, dtype=np.float32)
        if limit < len(scores):
            # the limit-th best score, then every row at least as good (ties kept whole)
            cut = np.partition(scores, len(scores) - limit)[len(scores) - limit]
            chosen = np.flatnonzero(scores >= cut)
        else:
            chosen = np.arange(len(scores))
        order = np.lexsort((ids[chosen], -scores[chosen]))[:limit]
        picked = chosen[order]
        return [(int(ids[n]), float(scores[n])) for n in picked]


class VectorCache:
    """Matrices by key, least recently used dropped first beyond ``max_bytes``."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self._matrices: OrderedDict[Key, Matrix] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.loads = 0  # matrices loaded whole from the store (misses), for tests and bench
        self.updates = 0  # matrices brought up to date from their scope's changes

    @property
    def nbytes(self) -> int:
        return self._bytes

    def keys(self) -> list[Key]:
        with self._lock:
            return list(self._matrices)

    def latest(self, key: Key) -> Matrix | None:
        """The matrix of ``key`` whatever its generation (to bring it up to date)."""
        with self._lock:
            matrix = self._matrices.get(key)
            if matrix is not None:
                self._matrices.move_to_end(key)
            return matrix

    def get(self, key: Key, generation: int) -> Matrix | None:
        """The matrix of ``key`` if it is of ``generation`` (else it is dropped)."""
        with self._lock:
            matrix = self._matrices.get(key)
            if matrix is None:
                return None
            if matrix.generation != generation:
                self._drop(key)
                return None
            self._matrices.move_to_end(key)
            return matrix

    def put(self, key: Key, matrix: Matrix, *, updated: bool = False) -> None:
        """Keep ``matrix`` (loaded whole, or ``updated`` from an older one) unless it is
        larger than the whole budget; evict to fit."""
        with self._lock:
            if updated:
                self.updates += 1
            else:
                self.loads += 1
            if key in self._matrices:
                self._drop(key)
            if matrix.nbytes > self.max_bytes:
                return
            while self._matrices and self._bytes + matrix.nbytes > self.max_bytes:
                self._drop(next(iter(self._matrices)))
            self._matrices[key] = matrix
            self._bytes += matrix.nbytes

    def _drop(self, key: Key) -> None:
        self._bytes -= self._matrices.pop(key).nbytes


def decode_blobs(blobs: list[bytes], dims: int) -> npt.NDArray[np.float32]:
    """SQLite's little-endian float32 blobs as one (n, dims) matrix."""
    joined = np.frombuffer(b"".join(blobs), dtype="<f4")
    return joined.reshape(len(blobs), dims).astype(np.float32, copy=True)


def decode_arrays(sent: list[bytes]) -> npt.NDArray[np.float32]:
    """PostgreSQL ``real[]`` values in ``array_send``'s binary form as one (n, dims) matrix.

    Each is a one-dimensional array: five big-endian int32 (dimensions, flags, element
    type, length, lower bound), then per element its byte length (4) and the float4."""
    if not sent:
        return np.zeros((0, 0), dtype=np.float32)
    dims = (len(sent[0]) - _ARRAY_HEADER) // 8
    words = np.frombuffer(b"".join(sent), dtype=">f4").reshape(len(sent), -1)
    if words.shape[1] != _ARRAY_HEADER // 4 + 2 * dims:
        raise ValueError("vector dimensions differ")
    return words[:, _ARRAY_HEADER // 4 + 1 :: 2].astype(np.float32)


_ARRAY_HEADER = 20
