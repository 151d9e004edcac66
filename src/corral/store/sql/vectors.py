"""Memory vectors in the SQL store: their storage form and their distance, per dialect.

An entry's embedding lives in ``memory_vectors`` (migration 0010), unit length (so a
cosine is a dot product), with the ``embedder`` that made it. The store's search ranks by
pgvector's ``<=>`` where it exists, else over an in-process matrix
(:mod:`corral.store.sql.vector_cache`); the per-row functions below remain for SQL:

- SQLite: ``vec_distance_cosine`` of sqlite-vec (PyPI ``sqlite-vec``), loaded into each
  connection. A Python whose ``sqlite3`` cannot load extensions (built without
  ``--enable-loadable-sqlite-extensions``, as pyenv builds are by default) gets a
  function of the same name and meaning written with numpy, registered on each
  connection: the same SQL, slower. :func:`sqlite_vector_index` says which one runs.
- PostgreSQL: pgvector's ``<=>`` on a ``vector`` column when the migration could
  create the extension; else the column is ``real[]`` and the dot product of the unit
  vectors is computed in SQL (``unnest`` of both arrays).
"""

from __future__ import annotations

import functools
import importlib.metadata
import math
import sqlite3
from collections.abc import Sequence
from typing import Any

import numpy as np
import sqlalchemy as sa

from corral.core.errors import ConfigurationError
from corral.store.sql.vector_scan import SEARCH

__all__ = [
    "memory_vectors",
    "pack",
    "sqlite_vector_index",
    "unit",
]

#: the vector table (its ``embedding`` column's type is the dialect's: see the module)
memory_vectors = sa.table(
    "memory_vectors",
    sa.column("entry_id", sa.BigInteger),
    sa.column("embedder", sa.String),
    sa.column("embedding"),
)

#: whether this Python's sqlite3 module can load extensions at all
CAN_LOAD_EXTENSIONS = hasattr(sqlite3.Connection, "enable_load_extension")
_loaded_sqlite_vec: str | None = None


def unit(values: Sequence[float]) -> list[float]:
    """``values`` scaled to length 1 (a zero vector cannot be compared: refused)."""
    vector = np.asarray(values, dtype=np.float64)
    norm = float(np.linalg.norm(vector))
    if not np.isfinite(norm) or norm == 0.0:
        raise ValueError("a zero or non-finite vector has no direction to compare")
    return (vector / norm).tolist()  # type: ignore[no-any-return]


def pack(values: Sequence[float]) -> bytes:
    """A vector as sqlite-vec stores it: little-endian float32."""
    return np.asarray(values, dtype="<f4").tobytes()


# --------------------------------------------------------------------------- SQLite


@functools.lru_cache(maxsize=8)
def _query_vector(blob: bytes) -> tuple[Any, float]:
    vector = np.frombuffer(blob, dtype="<f4")
    return vector, math.sqrt(float(np.dot(vector, vector)))


def _cosine_distance(stored: bytes | None, query: bytes | None) -> float | None:
    """sqlite-vec's ``vec_distance_cosine`` for float32 blobs, in numpy: 1 - cosine.
    (Called once per stored vector: dot products only, the query's norm computed once.)"""
    if stored is None or query is None:
        return None
    a = np.frombuffer(stored, dtype="<f4")
    b, b_norm = _query_vector(query)  # the same query blob for every row of one search
    if a.shape != b.shape:
        raise ValueError("vector dimensions differ")
    denominator = math.sqrt(float(np.dot(a, a))) * b_norm
    if denominator == 0.0:
        return None
    return 1.0 - float(np.dot(a, b)) / denominator


def _sqlite_vec_path() -> str | None:
    try:
        import sqlite_vec  # type: ignore[import-untyped]
    except ImportError:
        return None
    return str(sqlite_vec.loadable_path())


