"""Memory vectors: one embedding per memory entry, in each dialect's own form.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27

``memory_vectors`` holds the embedding of an entry (``entry_id``, deleted with it) and
which embedding model made it (``embedder``: the endpoint and the dimensions). The
``embedding`` column is the dialect's own, so the table is not part of the
dialect-neutral metadata (``corral.store.schema.DIALECT_OBJECTS``):

- SQLite: a BLOB of little-endian float32 (sqlite-vec's vector format);
- PostgreSQL: pgvector's ``vector`` when ``CREATE EXTENSION vector`` succeeds here (the
  extension is installed and the role may create it), else ``real[]``, searched by an
  exact cosine written in SQL. The store reads the column's type to know which.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy import exc as sa_exc

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLE = (
    "CREATE TABLE memory_vectors ("
    "entry_id {id_type} NOT NULL, "
    "embedder VARCHAR(255) NOT NULL, "
    "embedding {vector_type} NOT NULL, "
    "CONSTRAINT pk_memory_vectors PRIMARY KEY (entry_id), "
    "CONSTRAINT fk_memory_vectors_entry_id_memory_entries FOREIGN KEY (entry_id) "
    "REFERENCES memory_entries (id) ON DELETE CASCADE)"
)


def _pgvector(bind: sa.Connection) -> bool:
    """Whether pgvector is (or could now be made) available in this database."""
    try:
        with bind.begin_nested():
            bind.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS vector")
    except sa_exc.DBAPIError:  # not installed, or this role may not create it
        return False
    return True


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        op.execute(_TABLE.format(id_type="INTEGER", vector_type="BLOB"))
        return
    vector_type = "vector" if _pgvector(bind) else "real[]"
    op.execute(_TABLE.format(id_type="BIGINT", vector_type=vector_type))


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS memory_vectors")
