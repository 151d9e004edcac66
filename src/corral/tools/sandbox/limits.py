"""Resource limits of a tool's processes, and naming the limit a failed program hit.

Limits are rlimits set by ``prlimit`` (util-linux) as the last step before the
program: inside the sandbox, so they bind the program and what it starts and not
bubblewrap's own set-up. Which limit binds how:

- ``memory_mb``: ``RLIMIT_AS`` (address space) of each process. A program over it
  sees allocations fail; it is *recognised* only by what it writes to stderr
  (``MemoryError``, ``Cannot allocate memory``, ``out of memory``, ``bad_alloc``).
  A program that dies silently of a failed allocation is an ordinary failure.
- ``cpu_seconds``: ``RLIMIT_CPU``: ``SIGXCPU`` at the limit, ``SIGKILL`` a second later.
  Recognised by ``SIGXCPU``; a process that ignored it and got the ``SIGKILL`` cannot be
  told from any other kill, and is reported as killed.
- ``max_file_mb``: ``RLIMIT_FSIZE``: ``SIGXFSZ``, or ``EFBIG`` ("File too large") for a
  program that ignores the signal (Python does).
- ``max_processes``: ``RLIMIT_NPROC``. Since Linux 5.14 it counts per user namespace,
  so in a sandbox it counts the sandbox's own processes. It does not bind uid 0, so
  when the server runs as root a ``pids`` cgroup (:class:`PidsCgroup`) enforces it
  where one can be made; its ``max`` event counter says for sure that the limit was
  hit. Unsandboxed (no user namespace of its own) ``RLIMIT_NPROC`` would count every
  process of the server's user, so there only the cgroup (root) enforces it. Under ``RLIMIT_NPROC`` alone a hit is recognised by stderr (``Resource
  temporarily unavailable``, ``BlockingIOError``, ``fork: retry``), like memory.

``wall_seconds`` is a clock kept by the tool kind, not a limit of the kernel.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
from pathlib import Path

import anyio

from corral.resources.isolation import IsolationLimits

__all__ = ["PidsCgroup", "limit_hit", "prlimit_argv"]

log = logging.getLogger(__name__)

PRLIMIT = "/usr/bin/prlimit"
#: how long a call's cgroup may stay busy after its processes were killed
_REMOVE_SECONDS = 5.0
_MIB = 1024 * 1024
_MEMORY_SIGNS = ("MemoryError", "Cannot allocate memory", "out of memory", "bad_alloc")
_FORK_SIGNS = ("Resource temporarily unavailable", "BlockingIOError", "fork: retry", "Cannot fork")


def has_rlimits(limits: IsolationLimits) -> bool:
    """Whether any of ``limits`` is an rlimit (the others are kept elsewhere)."""
    return any(
        v is not None
        for v in (limits.memory_mb, limits.cpu_seconds, limits.max_processes, limits.max_file_mb)
    )


def prlimit_argv(limits: IsolationLimits, *, nproc: bool = True) -> list[str]:
    """``prlimit ... --`` setting ``limits``, to put before a program (empty: no rlimit).

    ``nproc=False`` leaves ``RLIMIT_NPROC`` out: outside a user namespace of its own it
    would count every process of the server's user, not the tool's.
    """
    if not has_rlimits(limits):
        return []
    argv = [PRLIMIT]
    if limits.memory_mb is not None:
        size = limits.memory_mb * _MIB
        argv.append(f"--as={size}:{size}")
    if limits.cpu_seconds is not None:
        # the soft limit sends SIGXCPU, the hard one a second later SIGKILL
        argv.append(f"--cpu={limits.cpu_seconds}:{limits.cpu_seconds + 1}")
    if limits.max_processes is not None and nproc:
        argv.append(f"--nproc={limits.max_processes}:{limits.max_processes}")
    if limits.max_file_mb is not None:
        size = limits.max_file_mb * _MIB
        argv.append(f"--fsize={size}:{size}")
    return [*argv, "--"] if len(argv) > 1 else []


def _signal_of(returncode: int) -> int | None:
    """The signal that ended a program: negative codes from the kernel, 128+N from bwrap."""
    if returncode < 0:
        return -returncode
    if 128 < returncode < 128 + 65:
        return returncode - 128
    return None


def limit_hit(
    limits: IsolationLimits, returncode: int, stderr: str, *, pids_max_events: int = 0
) -> str | None:
    """The name of the limit a program that failed with ``returncode`` hit, if it can tell."""
    if returncode == 0:
        return None
    if limits.max_processes is not None and pids_max_events > 0:
        return "max_processes"
    sig = _signal_of(returncode)
    if limits.cpu_seconds is not None and sig == signal.SIGXCPU:
        return "cpu_seconds"
    if limits.max_file_mb is not None and (sig == signal.SIGXFSZ or "File too large" in stderr):
        return "max_file_mb"
    if limits.memory_mb is not None and any(s in stderr for s in _MEMORY_SIGNS):
        return "memory_mb"
    if limits.max_processes is not None and any(s in stderr for s in _FORK_SIGNS):
        return "max_processes"
    return None


class PidsCgroup:
    """A ``pids`` cgroup of one call: ``pids.max`` processes, joined before ``bwrap`` runs.

    The program joins it through :meth:`join_argv` (a shell that writes its own pid
    to ``cgroup.procs`` and then execs), so nothing forks before it is counted.
    """

    def __init__(self, root: Path, max_processes: int) -> None:
        self.path = root / f"corral-{secrets.token_hex(8)}"
        self.path.mkdir()
        (self.path / "pids.max").write_text(str(max_processes))

    def join_argv(self) -> list[str]:
        """A prefix that moves the command into this cgroup, then runs it."""
        procs = str(self.path / "cgroup.procs")
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', procs]

    def max_events(self) -> int:
        """How many forks the limit refused."""
        with contextlib.suppress(OSError, ValueError):
            for line in (self.path / "pids.events").read_text().splitlines():
                name, _, count = line.partition(" ")
                if name == "max":
                    return int(count)
        return 0

    async def remove(self) -> None:
        """Remove the cgroup once its processes are gone: those of a PID namespace that
        was torn down may take a moment to leave it (a cgroup with members is busy)."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(_REMOVE_SECONDS):
            while True:
                try:
                    os.rmdir(self.path)
                    return
                except FileNotFoundError:
                    return
                except OSError:
                    await anyio.sleep(0.01)
        log.warning("pids cgroup %s still busy; left behind", self.path)
