"""Resource limits of a tool's processes, and naming the limit a failed program hit.

Limits are rlimits set by ``prlimit`` (util-linux) as the last step before the
program: inside the sandbox, so they bind the program and what it starts and not
bubblewrap's own set-up. Which limit binds how:

- ``memory_mb``: a memory cgroup of the call (:class:`CallCgroup`) where one can be made:
  all its processes together, the kernel's OOM killer at the limit, recognised for sure by
  the cgroup's ``oom_kill`` counter; and ``RLIMIT_AS`` (address space) of each process when
  the Tool set it. A program over ``RLIMIT_AS`` sees allocations fail; that is *recognised*
  only by what it writes to stderr (``MemoryError``, ``Cannot allocate memory``, ``out of
  memory``, ``bad_alloc``). A program that dies silently of a failed allocation is an
  ordinary failure.
- ``cpu_seconds``: ``RLIMIT_CPU``: ``SIGXCPU`` at the limit, ``SIGKILL`` a second later.
  Recognised by ``SIGXCPU``; a process that ignored it and got the ``SIGKILL`` cannot be
  told from any other kill, and is reported as killed.
- ``max_file_mb``: ``RLIMIT_FSIZE``: ``SIGXFSZ``, or ``EFBIG`` ("File too large") for a
  program that ignores the signal (Python does).
- ``max_processes``: ``RLIMIT_NPROC``. Since Linux 5.14 it counts per user namespace,
  so in a sandbox it counts the sandbox's own processes. It does not bind uid 0, so
  when the server runs as root a ``pids`` cgroup (:class:`CallCgroup`) enforces it
  where one can be made; its ``max`` event counter says for sure that the limit was
  hit. Unsandboxed (no user namespace of its own) ``RLIMIT_NPROC`` would count every
  process of the server's user, so there only the cgroup (root) enforces it. Under ``RLIMIT_NPROC`` alone a hit is recognised by stderr (``Resource
  temporarily unavailable``, ``BlockingIOError``, ``fork: retry``), like memory.

``wall_seconds`` is a clock kept by the tool kind, not a limit of the kernel.

A sandboxed call is bounded even when its Tool sets nothing (:func:`sandbox_limits`):
:data:`DEFAULT_MEMORY_MB` (by the cgroup, else ``RLIMIT_DATA`` of each process: an
address-space limit would break runtimes that reserve more than they use) and
:data:`DEFAULT_MAX_PROCESSES`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
from collections.abc import Mapping
from pathlib import Path

import anyio

from corral.resources.isolation import IsolationLimits

__all__ = [
    "DEFAULT_MAX_PROCESSES",
    "DEFAULT_MEMORY_MB",
    "CallCgroup",
    "limit_hit",
    "prlimit_argv",
    "sandbox_limits",
]

log = logging.getLogger(__name__)

PRLIMIT = "/usr/bin/prlimit"
#: a sandboxed call's processes (and threads) alive at once, unless its Tool says otherwise
DEFAULT_MAX_PROCESSES = 512
#: a sandboxed call's memory, MiB, unless its Tool says otherwise
DEFAULT_MEMORY_MB = 512
#: how long a call's cgroup may stay busy after its processes were killed
_REMOVE_SECONDS = 5.0
_MIB = 1024 * 1024
_MEMORY_SIGNS = ("MemoryError", "Cannot allocate memory", "out of memory", "bad_alloc")
_FORK_SIGNS = ("Resource temporarily unavailable", "BlockingIOError", "fork: retry", "Cannot fork")


def _nproc_counts_per_user_namespace() -> bool:
    """Whether ``RLIMIT_NPROC`` counts a sandbox's own processes (Linux 5.14 and later)."""
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 14)


def sandbox_limits(limits: IsolationLimits) -> tuple[IsolationLimits, frozenset[str]]:
    """``limits`` with the sandbox's defaults for what they leave unset, and which those are.

    A sandboxed call is bounded even when its Tool says nothing: :data:`DEFAULT_MEMORY_MB`
    and :data:`DEFAULT_MAX_PROCESSES` (the latter only where it binds the sandbox alone:
    a pids cgroup when the server is root, ``RLIMIT_NPROC`` per user namespace
    otherwise). Wall time is the Tool's ``timeout_seconds`` (60 s by default).
    """
    update: dict[str, int] = {}
    if limits.memory_mb is None:
        update["memory_mb"] = DEFAULT_MEMORY_MB
    if limits.max_processes is None and (os.geteuid() == 0 or _nproc_counts_per_user_namespace()):
        update["max_processes"] = DEFAULT_MAX_PROCESSES
    return limits.model_copy(update=update), frozenset(update)


def has_rlimits(limits: IsolationLimits) -> bool:
    """Whether any of ``limits`` is an rlimit (the others are kept elsewhere)."""
    return any(
        v is not None
        for v in (limits.memory_mb, limits.cpu_seconds, limits.max_processes, limits.max_file_mb)
    )


