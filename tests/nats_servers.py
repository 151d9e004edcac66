"""The NATS servers of the tests: the machine's shared one, and private ones a test restarts.

Tests that only talk to NATS use the server at ``CORRAL_TEST_NATS_URL``
(default ``nats://127.0.0.1:4222``, which ``.ci/run`` starts), each under a
prefix of its own (:func:`new_prefix`), so tests never see each other's
streams; the fixture deletes the prefix's streams afterwards. A test that
restarts NATS starts a :class:`NatsServerProcess` of its own - the machine's
``nats-server`` binary on a free port, JetStream on, its store in the test's
directory - and restarts that one: stopping the shared server would break
every other test running against it. An unreachable server, or no binary,
fails the tests; ``CORRAL_TEST_NATS=skip`` skips them instead, on purpose only.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
import pytest

from corral.bus.nats import NatsBus

DEFAULT_URL = "nats://127.0.0.1:4222"
#: where the binary is when it is not on PATH (Debian's package)
DEFAULT_BINARY = "/usr/sbin/nats-server"


def nats_url() -> str:
    """The URL of the shared test server."""
    return os.environ.get("CORRAL_TEST_NATS_URL") or DEFAULT_URL


def nats_skipped() -> bool:
    """Whether the user asked to skip the NATS tests (``CORRAL_TEST_NATS=skip``)."""
    return os.environ.get("CORRAL_TEST_NATS", "").lower() == "skip"


def new_prefix() -> str:
    """A subject and stream prefix no other test uses."""
    return "test_" + secrets.token_hex(5)


def nats_server_binary() -> str:
    """The ``nats-server`` program; the test fails when there is none."""
    found = shutil.which("nats-server") or (
        DEFAULT_BINARY if os.access(DEFAULT_BINARY, os.X_OK) else None
    )
    if found is None:
        pytest.fail(
            "no nats-server binary (PATH or /usr/sbin/nats-server); install it, or set "
            "CORRAL_TEST_NATS=skip to skip the NATS tests",
            pytrace=False,
        )
    return found


def _reachable(url: str, timeout: float = 2.0) -> bool:
    host, _, port = url.removeprefix("nats://").partition(":")
    try:
        with socket.create_connection((host, int(port or 4222)), timeout=timeout) as conn:
            return conn.recv(4).startswith(b"INFO")
    except OSError:
        return False


@pytest.fixture(scope="session", name="nats_server_url")
def nats_server_url_fixture() -> str:
    """The shared NATS server's URL. Never skipped silently: unreachable fails."""
    if nats_skipped():
        pytest.skip("NATS tests skipped on request (CORRAL_TEST_NATS=skip)")
    url = nats_url()
    if not _reachable(url):
        pytest.fail(
            f"the NATS test server at {url} cannot be reached. Start it (.ci/run does), "
            "point CORRAL_TEST_NATS_URL at another one, or set CORRAL_TEST_NATS=skip to "
            "skip the NATS tests.",
            pytrace=False,
        )
    return url


@pytest.fixture(name="nats_prefix")
async def nats_prefix_fixture(nats_server_url: str) -> AsyncIterator[str]:
    """A fresh prefix on the shared server; its streams are deleted after the test."""
    prefix = new_prefix()
    yield prefix
    await delete_streams(nats_server_url, prefix)


#: opens a bus on the test's prefix (keyword arguments: NatsBus.connect's options)
OpenBus = Callable[..., Awaitable[NatsBus]]


@pytest.fixture(name="connect")
async def connect_fixture(nats_server_url: str, nats_prefix: str) -> AsyncIterator[OpenBus]:
    """Opens buses on the test's prefix, each with a connection of its own; closes them."""
    async with AsyncExitStack() as stack:

        async def open_one(**options: Any) -> NatsBus:
            options.setdefault("prefix", nats_prefix)
            bus = await NatsBus.connect(nats_server_url, **options)
            stack.push_async_callback(bus.close)
            return bus

        yield open_one


async def delete_streams(url: str, prefix: str) -> None:
    """Delete the streams a bus with ``prefix`` made (whichever exist)."""
    client = await nats.connect(url, allow_reconnect=False, connect_timeout=2)
    try:
        js = client.jetstream()
        for stream in (f"{prefix}_runnable", f"{prefix}_messages", f"{prefix}_dead"):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await js.delete_stream(stream)
    finally:
        await client.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class NatsServerProcess:
    """A ``nats-server`` of one test, with JetStream, that it may stop and start again.

    It keeps its port and its store directory across restarts, like a server
    restarted in place: streams, consumers and unacknowledged messages survive.
    """

    def __init__(self, directory: Path) -> None:
        self.binary = nats_server_binary()
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the server and wait until it accepts clients."""
        self.directory.mkdir(parents=True, exist_ok=True)
        argv = [self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-js"]
        argv += ["-sd", str(self.directory / "store")]
        with (self.directory / "nats-server.log").open("ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while not _reachable(self.url, timeout=0.5):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"nats-server did not start: {self.log()[-2000:]}")
            time.sleep(0.05)

    def stop(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Stop it (a crash by default) and wait until it is gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=10)
        self.process = None

    def restart(self, pause: float = 0.5) -> None:
        """Crash it, leave it down for ``pause`` seconds, start it again in place."""
        self.stop()
        time.sleep(pause)
        self.start()
        self.restarts += 1

    def log(self) -> str:
        path = self.directory / "nats-server.log"
        return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture(name="private_nats")
def private_nats_fixture(tmp_path: Path) -> Iterator[NatsServerProcess]:
    """A NATS server of this test's own, which it may restart."""
    if nats_skipped():
        pytest.skip("NATS tests skipped on request (CORRAL_TEST_NATS=skip)")
    server = NatsServerProcess(tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop(signal.SIGTERM)
