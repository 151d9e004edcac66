"""Engine plumbing of the SQL store: URLs, driver errors, connection setup, migrations.

Driver and SQLAlchemy exceptions are converted here (:func:`db_errors`) so
nothing vendor specific leaves the store. SQLite connections run in WAL mode
with ``synchronous=FULL``, foreign keys on and a busy timeout; SQLAlchemy (not
the sqlite3 module) emits ``BEGIN``, and connections carrying the
:data:`WRITE` execution option begin with ``BEGIN IMMEDIATE``. PostgreSQL
connections (asyncpg) come from a bounded pool and run at ``READ COMMITTED``:
the statements lock the rows they decide on (see
:mod:`corral.store.sql.statements`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from corral.core.errors import ConfigurationError, ConflictError
from corral.core.private_files import private_directory
from corral.core.settings import SQLITE_BUSY_TIMEOUT_SECONDS
from corral.store.base import StoreError
from corral.store.schema import LATEST_REVISION

MIGRATIONS_DIR = Path(__file__).parent.parent / "migrations"
BUSY_TIMEOUT_SECONDS = SQLITE_BUSY_TIMEOUT_SECONDS
DEFAULT_POOL_SIZE = 10
"""PostgreSQL connections a store keeps open (``CORRAL_DB_POOL_SIZE``)."""
MIGRATION_LOCK = -5138809972234850590
"""The PostgreSQL advisory lock migrations run under (from the hash of ``corral.store.migrations``)."""
WRITE = "corral_write"
"""Execution option of the connections that open write transactions."""


def async_url(url: str) -> sa.URL:
    """``sqlite:///x.db`` -> ``sqlite+aiosqlite:///x.db``; ``postgresql://`` -> ``+asyncpg``."""
    try:
        parsed = sa.make_url(url)
    except sa_exc.ArgumentError as exc:
        raise ConfigurationError(f"invalid database URL {url!r}: {exc}") from exc
    driver = parsed.drivername
    if driver == "sqlite":
        return parsed.set(drivername="sqlite+aiosqlite")
    if driver in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+asyncpg")
    return parsed


def pool_options(url: sa.URL, pool_size: int) -> dict[str, Any]:
    """``create_async_engine`` options for ``url``: a bounded pool on PostgreSQL.

    As many connections again as ``pool_size`` may be opened for bursts.
    Connections are not pinged before use (``pool_pre_ping`` would cost a
    round trip per operation): one that died while idle fails its operation
    before COMMIT, which :mod:`corral.store.sql.transaction` runs again on a
    fresh connection, and that first failure invalidates the whole pool. The
    application name lets an operator (and the tests) find the store's
    sessions in ``pg_stat_activity``.
    """
    if url.get_backend_name() != "postgresql":
        return {}
    if pool_size < 1:
        raise ConfigurationError(f"the pool size must be at least 1, not {pool_size}")
    return {
        "pool_size": pool_size,
        "max_overflow": pool_size,
        "connect_args": {"server_settings": {"application_name": "corral"}},
    }


# --------------------------------------------------------------------------- errors


@contextmanager
def db_errors(action: str) -> Iterator[None]:
    """Convert driver and SQLAlchemy exceptions into Corral errors, at the boundary."""
    try:
        yield
    except sa_exc.IntegrityError as exc:
        raise ConflictError(
            f"cannot {action}: it conflicts with stored state ({cause(exc)})"
        ) from exc
    except sa_exc.SQLAlchemyError as exc:
        raise StoreError(f"cannot {action}: {cause(exc)}") from exc
    except OSError as exc:
        raise StoreError(f"cannot {action}: {exc}") from exc


def cause(exc: BaseException) -> str:
    """What went wrong in a driver or SQLAlchemy exception, said for a person."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    lowered = text.lower()
    if "database is locked" in lowered or "database is busy" in lowered:
        return f"the database stayed locked by another writer past the busy timeout ({text})"
    if "disk is full" in lowered or "no space" in lowered:
        return f"the disk is full ({text})"
    if "unable to open database file" in lowered:
        return f"the database file cannot be opened ({text})"
    if "readonly" in lowered or "read-only" in lowered:
        return f"the database is read-only ({text})"
    return text


# --------------------------------------------------------------------------- SQLite setup


def sqlite_file(url: sa.URL) -> str | None:
    """The path of the SQLite file ``url`` names; ``None`` for memory, URIs or other databases."""
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:") or url.query:
        return None
    return str(Path(database).expanduser())


def prepare_sqlite_path(url: sa.URL) -> None:
    """Create the database file's directory and the file itself, readable by its owner only.

    The file is created 0600 (an existing one is tightened to 0600 when it is
    ours): it holds every run's messages and tool outputs. SQLite gives the
    ``-wal`` and ``-shm`` files it creates later the database file's mode, so
    they are 0600 too; sidecars left by an older version are tightened here.
    """
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database).expanduser()
    private_directory(path.parent, tighten=False)  # made 0700; an existing one is the operator's
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o600)  # an empty file is an empty database
    try:
        with suppress(PermissionError):  # someone else's file: theirs to guard
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm", "-journal"):
        with suppress(FileNotFoundError, PermissionError):
            os.chmod(f"{path}{suffix}", 0o600)


def configure_sqlite(engine: AsyncEngine, busy_timeout_seconds: float) -> None:
    busy_ms = int(busy_timeout_seconds * 1000)

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take BEGIN away from the sqlite3 module: it would not begin before SELECTs or DDL.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = FULL")
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()

    def on_begin(conn: sa.Connection) -> None:
        write = conn.get_execution_options().get(WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    event.listen(engine.sync_engine, "connect", on_connect)
    event.listen(engine.sync_engine, "begin", on_begin)


async def lock_migrations(conn: AsyncConnection) -> None:
    """Make concurrent migrations of one database take turns, until the transaction ends.

    SQLite's ``BEGIN IMMEDIATE`` does it already; PostgreSQL takes a
    transaction-scoped advisory lock, so processes opening a new database at
    once wait for the first one and then find the schema current.
    """
    if conn.dialect.name == "postgresql":
        await conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})


def current_revision(conn: sa.Connection) -> str | None:
    if not sa.inspect(conn).has_table("alembic_version"):
        return None
    revision = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
    return None if revision is None else str(revision)


def upgrade(conn: sa.Connection) -> None:
    if current_revision(conn) == LATEST_REVISION:
        return
    from alembic import command
    from alembic.config import Config
    from alembic.util import CommandError

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    config.attributes["connection"] = conn
    try:
        command.upgrade(config, "head")
    except CommandError as exc:
        raise StoreError(
            f"cannot migrate the store: {exc} (was it created by a newer Corral?)"
        ) from exc
