"""Shared fixtures and helpers of the model provider tests.

A test module imports the fixtures it uses by their ``*_fixture`` names (the
fixture names are ``fake_openai``, ``fake_anthropic``, ...). Each fake server
runs once per test module and is reset before every test; :class:`FakeServers`
starts them on demand for a module that tests several providers.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any, TypeVar

import pytest

from corral.core.messages import ToolSpec
from corral.resources.kinds import ModelEndpointSpec, Pricing, RetryPolicy
from corral.testing._fake_http import FakeModelServer
from corral.testing.fake_anthropic import FakeAnthropicServer
from corral.testing.fake_openai import FakeOpenAIServer

S = TypeVar("S", bound=FakeModelServer)

LOOKUP = ToolSpec(
    "lookup",
    "Look a word up.",
    {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
)
CLOCK = ToolSpec("clock", "The time.", {"type": "object", "properties": {}})


@pytest.fixture(scope="module", name="openai_server")
def openai_server_fixture() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture(name="fake_openai")
def fake_openai_fixture(openai_server: FakeOpenAIServer) -> FakeOpenAIServer:
    openai_server.reset()
    return openai_server


@pytest.fixture(scope="module", name="anthropic_server")
def anthropic_server_fixture() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer() as server:
        yield server


@pytest.fixture(name="fake_anthropic")
def fake_anthropic_fixture(anthropic_server: FakeAnthropicServer) -> FakeAnthropicServer:
    anthropic_server.reset()
    return anthropic_server


def endpoint(
    provider: Any,
    base_url: str | None,
    *,
    model: str = "test-model",
    timeout: float = 5.0,
    max_attempts: int = 1,
    initial_backoff: float = 0.0,
    max_backoff: float = 0.0,
    pricing: Pricing | None = None,
    **options: Any,
) -> ModelEndpointSpec:
    """A ``ModelEndpoint`` spec for tests: fast, and no retries unless asked."""
    return ModelEndpointSpec(
        provider=provider,
        model=model,
        base_url=base_url,
        timeout_seconds=timeout,
        retry=RetryPolicy(
            max_attempts=max_attempts,
            initial_backoff_seconds=initial_backoff,
            max_backoff_seconds=max_backoff,
        ),
        pricing=pricing or Pricing(),
        options=options,
    )


def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


class FakeServers:
    """The fake servers of one test module, each started on first use and reset for each
    test: one per wire protocol and role (``primary``, ``backup`` for fallbacks)."""

    def __init__(self) -> None:
        self._running: dict[tuple[type[FakeModelServer], str], FakeModelServer] = {}

    def get(self, kind: type[S], role: str = "primary") -> S:
        """The running server of this kind and role, reset."""
        server = self._running.get((kind, role))
        if server is None:
            server = self._running[kind, role] = kind()
            server.start()
        server.reset()
        assert isinstance(server, kind)
        return server

    def stop(self) -> None:
        for server in self._running.values():
            server.stop()
        self._running.clear()


@pytest.fixture(scope="module", name="fake_servers")
def fake_servers_fixture() -> Iterator[FakeServers]:
    servers = FakeServers()
    try:
        yield servers
    finally:
        servers.stop()
