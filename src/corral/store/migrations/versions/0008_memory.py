"""Memory entries, with a full-text index of their text in each dialect's own form.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A migration is a frozen snapshot: it spells out its types and its DDL.
Json = sa.JSON().with_variant(JSONB(), "postgresql")

# SQLite: an external-content FTS5 table over memory_entries.text, kept in step by
# triggers (so every write path, and a wipe, keeps the index true). Diacritics are kept
# as PostgreSQL's 'simple' configuration keeps them: both backends match the same words.
_SQLITE_UP = [
    "CREATE VIRTUAL TABLE memory_fts USING fts5(text, content='memory_entries', "
    "content_rowid='id', tokenize='unicode61 remove_diacritics 0')",
    "CREATE TRIGGER memory_entries_fts_insert AFTER INSERT ON memory_entries BEGIN "
    "INSERT INTO memory_fts(rowid, text) VALUES (new.id, new.text); END",
    "CREATE TRIGGER memory_entries_fts_delete AFTER DELETE ON memory_entries BEGIN "
    "INSERT INTO memory_fts(memory_fts, rowid, text) VALUES ('delete', old.id, old.text); END",
    "CREATE TRIGGER memory_entries_fts_update AFTER UPDATE OF text ON memory_entries BEGIN "
    "INSERT INTO memory_fts(memory_fts, rowid, text) VALUES ('delete', old.id, old.text); "
    "INSERT INTO memory_fts(rowid, text) VALUES (new.id, new.text); END",
]
_SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS memory_entries_fts_update",
    "DROP TRIGGER IF EXISTS memory_entries_fts_delete",
    "DROP TRIGGER IF EXISTS memory_entries_fts_insert",
    "DROP TABLE IF EXISTS memory_fts",
]
# PostgreSQL: a GIN index on the expression the search matches (corral.store.sql.memory).
_POSTGRES_UP = [
    "CREATE INDEX ix_memory_entries_fts ON memory_entries "
    "USING GIN (to_tsvector('simple'::regconfig, text))"
]
_POSTGRES_DOWN = ["DROP INDEX IF EXISTS ix_memory_entries_fts"]


def upgrade() -> None:
    op.create_table(
        "memory_entries",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
        ),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("memory", sa.String(63), nullable=False),
        sa.Column("scope_key", sa.String(255), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("metadata", Json, nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_memory_entries"),
    )
    op.create_index(
        "uq_memory_entries_place_key",
        "memory_entries",
        ["namespace", "memory", "scope_key", "key"],
        unique=True,
    )
    op.create_index(
        "uq_memory_entries_idempotency_key",
        "memory_entries",
        ["namespace", "memory", "idempotency_key"],
        unique=True,
    )
    op.create_index(
        "ix_memory_entries_place_updated_at",
        "memory_entries",
        ["namespace", "memory", "scope_key", "updated_at"],
    )
    dialect = op.get_bind().dialect.name
    for statement in _SQLITE_UP if dialect == "sqlite" else _POSTGRES_UP:
        op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    for statement in _SQLITE_DOWN if dialect == "sqlite" else _POSTGRES_DOWN:
        op.execute(statement)
    op.drop_table("memory_entries")
