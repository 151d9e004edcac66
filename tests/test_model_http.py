"""The model providers' HTTP clients (models/_http.py): the SDKs' defaults, with a pool whose
idle-connection probe asks a kept socket, and still notices a server's close."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anthropic
import httpcore2
import openai
import pytest

from corral.models._http import ProbeBackend, ProbedStream, is_socket_readable, sdk_http_client


@dataclass
class KeepAliveServer:
    """HTTP/1.1 on a real socket: answers ``ok`` with keep-alive, and with ``close_after``
    closes each connection after its first answer, without saying so (as an idle timeout
    on a server or a proxy does)."""

    close_after: bool
    connections: int = 0
    url: str = ""
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()
        await writer.wait_closed()
        self.closed.set()


@pytest.fixture
async def server(request: pytest.FixtureRequest) -> AsyncIterator[KeepAliveServer]:
    state = KeepAliveServer(close_after=request.param)
    listener = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    state.url = f"http://127.0.0.1:{port}/"
    async with listener:
        yield state


@pytest.mark.parametrize(
    "factory", [openai.DefaultAsyncHttpxClient, anthropic.DefaultAsyncHttpxClient]
)
async def test_the_sdk_clients_pools_connect_through_the_probe_backend(factory: type) -> None:
    # reaches into httpx's private attributes: this fails when a release moves them
    client = sdk_http_client(factory)
    try:
        pool = client._transport._pool  # type: ignore[attr-defined]
        assert isinstance(pool, httpcore2.AsyncConnectionPool)
        assert isinstance(pool._network_backend, ProbeBackend)
        assert client.timeout == factory().timeout  # the SDK's own defaults are kept
    finally:
        await client.aclose()


@pytest.mark.parametrize("server", [True], indirect=True)
async def test_a_connection_the_server_closed_while_idle_is_not_reused(
    server: KeepAliveServer,
) -> None:
    client = sdk_http_client(openai.DefaultAsyncHttpxClient)
    async with client:
        first = await client.get(server.url)
        await server.closed.wait()  # the server's FIN is on its way to the idle connection
        second = await client.get(server.url)
    assert (first.text, second.text) == ("ok", "ok")
    assert server.connections == 2


@pytest.mark.parametrize("server", [False], indirect=True)
async def test_an_idle_connection_the_server_keeps_is_reused(server: KeepAliveServer) -> None:
    client = sdk_http_client(openai.DefaultAsyncHttpxClient)
    async with client:
        answers = [(await client.get(server.url)).text for _ in range(3)]
        streams = [
            connection._connection._network_stream  # type: ignore[attr-defined]
            for connection in client._transport._pool.connections  # type: ignore[attr-defined]
        ]
    assert answers == ["ok"] * 3
    assert server.connections == 1
    assert len(streams) == 1 and isinstance(streams[0], ProbedStream)


def test_is_socket_readable_is_true_for_waiting_data_or_a_close() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert not is_socket_readable(ours)
        theirs.sendall(b"x")
        assert is_socket_readable(ours)
        ours.recv(1)
        assert not is_socket_readable(ours)
        theirs.close()
        assert is_socket_readable(ours)  # the next read would be b"": the peer is gone
    assert is_socket_readable(ours)  # closed here: nothing to read from, treated as gone