def prlimit_argv(
    limits: IsolationLimits, *, nproc: bool = True, data_mb: int | None = None
) -> list[str]:
    """``prlimit ... --`` setting ``limits``, to put before a program (empty: no rlimit).

    ``nproc=False`` leaves ``RLIMIT_NPROC`` out: outside a user namespace of its own it
    would count every process of the server's user, not the tool's. ``data_mb`` sets
    ``RLIMIT_DATA`` (what a process may allocate, not what it may reserve).
    """
    if not has_rlimits(limits) and data_mb is None:
        return []
    argv = [PRLIMIT]
    if limits.memory_mb is not None:
        size = limits.memory_mb * _MIB
        argv.append(f"--as={size}:{size}")
    if data_mb is not None:
        size = data_mb * _MIB
        argv.append(f"--data={size}:{size}")
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
    limits: IsolationLimits,
    returncode: int,
    stderr: str,
    *,
    pids_max_events: int = 0,
    oom_kills: int = 0,
) -> str | None:
    """The name of the limit a program that failed with ``returncode`` hit, if it can tell."""
    if returncode == 0:
        return None
    if limits.memory_mb is not None and oom_kills > 0:
        return "memory_mb"
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


def _limit_memory(path: Path, size: int, *, v2: bool) -> None:
    """Set the memory limit of the cgroup at ``path``, swap included where swap is counted
    apart (else a host with swap would page a call out instead of stopping it)."""
    if v2:
        (path / "memory.max").write_text(str(size))
        with contextlib.suppress(OSError):  # no swap accounting here
            (path / "memory.swap.max").write_text("0")
        return
    (path / "memory.limit_in_bytes").write_text(str(size))
    with contextlib.suppress(OSError):  # memsw: memory and swap together, not below the first
        (path / "memory.memsw.limit_in_bytes").write_text(str(size))


class CallCgroup:
    """The cgroups of one call, joined before ``bwrap`` runs: ``pids.max`` processes and
    at most ``memory_mb`` of memory, all its processes together.

    ``roots`` names, per controller (``pids``, ``memory``), the directory the call's
    cgroup is made in: one cgroup v2 directory may hold both, cgroup v1 has one
    hierarchy per controller. The program joins them through :meth:`join_argv` (a
    shell that writes its own pid to each ``cgroup.procs`` and then execs), so
    nothing forks before it is counted.
    """

    def __init__(
        self, roots: Mapping[str, Path], *, max_processes: int | None, memory_mb: int | None
    ) -> None:
        name = f"corral-{secrets.token_hex(8)}"
        self.paths: dict[str, Path] = {}
        try:
            for controller, root in roots.items():
                path = root / name
                if path not in self.paths.values():
                    path.mkdir()
                self.paths[controller] = path
                if controller == "pids" and max_processes is not None:
                    (path / "pids.max").write_text(str(max_processes))
                if controller == "memory" and memory_mb is not None:
                    _limit_memory(path, memory_mb * _MIB, v2=(root / "cgroup.controllers").exists())
        except OSError:
            for path in set(self.paths.values()):
                with contextlib.suppress(OSError):
                    path.rmdir()
            raise

    def join_argv(self) -> list[str]:
        """A prefix that moves the command into these cgroups, then runs it."""
        procs = [str(p / "cgroup.procs") for p in dict.fromkeys(self.paths.values())]
        script = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 1; shift; n=$((n-1)); done; exec "$@"'
        return ["/bin/sh", "-c", script, "sh", str(len(procs)), *procs]

    def _counter(self, controller: str, filename: str, counter: str) -> int:
        path = self.paths.get(controller)
        if path is None:
            return 0
        with contextlib.suppress(OSError, ValueError):
            for line in (path / filename).read_text().splitlines():
                name, _, count = line.partition(" ")
                if name == counter:
                    return int(count)
        return 0

    def max_events(self) -> int:
        """How many forks the ``pids`` limit refused."""
        return self._counter("pids", "pids.events", "max")

    def oom_kills(self) -> int:
        """How many processes the memory limit killed."""
        path = self.paths.get("memory")
        if path is None:
            return 0
        if (path / "memory.events").exists():  # cgroup v2
            return self._counter("memory", "memory.events", "oom_kill")
        return self._counter("memory", "memory.oom_control", "oom_kill")

    async def remove(self) -> None:
        """Remove the cgroups once their processes are gone: those of a PID namespace
        that was torn down may take a moment to leave (a cgroup with members is busy)."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(_REMOVE_SECONDS):
            for path in dict.fromkeys(self.paths.values()):
                while True:
                    try:
                        os.rmdir(path)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        await anyio.sleep(0.01)
            return
        log.warning("cgroup of a call still busy; left behind: %s", list(self.paths.values()))
