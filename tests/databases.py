"""Test databases: a fresh PostgreSQL database per test, and plain access to any store URL.

PostgreSQL tests use the server at ``CORRAL_TEST_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``) and never share a database with
another test session. The contract tests run on the session's scratch
database, migrated once and wiped before each test (every table emptied, any
session left on it ended: a few milliseconds, where creating a database costs
a few hundred). Tests that change more than rows - migrations, triggers,
terminated connections - get a database of their own: a copy of a template
migrated once per session (``CREATE DATABASE ... TEMPLATE``), or an empty one.
Those are dropped after their test, the template and the scratch database
after the session. An unreachable server fails the tests;
``CORRAL_TEST_POSTGRES=skip`` skips them instead, on purpose only.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import asyncpg
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from corral.resources.secrets import SecretCipher
from corral.store.schema import metadata
from corral.store.sql import SqlStore, async_url

T = TypeVar("T")

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
PREFIX = "corral_test_"


def postgres_url() -> str:
    """The base URL of the test server (its database is only used for admin statements)."""
    return os.environ.get("CORRAL_TEST_POSTGRES_URL") or DEFAULT_URL


def postgres_skipped() -> bool:
    """Whether the user asked to skip PostgreSQL tests (``CORRAL_TEST_POSTGRES=skip``)."""
    return os.environ.get("CORRAL_TEST_POSTGRES", "").lower() == "skip"


def in_thread(coroutine: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion on a loop of its own, from sync code.

    A thread keeps it away from the event loop pytest-asyncio manages for the test.
    """
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine()).result()


class PostgresServer:
    """The PostgreSQL server of the tests: creates and drops their databases."""

    def __init__(self, base_url: str) -> None:
        self.base_url = sa.make_url(base_url)
        self._template: str | None = None
        self._scratch: str | None = None

    def url(self, database: str) -> str:
        """``postgresql://`` URL of ``database`` on this server."""
        return self.base_url.set(database=database).render_as_string(hide_password=False)

    async def admin(self, *statements: str, database: str | None = None) -> list[Any]:
        """Run ``statements`` on the base database (or ``database``), outside a transaction;
        returns the last one's rows."""
        conn = await asyncpg.connect(self.url(database or self.base_url.database or "postgres"))
        try:
            rows: list[Any] = []
            for statement in statements:
                rows = await conn.fetch(statement)
            return rows
        finally:
            await conn.close()

    def check(self) -> str:
        """The server's version; raises when it cannot be reached."""
        [row] = in_thread(lambda: self.admin("SELECT version()"))
        return str(row[0])

    def create(self, *, migrated: bool) -> str:
        """A new database, migrated to the latest revision or empty; returns its name."""
        name = PREFIX + secrets.token_hex(6)
        template = self.template() if migrated else "template0"
        in_thread(lambda: self.admin(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
        return name

    def drop(self, name: str) -> None:
        """Drop a database, ending whatever sessions are still connected to it."""
        in_thread(lambda: self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def scratch(self) -> str:
        """The session's scratch database, migrated and empty: every table wiped, and any
        session a previous test left on it ended."""
        if self._scratch is None:
            self._scratch = self.create(migrated=True)
        in_thread(
            lambda: self.admin(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()",
                "BEGIN",
                "SET LOCAL synchronous_commit TO OFF",  # a test database need not survive a crash
                *(f"DELETE FROM {t.name}" for t in reversed(metadata.sorted_tables)),
                "COMMIT",
                database=self._scratch,
            )
        )
        return self._scratch

    def template(self) -> str:
        """The session's migrated template database, created on first use."""
        if self._template is None:
            name = PREFIX + "template_" + secrets.token_hex(6)
            in_thread(lambda: self.admin(f'CREATE DATABASE "{name}" TEMPLATE template0'))

            async def migrate() -> None:
                cipher = SecretCipher(key=SecretCipher.generate_key())
                store = await SqlStore.open(self.url(name), cipher=cipher)
                await store.close()

            in_thread(migrate)
            self._template = name
        return self._template

    def close(self) -> None:
        for name in (self._scratch, self._template):
            if name is not None:
                self.drop(name)
        self._scratch = self._template = None


async def on_database(url: str, work: Callable[[sa.Connection], T]) -> T:
    """Run ``work`` on a plain connection to the store at ``url``, in one committed transaction.

    The store's own connection setup is bypassed: this is how tests look at
    (or prepare) a database behind the store's back, on SQLite and PostgreSQL alike.
    """
    engine = create_async_engine(async_url(url), poolclass=NullPool)
    try:
        async with engine.begin() as conn:
            return await conn.run_sync(work)
    finally:
        await engine.dispose()


async def rows_of(url: str, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    """The rows of one query on the store at ``url``."""

    def query(conn: sa.Connection) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in conn.execute(sa.text(sql), params)]

    return await on_database(url, query)


async def delete_run(url: str, run_id: str) -> None:
    """Delete a run with its events and approvals behind the store's back (another process)."""

    def delete(conn: sa.Connection) -> None:
        for table, column in (("run_events", "run_id"), ("approvals", "run_id"), ("runs", "id")):
            conn.execute(sa.text(f"DELETE FROM {table} WHERE {column} = :id"), {"id": run_id})

    await on_database(url, delete)


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """Wait until ``check()`` holds; fail after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"still not true after {timeout} s")
        await asyncio.sleep(0.02)
