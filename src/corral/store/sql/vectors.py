"""Memory vectors in the SQL store: their storage form and their distance, per dialect.

An entry's embedding lives in ``memory_vectors`` (migration 0010), unit length (so a
cosine is a dot product), with the ``embedder`` that made it. The store's search ranks by
pgvector's ``<=>`` where it exists, else over an in-process matrix
(:mod:`corral.store.sql.vector_cache`):

- SQLite: a BLOB of little-endian float32 (:func:`pack`), always searched in process.
- PostgreSQL: pgvector's ``<=>`` on a ``vector`` column when the migration could
  create the extension; else the column is ``real[]``, searched in process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import sqlalchemy as sa

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


def unit(values: Sequence[float]) -> list[float]:
    """``values`` scaled to length 1 (a zero vector cannot be compared: refused)."""
    vector = np.asarray(values, dtype=np.float64)
    norm = float(np.linalg.norm(vector))
    if not np.isfinite(norm) or norm == 0.0:
        raise ValueError("a zero or non-finite vector has no direction to compare")
    return (vector / norm).tolist()  # type: ignore[no-any-return]


def pack(values: Sequence[float]) -> bytes:
    """A vector as SQLite stores it: little-endian float32."""
    return np.asarray(values, dtype="<f4").tobytes()


#: how the store searches vectors without pgvector (see corral.store.sql.vector_scan)
CACHED_INDEX = SEARCH


def sqlite_vector_index() -> str:
    """How vectors are searched on SQLite: the cached matrix."""
    return CACHED_INDEX


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