async def setup_connection(conn: Any) -> None:
    """Give an aiosqlite connection ``vec_distance_cosine``: sqlite-vec's, or the numpy
    one when extensions cannot be loaded here (see :func:`sqlite_vector_index`)."""
    global _loaded_sqlite_vec
    path = _sqlite_vec_path() if CAN_LOAD_EXTENSIONS else None
    if path is not None:
        try:
            await conn.enable_load_extension(True)
            await conn.load_extension(path)
            await conn.enable_load_extension(False)
        except sqlite3.Error as exc:
            raise ConfigurationError(f"cannot load sqlite-vec from {path}: {exc}") from exc
        _loaded_sqlite_vec = _sqlite_vec_version()
        return
    await conn.create_function("vec_distance_cosine", 2, _cosine_distance, deterministic=True)


def _sqlite_vec_version() -> str:
    try:
        return importlib.metadata.version("sqlite-vec")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


#: how the store searches vectors without pgvector (see corral.store.sql.vector_scan)
CACHED_INDEX = SEARCH


def sqlite_vector_index() -> str:
    """How vectors are searched on SQLite: the cached matrix, not a function per row
    (``vec_distance_cosine`` stays registered on each connection, for SQL of one's own)."""
    return CACHED_INDEX


def sqlite_distance(query: bytes) -> sa.ColumnElement[Any]:
    """The cosine distance of each stored vector to ``query`` (lower is closer)."""
    return sa.func.vec_distance_cosine(
        memory_vectors.c.embedding, sa.bindparam("query_vector", query, sa.LargeBinary)
    )


# --------------------------------------------------------------------------- PostgreSQL

PGVECTOR = "vector"
REAL_ARRAY = "real[]"


def postgres_embedding_type() -> sa.TextClause:
    """The type of the ``embedding`` column: ``vector`` or ``real[]`` (see the migration)."""
    return sa.text(
        "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
        "WHERE a.attrelid = 'memory_vectors'::regclass AND a.attname = 'embedding'"
    )


def postgres_vector_literal(values: Sequence[float]) -> str:
    """A vector as pgvector's text form (``[1,2,3]``), cast to ``vector`` in the statement."""
    return "[" + ",".join(repr(float(x)) for x in values) + "]"


def postgres_stored(kind: str, values: Sequence[float]) -> sa.ColumnElement[Any]:
    """A vector as the ``embedding`` column of ``kind`` takes it."""
    if kind == PGVECTOR:
        return sa.cast(sa.literal(postgres_vector_literal(values), sa.Text), _Vector())
    return sa.cast(sa.literal([float(x) for x in values], _REAL_ARRAY), _REAL_ARRAY)


def postgres_param(kind: str) -> sa.ColumnElement[Any]:
    """The ``embedding`` of an INSERT run for many rows: the parameter ``embedding`` holds
    :func:`postgres_value` of each vector."""
    if kind == PGVECTOR:
        return sa.cast(sa.bindparam("embedding", type_=sa.Text), _Vector())
    return sa.bindparam("embedding", type_=_REAL_ARRAY)


def postgres_value(kind: str, values: Sequence[float]) -> Any:
    """A vector as the parameter of :func:`postgres_param` takes it."""
    if kind == PGVECTOR:
        return postgres_vector_literal(values)
    return [float(x) for x in values]


def postgres_distance(kind: str, values: Sequence[float]) -> sa.ColumnElement[Any]:
    """The cosine distance of each stored vector to ``values`` on a column of ``kind``."""
    column = memory_vectors.c.embedding
    query = postgres_stored(kind, values)
    if kind == PGVECTOR:
        return column.op("<=>")(query)
    # unit vectors: the cosine is the dot product, summed over both arrays in step
    pairs = sa.func.unnest(column, query).table_valued("a", "b").render_derived()
    dot = sa.select(sa.func.sum(pairs.c.a * pairs.c.b)).scalar_subquery()
    return sa.literal(1.0, sa.Double) - dot


class _Vector(sa.types.UserDefinedType[Any]):
    """pgvector's ``vector`` (only ever cast to: values go out as text)."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return "vector"


_REAL_ARRAY = sa.ARRAY(sa.REAL)
