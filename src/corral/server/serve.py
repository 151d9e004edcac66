"""Run the API server: open the store, make the first admin token, serve until a signal.

``SIGTERM``/``SIGINT``: the server stops accepting connections and begins the
app's shutdown at once - open event streams end (clients reconnect
elsewhere with ``Last-Event-ID``), waiting prompt requests answer 202, and the
embedded worker stops claiming and drains (in-flight runs finish within its
grace period or are released for another worker). The process then exits 0.
A second ``SIGINT`` forces the exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import anyio
import uvicorn

from corral.bus import open_settings_bus
from corral.core.errors import ConfigurationError
from corral.core.log_lines import install_log_filters
from corral.core.private_files import private_directory
from corral.core.settings import Settings
from corral.core.tokens import Role, mint_token
from corral.server.app import create_app
from corral.server.context import ServerContext
from corral.store import Store, open_store

ADMIN_TOKEN_FILE = "admin.token"


class CorralServer(uvicorn.Server):
    """uvicorn's server, telling the app when shutdown begins and exiting 0 on a signal."""

    def __init__(self, config: uvicorn.Config, context: ServerContext) -> None:
        super().__init__(config)
        self.context = context

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        port = self.port
        if self.context.public_url is None and port is not None:
            # the embedded worker's tool programs run on this host: loopback reaches a
            # server listening on every address too
            host = self.config.host
            if host in ("0.0.0.0", "::", ""):
                host = "127.0.0.1"
            elif ":" in host:
                host = f"[{host}]"
            self.context.public_url = f"http://{host}:{port}"

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Before uvicorn waits for open connections: streams and prompt waits end now.
        self.context.begin_shutdown()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """As uvicorn's, but the signal is not raised again after the drain: exit 0."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    @property
    def port(self) -> int | None:
        """The port it listens on (useful with port 0), once started."""
        for server in self.servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return None


async def ensure_admin_token(store: Store, home: Path, out: TextIO = sys.stderr) -> str | None:
    """On a store without tokens: create an admin token of namespace ``default``.

    The token is printed once on ``out`` and written to ``$CORRAL_HOME/admin.token``
    (mode 0600); returns it, or ``None`` when the store already had tokens.
    """
    if await store.list_tokens(limit=1):
        return None
    token, plain = mint_token("default", Role.ADMIN, name="initial admin")
    await store.create_token(token)
    path = await anyio.to_thread.run_sync(_write_secret, home / ADMIN_TOKEN_FILE, plain)
    out.write(
        f"Created an admin token for namespace 'default' (shown once; also in {path}):\n  {plain}\n"
    )
    out.flush()
    return plain


def _write_secret(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` readable by its owner only (0600)."""
    private_directory(path.parent)  # CORRAL_HOME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text + "\n")
    os.chmod(path, 0o600)  # the file may have existed with looser bits
    return path


async def _open(settings: Settings) -> Store:
    return await open_store(settings.db_url, settings=settings)


async def serve(
    settings: Settings,
    *,
    host: str,
    port: int,
    workers: int,
    worker_options: dict[str, Any] | None = None,
    poll_seconds: float = 1.0,
    keepalive_seconds: float = 15.0,
    graceful_seconds: float = 60.0,
    log_level: str = "info",
    on_server: Callable[[CorralServer], None] | None = None,
    open_store_with: Callable[[Settings], Awaitable[Store]] | None = None,
) -> None:
    """Serve the API until a signal (or ``server.should_exit``), then drain.

    ``on_server`` receives the server before it starts (tests use it to learn
    the port and to stop it). ``graceful_seconds`` bounds how long open
    requests may take to finish after shutdown began. ``open_store_with`` replaces
    how the store is opened (tests inject a failing one).
    """
    store = await (open_store_with or _open)(settings)
    try:
        await ensure_admin_token(store, settings.home)
        # NATS when CORRAL_NATS_URL is set (API replicas then follow runs executed by
        # workers anywhere), else the in-process bus.
        async with await open_settings_bus(settings, name="corral serve") as bus:
            app = create_app(
                store,
                bus,
                settings,
                workers=workers,
                worker_options=worker_options,
                poll_seconds=poll_seconds,
                keepalive_seconds=keepalive_seconds,
            )
            config = uvicorn.Config(
                app,
                host=host,
                port=port,
                lifespan="on",
                log_level=log_level,
                access_log=False,
                timeout_graceful_shutdown=int(graceful_seconds),
            )
            install_log_filters()  # uvicorn's handlers exist from here on
            server = CorralServer(config, app.state.corral)
            if on_server is not None:
                on_server(server)
            try:
                await server.serve()
            except SystemExit:
                # uvicorn exits 3 when it cannot listen; Corral's exit 3 means "waiting
                # for approval", so this becomes an ordinary error (exit 1).
                if server.started:
                    raise
                raise ConfigurationError(
                    f"the server could not start on {host}:{port} (see the log above)"
                ) from None
    finally:
        await store.close()
