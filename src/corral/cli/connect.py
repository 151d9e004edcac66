"""What a command works on: a :class:`~corral.cli.backend.Backend`, or the store itself.

:func:`connection` resolves once per command where the CLI goes, each setting by
the first of these that gives it:

==========  ==================  ==================  ====================================
setting     flag                environment         context (``corral context use``)
==========  ==================  ==================  ====================================
server      ``--url``           ``CORRAL_URL``      its ``url``
token       ``--token``         ``CORRAL_TOKEN``    its ``token`` / ``token-file``, only
                                                    when the server is the context's too
namespace   ``-n``                                  its ``namespace`` (else ``default``)
==========  ==================  ==================  ====================================

``--context NAME`` picks the context instead of the config's current one. A
context's token is only ever sent to that context's server: with the server
given by ``--url`` or ``CORRAL_URL``, the token must come from ``--token`` or
``CORRAL_TOKEN`` too. ``CORRAL_URL`` set to the empty string means "no server"
even when the context names one.

:func:`open_backend` then chooses:

- no server: :class:`~corral.cli.backend.EmbeddedBackend`, the store of
  ``CORRAL_HOME`` / ``CORRAL_DB_URL``; ``corral run`` executes the agent in this process.
- a server: :class:`~corral.cli.backend_remote.RemoteBackend` over the HTTP API; runs
  execute on the server's workers. The token decides the namespace there, so a namespace
  given by ``-n`` or by the context must be the token's: otherwise the command stops with
  exit code 2 (:func:`check_namespace`) instead of quietly working in another one.

Commands that work on the store itself (``worker``, ``gc``, ``serve``, ``token``)
have no remote mode: with a server chosen they stop with exit code 2
(:func:`require_local`) instead of quietly using a local store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from corral.cli.common import EXIT_BAD_INPUT, connection, escape, fail
from corral.cli.contexts import URL_ENV, Connection

if TYPE_CHECKING:
    from corral.cli.backend import Backend
    from corral.client import AsyncClient
    from corral.core.settings import Settings
    from corral.store.base import Store

__all__ = ["Connection", "check_namespace", "connection", "open_backend", "require_local"]


def remote_url() -> str | None:
    """The API URL when the CLI runs in remote mode."""
    return connection().url


def require_local(command: str) -> None:
    """Stop (exit 2) when ``command``, which works on the store, is asked for in remote mode."""
    found = connection()
    if found.url is not None:
        if found.url_source == URL_ENV:
            hint = f"unset {URL_ENV}"
        elif found.url_source == "--url":
            hint = "leave out --url"
        else:
            hint = (
                f"{found.url_source} names the server {found.url}: pass --context with a context "
                f"that has no url, or set {URL_ENV}= (empty)"
            )
        fail(
            escape(
                f"'corral {command}' works on the store directly and has no remote mode; "
                f"{hint} to run it on a machine that reaches the store"
            ),
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
    """The backend of this command: its server when one is chosen, else the local store."""
    found = connection()
    if found.url is not None:
        from corral.cli.backend_remote import RemoteBackend
        from corral.client import AsyncClient

        async with AsyncClient(found.url, found.token or "") as client:
            await check_namespace(client, found)
            yield RemoteBackend(client)
        return
    from corral.cli.backend import EmbeddedBackend

    async with open_cli_store() as (store, settings):
        yield EmbeddedBackend(store, settings)


async def check_namespace(client: AsyncClient, found: Connection) -> None:
    """Stop (exit 2) when a namespace was asked for that the token cannot work in."""
    if found.namespace_source is None:
        return
    caller = await client.whoami()
    if caller.namespace != found.namespace:
        hint = (
            "leave out -n"
            if found.namespace_source == "-n"
            else f"change it (corral context set {found.context} -n {caller.namespace})"
        )
        fail(
            escape(
                f"namespace {found.namespace!r} (from {found.namespace_source}) is not the "
                f"token's: the token {caller.id} works in namespace {caller.namespace!r} only "
                f"on {found.url}; {hint} or use a token of {found.namespace!r}"
            ),
            EXIT_BAD_INPUT,
        )
