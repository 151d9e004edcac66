"""Persistence: the :class:`Store` interface and :func:`open_store`, which picks a backend by URL.

Importing this package is cheap; the SQL backend (SQLAlchemy, a driver,
alembic) is only imported when a store is opened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral.core.settings import Settings
from corral.store.base import (
    ApplyAction,
    ApplyOutcome,
    Store,
    StoredResource,
    StoreError,
    Submitted,
)

if TYPE_CHECKING:
    from corral.resources.secrets import SecretCipher

__all__ = [
    "ApplyAction",
    "ApplyOutcome",
    "Store",
    "StoreError",
    "StoredResource",
    "Submitted",
    "open_store",
]


async def open_store(
    url: str, *, settings: Settings | None = None, cipher: SecretCipher | None = None
) -> Store:
    """Open the store at ``url`` (``sqlite:///path`` or ``postgresql://...``), migrated.

    ``settings`` (by default read from the environment) give the PostgreSQL pool
    size and whether a SQLite file takes the fast path
    (:class:`~corral.store.sqlite.SqliteStore`, on by default) or the SQLAlchemy
    statements PostgreSQL uses. ``cipher`` encrypts Secret values; by default it
    comes from the settings (``CORRAL_SECRET_KEY``, else ``$CORRAL_HOME/secret.key``,
    created only when a secret value is first stored).
    """
    from corral.store.sql import SqlStore, async_url
    from corral.store.sql.database import sqlite_file

    if settings is None:
        settings = Settings.from_env()
    if cipher is None:
        from corral.resources.secrets import SecretCipher

        cipher = SecretCipher.from_settings(settings)
    store_class = SqlStore
    if settings.sqlite_fast_path and sqlite_file(async_url(url)) is not None:
        from corral.store.sqlite import SqliteStore

        store_class = SqliteStore
    return await store_class.open(
        url,
        cipher=cipher,
        pool_size=settings.db_pool_size,
        busy_timeout_seconds=settings.sqlite_busy_timeout_seconds,
        memory_vector_cache_bytes=settings.memory_vector_cache_bytes,
    )
