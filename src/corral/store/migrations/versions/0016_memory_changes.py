"""Memory changes: which entries each generation of a scope changed, and (SQLite) the
full-text index's document frequencies.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27

``memory_changes`` holds, for each raise of a scope's generation (``memory_generations``),
the ids of the entries that raise wrote or deleted (``0`` when it changed none), in the
same transaction. A process caching the scope's vectors reads the rows after the
generation it holds and reloads only those entries (``corral.store.sql.vector_cache``);
each write keeps the scope's last generations only, and a cache older than those loads
the scope whole.

SQLite: ``memory_fts_vocab`` (fts5vocab, ``row``) tells how many entries hold a word,
which the full-text search needs to bound a word's BM25 score before reading its matches
(``corral.store.sql.fulltext_sqlite``).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SQLITE_UP = ["CREATE VIRTUAL TABLE memory_fts_vocab USING fts5vocab(memory_fts, 'row')"]
_SQLITE_DOWN = ["DROP TABLE IF EXISTS memory_fts_vocab"]


def upgrade() -> None:
    op.create_table(
        "memory_changes",
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("memory", sa.String(63), nullable=False),
        sa.Column("scope_key", sa.String(255), nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.Column("entry_id", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint(
            "namespace", "memory", "scope_key", "generation", "entry_id", name="pk_memory_changes"
        ),
    )
    if op.get_bind().dialect.name == "sqlite":
        for statement in _SQLITE_UP:
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for statement in _SQLITE_DOWN:
            op.execute(statement)
    op.drop_table("memory_changes")
