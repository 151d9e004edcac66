"""The HTTP clients the SDK-backed providers are given.

Each is the SDK's own default client (its timeouts, connection limits and
redirect policy), with two changes that matter to a process running many runs:

- one TLS context for the whole process (:func:`shared_ssl_context`);
- a connection pool whose idle-connection probe is cheap (:class:`ProbeBackend`).

The probe: before it hands out a connection, ``httpcore`` checks every idle
connection of the pool for a server-side close ("is the socket readable?"),
on every request and again when each response ends. Its anyio backend finds
the socket for that check by building the stream's whole attribute table
(a ``getpeername`` system call and a dozen closures) each time: ~15 us per
idle connection on this project's benchmark machine. A bare loop keeps its
connections busy, but a worker with 50 runs in flight spends part of each run
in tools and journal writes, so most of its connections sit idle: measured
at ~60 probes per model call, about 1 ms of CPU. :class:`ProbeBackend` keeps
each connection's socket once and asks only the ``poll`` (~1.5 us); what the
probe decides is unchanged.
"""

from __future__ import annotations

import functools
import logging
import select
import socket
import ssl
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import httpcore2
import httpx2

log = logging.getLogger(__name__)

ClientT = TypeVar("ClientT", bound=httpx2.AsyncClient)


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """One TLS context for every model client of the process.

    Building an HTTP client builds a TLS context by default (loading the CA bundle):
    about 0.1 s of CPU, paid per run since each run makes its own clients. The
    context holds no per-connection state, so one is shared.
    """
    return httpx2.create_ssl_context()


def sdk_http_client(factory: Callable[..., ClientT]) -> ClientT:
    """The SDK's default async client (``factory``, e.g. ``openai.DefaultAsyncHttpxClient``)
    with the shared TLS context and, when its pool is httpcore's own, :class:`ProbeBackend`.

    The pool is reached through attributes ``httpx`` keeps private (``_transport``,
    ``_pool``, ``_network_backend``): if a release moves them the client is left
    as the SDK made it (correct, only slower), and ``tests/test_model_http.py``
    fails, so the change is noticed.
    """
    client = factory(verify=shared_ssl_context())
    pool = getattr(getattr(client, "_transport", None), "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if isinstance(pool, httpcore2.AsyncConnectionPool) and isinstance(
        backend, httpcore2.AsyncNetworkBackend
    ):
        pool._network_backend = ProbeBackend(backend)
    else:
        log.debug("model HTTP client: pool %r kept as it is", pool)
    return client


class ProbeBackend(httpcore2.AsyncNetworkBackend):
    """Another backend's connections, each answering the idle probe from its kept socket."""

    def __init__(self, inner: httpcore2.AsyncNetworkBackend) -> None:
        self.inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        stream = await self.inner.connect_tcp(
            host, port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )
        return ProbedStream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        stream = await self.inner.connect_unix_socket(
            path, timeout=timeout, socket_options=socket_options
        )
        return ProbedStream(stream)

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class ProbedStream(httpcore2.AsyncNetworkStream):
    """A connection whose ``is_readable`` polls the socket it looked up once."""

    def __init__(self, inner: httpcore2.AsyncNetworkStream) -> None:
        self.inner = inner
        # (TLS wraps the same socket: a stream from start_tls looks it up again anyway)
        self._socket: socket.socket | None = inner.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self.inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self.inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        return ProbedStream(await self.inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable" and self._socket is not None:
            return is_socket_readable(self._socket)
        return self.inner.get_extra_info(info)


def is_socket_readable(sock: socket.socket) -> bool:
    """httpcore's own test: data waiting, or a closed socket (which would read ``b""``)."""
    fd = sock.fileno()
    if fd < 0:
        return True
    if not hasattr(select, "poll"):  # pragma: no cover - Windows
        return bool(select.select([fd], [], [], 0)[0])
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))
