"""Memory generations: a counter per scope of a Memory, raised by every change.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27

``memory_generations`` holds one row per (namespace, memory, scope key) that was ever
written. Every write, delete and prune of the scope's entries raises its ``generation``
in the same transaction; a process that keeps the scope's vectors in memory reads the
counter before each search and reloads them when it moved (see
``corral.store.sql.vector_cache``). Existing scopes start without a row (generation 0).

PostgreSQL: the entries' ``tsvector`` becomes a stored generated column, ``fts_vector``,
with the GIN index on it (instead of on the expression): ranking a match by ``ts_rank``
reads it instead of parsing the text again for every matching entry - at 100,000 entries
that was seconds per search.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


_POSTGRES_UP = [
    "ALTER TABLE memory_entries ADD COLUMN fts_vector tsvector "
    "GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, text)) STORED",
    "CREATE INDEX ix_memory_entries_fts_vector ON memory_entries USING GIN (fts_vector)",
    "DROP INDEX IF EXISTS ix_memory_entries_fts",
]
_POSTGRES_DOWN = [
    "CREATE INDEX ix_memory_entries_fts ON memory_entries "
    "USING GIN (to_tsvector('simple'::regconfig, text))",
    "DROP INDEX IF EXISTS ix_memory_entries_fts_vector",
    "ALTER TABLE memory_entries DROP COLUMN IF EXISTS fts_vector",
]


def upgrade() -> None:
    op.create_table(
        "memory_generations",
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("memory", sa.String(63), nullable=False),
        sa.Column("scope_key", sa.String(255), nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("namespace", "memory", "scope_key", name="pk_memory_generations"),
    )
    if op.get_bind().dialect.name == "postgresql":
        for statement in _POSTGRES_UP:
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for statement in _POSTGRES_DOWN:
            op.execute(statement)
    op.drop_table("memory_generations")
