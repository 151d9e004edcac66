"""Fixtures shared by every test module: no hosted model API reachable, no CLI config of the
user's (contexts), the PostgreSQL server of the store tests, ``env`` (a SQLite store with its
settings in the test's own directory) and ``clock``, a fake clock for tests that move time."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from corral.core.settings import Settings
from corral.store import Store, open_store
from databases import PostgresServer, postgres_skipped, postgres_url
from fake_clock import FakeClock
from hosted_apis import refusing_getaddrinfo
from sandboxing import ALLOWED_PATHS
from server_harness import LiveServer


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "empty_database: the store_url of this test names an empty database, not a migrated one",
    )
    config.addinivalue_line(
        "markers",
        "worker(**options): options of the workers of a test's backend (tests/backends.py)",
    )


@pytest.fixture(scope="session", autouse=True)
def no_user_cli_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """An empty config directory for every ``corral`` the tests run, in process or as a
    subprocess (they inherit it): a current context of the user's never reaches a test."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))
        yield


@pytest.fixture(scope="session", autouse=True)
def sandbox_allows_the_test_interpreter() -> Iterator[None]:
    """Tools run sandboxed where bubblewrap works (``isolation: auto``); the operator's
    setting that lets a sandbox show the interpreter the tests' tool programs run on
    (``sys.executable`` may live outside the system directories, as under pyenv) and its
    virtualenv."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CORRAL_SANDBOX_ALLOWED_PATHS", ":".join(map(str, ALLOWED_PATHS)))
        yield


@pytest.fixture(scope="session", autouse=True)
def operator_allows_the_loopback_test_services() -> Iterator[None]:
    """The tests' HTTP services (tools, A2A peers, memory services) listen on the loopback:
    the operator's allow-list that lets a tool with ``allow_private`` reach them. A test of
    what the list refuses sets it (or removes it) itself."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CORRAL_ALLOWED_PRIVATE_DESTINATIONS", "127.0.0.0/8, ::1")
        yield


@pytest.fixture(scope="session", autouse=True)
def no_hosted_model_apis() -> Iterator[None]:
    """Refuse every connection to a hosted model API, for the whole session (see hosted_apis)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket, "getaddrinfo", refusing_getaddrinfo(socket.getaddrinfo))
        yield


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock; a ``backend`` of the same test runs its workers on it (tests/backends.py)."""
    return FakeClock()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """The PostgreSQL server the ``postgresql`` store tests run on.

    Never skipped silently: an unreachable server fails the tests, unless
    ``CORRAL_TEST_POSTGRES=skip`` says to skip them.
    """
    if postgres_skipped():
        pytest.skip("PostgreSQL tests skipped on request (CORRAL_TEST_POSTGRES=skip)")
    server = PostgresServer(postgres_url())
    try:
        server.check()
    except Exception as exc:  # whatever the driver says, the message below explains it
        pytest.fail(
            f"the PostgreSQL test server at {server.base_url.render_as_string()} cannot be "
            f"reached ({type(exc).__name__}: {exc}). Start it (.ci/run does), point "
            "CORRAL_TEST_POSTGRES_URL at another one, or set CORRAL_TEST_POSTGRES=skip "
            "to skip the PostgreSQL tests.",
            pytrace=False,
        )
    yield server
    server.close()


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[Store, Settings]]:
    """A SQLite store in ``tmp_path`` and the settings of that home (no secret key)."""
    settings = Settings(
        home=tmp_path, db_url=f"sqlite:///{tmp_path / 'corral.db'}", secret_key=None
    )
    store = await open_store(settings.db_url)
    try:
        yield store, settings
    finally:
        await store.close()


# A module's own ``server`` fixture (other settings, resources) takes the place of this one.
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A real ``corral serve`` with default settings, shared by a module's tests."""
    with LiveServer(tmp_path_factory.mktemp("home")) as live:
        yield live


@pytest.fixture
def client(server: LiveServer) -> Iterator[httpx.Client]:
    """An HTTP client of ``server`` with its admin token."""
    with server.client(server.admin) as c:
        yield c
