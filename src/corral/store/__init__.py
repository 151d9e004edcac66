"""Persistence: the :class:`Store` interface and :func:`open_store`, which picks a backend by URL.

Importing this package is cheap; the SQL backend (SQLAlchemy, a driver,
alembic) is only imported when a store is opened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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


async def open_store(url: str, *, cipher: SecretCipher | None = None) -> Store:
    """Open the store at ``url`` (``sqlite:///path`` or ``postgresql://...``), migrated.

    ``cipher`` encrypts Secret values; by default it comes from the
    environment (``CORRAL_SECRET_KEY``, else ``$CORRAL_HOME/secret.key``,
    created only when a secret value is first stored). The PostgreSQL pool
    size comes from ``CORRAL_DB_POOL_SIZE``.
    """
    from corral.core.settings import Settings
    from corral.store.sql import SqlStore

    settings = Settings.from_env()
    if cipher is None:
        from corral.resources.secrets import SecretCipher

        cipher = SecretCipher.from_settings(settings)
    return await SqlStore.open(url, cipher=cipher, pool_size=settings.db_pool_size)
