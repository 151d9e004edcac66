"""Memory full text in process: the database's own full-text indexes go.

Revision ID: 0020_memory_fulltext
Revises: 0019
Create Date: 2026-12-02

Full-text search of Memory entries ranks by BM25 over each scope's words indexed in the
searching process (``corral.store.sql.fulltext``), the same on both dialects: nothing
reads the database's full-text indexes any more, and every write paid for them.

- SQLite: the FTS5 table ``memory_fts``, its triggers and ``memory_fts_vocab`` are
  dropped.
- PostgreSQL: the generated ``fts_vector`` column and its GIN index are dropped.

The downgrade makes them again (SQLite's FTS5 table rebuilt from the entries).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0020_memory_fulltext"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SQLITE_UP = [
    "DROP TABLE IF EXISTS memory_fts_vocab",
    "DROP TRIGGER IF EXISTS memory_entries_fts_update",
    "DROP TRIGGER IF EXISTS memory_entries_fts_delete",
    "DROP TRIGGER IF EXISTS memory_entries_fts_insert",
    "DROP TABLE IF EXISTS memory_fts",
]
_SQLITE_DOWN = [
    "CREATE VIRTUAL TABLE memory_fts USING fts5(text, content='memory_entries', "
    "content_rowid='id', tokenize='unicode61 remove_diacritics 0')",
    "CREATE TRIGGER memory_entries_fts_insert AFTER INSERT ON memory_entries BEGIN "
    "INSERT INTO memory_fts(rowid, text) VALUES (new.id, new.text); END",
    "CREATE TRIGGER memory_entries_fts_delete AFTER DELETE ON memory_entries BEGIN "
    "INSERT INTO memory_fts(memory_fts, rowid, text) VALUES ('delete', old.id, old.text); END",
    "CREATE TRIGGER memory_entries_fts_update AFTER UPDATE OF text ON memory_entries BEGIN "
    "INSERT INTO memory_fts(memory_fts, rowid, text) VALUES ('delete', old.id, old.text); "
    "INSERT INTO memory_fts(rowid, text) VALUES (new.id, new.text); END",
    "INSERT INTO memory_fts(memory_fts) VALUES ('rebuild')",
    "CREATE VIRTUAL TABLE memory_fts_vocab USING fts5vocab(memory_fts, 'row')",
]
_POSTGRES_UP = [
    "DROP INDEX IF EXISTS ix_memory_entries_fts_vector",
    "ALTER TABLE memory_entries DROP COLUMN IF EXISTS fts_vector",
]
_POSTGRES_DOWN = [
    "ALTER TABLE memory_entries ADD COLUMN fts_vector tsvector "
    "GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, text)) STORED",
    "CREATE INDEX ix_memory_entries_fts_vector ON memory_entries USING GIN (fts_vector)",
]


def upgrade() -> None:
    statements = _SQLITE_UP if op.get_bind().dialect.name == "sqlite" else _POSTGRES_UP
    for statement in statements:
        op.execute(statement)


def downgrade() -> None:
    statements = _SQLITE_DOWN if op.get_bind().dialect.name == "sqlite" else _POSTGRES_DOWN
    for statement in statements:
        op.execute(statement)
