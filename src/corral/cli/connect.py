"""What a command works on: a :class:`~corral.cli.backend.Backend`, or the store itself.

:func:`open_backend` chooses once per command:

- ``CORRAL_URL`` unset: :class:`~corral.cli.backend.EmbeddedBackend`, the store of
  ``CORRAL_HOME`` / ``CORRAL_DB_URL``; ``corral run`` executes the agent in this process.
- ``CORRAL_URL`` set (with ``CORRAL_TOKEN``): :class:`~corral.cli.backend_remote.RemoteBackend`
  over the HTTP API; runs execute on the server's workers. The token decides the
  namespace there, so ``-n`` must name the token's namespace (or be left out).

Commands that work on the store itself (``worker``, ``gc``, ``serve``, ``token``)
have no remote mode: with ``CORRAL_URL`` set they stop with exit code 2
(:func:`require_local`) instead of quietly using a local store.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from corral.cli.common import EXIT_BAD_INPUT, fail

if TYPE_CHECKING:
    from corral.cli.backend import Backend
    from corral.core.settings import Settings
    from corral.store.base import Store

URL_ENV = "CORRAL_URL"


def remote_url() -> str | None:
    """The API URL when the CLI runs in remote mode."""
    return os.environ.get(URL_ENV) or None


def require_local(command: str) -> None:
    """Stop (exit 2) when ``command``, which works on the store, is asked for in remote mode."""
    if remote_url() is not None:
        fail(
            f"'corral {command}' works on the store directly and has no remote mode; "
            f"unset {URL_ENV} to run it on a machine that reaches the store",
            EXIT_BAD_INPUT,
        )


@asynccontextmanager
async def open_cli_store() -> AsyncIterator[tuple[Store, Settings]]:
    """The store of this environment (``CORRAL_HOME``, ``CORRAL_DB_URL``) and its settings."""
    from corral.core.settings import Settings
    from corral.resources.secrets import SecretCipher
    from corral.store import open_store

    settings = Settings.from_env()
    store = await open_store(
        settings.db_url, settings=settings, cipher=SecretCipher.from_settings(settings)
    )
    try:
        yield store, settings
    finally:
        await store.close()


@asynccontextmanager
async def open_backend() -> AsyncIterator[Backend]:
    """The backend of this environment: a server when ``CORRAL_URL`` is set, else the store."""
    if remote_url() is not None:
        from corral.cli.backend_remote import RemoteBackend
        from corral.client import AsyncClient

        async with AsyncClient() as client:
            yield RemoteBackend(client)
        return
    from corral.cli.backend import EmbeddedBackend

    async with open_cli_store() as (store, settings):
        yield EmbeddedBackend(store, settings)
