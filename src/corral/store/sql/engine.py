"""The base of the SQL store: opening, migrating and closing it, and running one transaction.

:class:`SqlEngine` holds what every table group of :class:`~corral.store.sql.SqlStore`
shares: the engine and its writer connections, the secret cipher, the dialect,
and :meth:`SqlEngine._read` / :meth:`SqlEngine._write`, which run an operation's
body in one transaction and retry it when the connection drops
(:mod:`corral.store.sql.transaction`). The bodies below (:func:`fetch_all`,
:func:`fetch_first`, :func:`execute`) are the common one-statement ones.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Self, TypeVar

import anyio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from corral.resources.secrets import SecretCipher
from corral.store.base import Store
from corral.store.schema import LATEST_REVISION
from corral.store.sql.database import (
    BUSY_TIMEOUT_SECONDS,
    DEFAULT_POOL_SIZE,
    WRITE,
    async_url,
    configure_sqlite,
    current_revision,
    db_errors,
    lock_migrations,
    pool_options,
    prepare_sqlite_path,
    upgrade,
)
from corral.store.sql.transaction import transact
from corral.store.sql.vector_cache import DEFAULT_CACHE_BYTES

T = TypeVar("T")
Body = Callable[[AsyncConnection], Awaitable[T]]
"""What runs inside one transaction (see :mod:`corral.store.sql.transaction`)."""


class SqlEngine(Store):
    """The engine, transactions and lifecycle every part of the SQL store builds on."""

    #: the byte budget of this store's Memory vector cache (see sql/vector_cache.py)
    _memory_cache_bytes: int = DEFAULT_CACHE_BYTES

    def __init__(self, engine: AsyncEngine, cipher: SecretCipher) -> None:
        self._engine = engine
        # Same pool; connections from here open write transactions (BEGIN IMMEDIATE on SQLite).
        self._writer = engine.execution_options(**{WRITE: True})
        self._cipher = cipher
        self._dialect = engine.dialect.name
        self._run_turns = RunTurns()

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        cipher: SecretCipher,
        busy_timeout_seconds: float = BUSY_TIMEOUT_SECONDS,
        pool_size: int = DEFAULT_POOL_SIZE,
        memory_vector_cache_bytes: int | None = None,
    ) -> Self:
        """Connect, bring the schema up to date, and return the store.

        ``busy_timeout_seconds`` is how long SQLite waits for another writer's
        lock before the operation fails with :class:`StoreError`. ``pool_size``
        is how many PostgreSQL connections the store keeps open (as many again
        are opened for bursts). ``memory_vector_cache_bytes`` bounds the Memory vectors
        kept in process (:mod:`corral.store.sql.vector_cache`). Which class to open for a URL is
        :func:`corral.store.open_store`'s choice.
        """
        target = async_url(url)
        with db_errors("open the store"):
            if target.get_backend_name() == "sqlite":
                prepare_sqlite_path(target)
            engine = create_async_engine(target, **pool_options(target, pool_size))
            if engine.dialect.name == "sqlite":
                configure_sqlite(engine, busy_timeout_seconds)
        store = cls(engine, cipher)
        if memory_vector_cache_bytes is not None:
            store._memory_cache_bytes = memory_vector_cache_bytes
        try:
            await store._migrate()
            await store._start(target, busy_timeout_seconds)
        except BaseException:
            await engine.dispose()
            raise
        return store

    async def _start(self, url: sa.URL, busy_timeout_seconds: float) -> None:
        """Set up what a subclass needs beyond the engine, once the schema is current."""

    async def close(self) -> None:
        await self._engine.dispose()

    async def _migrate(self) -> None:
        with db_errors("open the store"):
            async with self._engine.connect() as conn:
                current = await conn.run_sync(current_revision)
        if current == LATEST_REVISION:
            return
        with db_errors("migrate the store"):
            async with self._writer.begin() as conn:
                # SQLite's write lock, PostgreSQL's advisory lock: processes opening a new
                # database at once take turns, and the revision is re-checked under it.
                await lock_migrations(conn)
                await conn.run_sync(upgrade)

    async def _read(self, action: str, body: Body[T]) -> T:
        """Run ``body`` in a read-only transaction, retried if its connection drops."""
        return await transact(self._engine, action, body, write=False)

    async def _write(self, action: str, body: Body[T]) -> T:
        """Run ``body`` in one write transaction, retried if its connection drops before
        COMMIT and checked if it drops during it (see :mod:`corral.store.sql.transaction`)."""
        return await transact(self._writer, action, body, write=True)


class RunTurns:
    """First come, first served turns per key (a run id), within one store instance.

    Event appends of one run commit in the order they were called: the
    executor may flush two batches from parallel tool calls, and a follower
    reading after a cursor must never see seq 6 committed before seq 5 (it
    would skip 5). Across processes only the lease holder appends, and the
    run row lock (``check_fence``) serializes the transactions themselves.
    """

    def __init__(self) -> None:
        self._locks: dict[str, tuple[anyio.Lock, int]] = {}

    @asynccontextmanager
    async def turn(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (anyio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:  # anyio locks are FIFO
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


def fetch_all(query: sa.Executable) -> Body[Sequence[sa.Row[Any]]]:
    """A body that returns every row of ``query``."""

    async def body(conn: AsyncConnection) -> Sequence[sa.Row[Any]]:
        return (await conn.execute(query)).all()

    return body


def fetch_first(query: sa.Executable) -> Body[sa.Row[Any] | None]:
    """A body that returns the first row of ``query``, or ``None``."""

    async def body(conn: AsyncConnection) -> sa.Row[Any] | None:
        return (await conn.execute(query)).first()

    return body


def execute(statement: sa.Executable, parameters: dict[str, Any] | None = None) -> Body[None]:
    """A body that executes ``statement`` (with ``parameters``)."""

    async def body(conn: AsyncConnection) -> None:
        await conn.execute(statement, parameters)

    return body
