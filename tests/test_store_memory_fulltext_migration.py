"""Migration 0020_memory_fulltext: a database of the release before (full text in the
database: SQLite's FTS5 table and triggers, PostgreSQL's ``fts_vector`` and its GIN index)
holding entries upgrades to full text ranked in process - the database's full-text
objects gone, its entries found - and downgrades to them again, rebuilt from the entries.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from corral.core.memory import MemoryPlace
from corral.resources.secrets import SecretCipher
from corral.store import open_store
from corral.store.schema import LATEST_REVISION
from corral.store.sql import MIGRATIONS_DIR
from databases import on_database, rows_of
from test_store import (  # noqa: F401 - fixtures
    cipher_fixture,
    sqlite_path,
    store_url_fixture,
)

NOTES = MemoryPlace("default", "notes")


def _migrate(conn: sa.Connection, revision: str, *, down: bool = False) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = conn
    (command.downgrade if down else command.upgrade)(config, revision)


def _fulltext_objects(conn: sa.Connection) -> list[str]:
    """The database's own full-text objects, by name."""
    if conn.dialect.name == "sqlite":
        statement = "SELECT name FROM sqlite_master WHERE name LIKE '%fts%' ORDER BY name"
    else:
        statement = (
            "SELECT relname FROM pg_class WHERE relname LIKE '%fts%' UNION ALL "
            "SELECT attname FROM pg_attribute WHERE attrelid = 'memory_entries'::regclass "
            "AND attname = 'fts_vector' AND NOT attisdropped ORDER BY 1"
        )
    return [str(row[0]) for row in conn.execute(sa.text(statement))]


@pytest.mark.empty_database
async def test_a_0019_database_with_entries_upgrades_and_downgrades(
    store_url: str, cipher: SecretCipher
) -> None:
    if store_url.startswith("sqlite"):
        sqlite_path(store_url).parent.mkdir(parents=True)

    def at_0019_with_entries(conn: sa.Connection) -> list[str]:
        _migrate(conn, "0019")
        for n, text in enumerate(["apple pie", "apple tart and pear", "plum"]):
            conn.execute(
                sa.text(
                    "INSERT INTO memory_entries (namespace, memory, scope_key, key, text,"
                    " metadata, created_at, updated_at) VALUES ('default', 'notes', '',"
                    " :key, :text, '{}', 1000.0, 1000.0)"
                ),
                {"key": f"k{n}", "text": text},
            )
        return _fulltext_objects(conn)

    before = await on_database(store_url, at_0019_with_entries)
    assert before  # the database's full-text index was there

    async with await open_store(store_url, cipher=cipher) as store:
        hits = await store.search_memory(NOTES, "apple pear", top_k=5)
        assert [hit.entry.key for hit in hits] == ["k1", "k0"]
    assert await rows_of(store_url, "SELECT version_num FROM alembic_version") == [
        (LATEST_REVISION,)
    ]
    assert await on_database(store_url, _fulltext_objects) == []

    def downgraded(conn: sa.Connection) -> tuple[list[str], int]:
        _migrate(conn, "0019", down=True)
        if conn.dialect.name == "sqlite":
            query = "SELECT count(*) FROM memory_fts WHERE memory_fts MATCH 'apple'"
        else:
            query = "SELECT count(*) FROM memory_entries WHERE fts_vector @@ 'apple'::tsquery"
        return _fulltext_objects(conn), int(conn.execute(sa.text(query)).scalar_one())

    objects, apples = await on_database(store_url, downgraded)
    assert objects == before and apples == 2
