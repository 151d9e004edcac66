"""The processes a tool starts, found and killed as one tree, including daemons.

A program that forks twice and calls ``setsid()`` leaves its process group and
its parent, so a process-group kill misses it and it used to outlive its call.
Three things keep hold of such descendants (Linux; elsewhere this module only
kills process groups, see :func:`become_subreaper`):

- The process that runs tools (``corral worker``, ``corral serve``, ``corral
  run``) is a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``): an orphan
  anywhere below it is re-parented to it, not to PID 1, so it stays findable
  and is reaped here.
- Each :class:`ProcessTree` marks its leader's environment with a token of its
  own (:data:`TREE_VARIABLE`), which descendants inherit. A child of this
  process that carries the token is an orphan of that tree, whoever its parent
  was; everything below a member is a member, whatever its environment.
- While the leader runs the tree is looked at every :data:`WATCH_SECONDS`, and
  once more before every kill, so a descendant that clears its environment is
  still known by the time its parent dies.

Killing a tree stops (SIGSTOP) every member until no new one appears, so
nothing forks past the kill, then sends SIGKILL to all of them. Members that
ended up children of this process are reaped by pid (each pid checked against
the start time it was seen with, so a reused pid is never waited for). The
leader itself is never waited for here: anyio waits for it. Nothing here calls
``waitpid(-1)``, which would steal the exit status of subprocesses others wait on.

What still escapes: a descendant that clears its environment and is orphaned
within one look's interval of being started, and processes started outside the
tree (by another service, ``at``, ``systemd-run``). The sandbox (a PID namespace)
closes that. The price of being a subreaper: an orphan of anything else this
process started (a ``python`` tool's own subprocess that daemonized) comes here
too and, belonging to no tree, is not reaped until this process exits.

Everything here reads ``/proc``, which is memory, not disk: it runs on the event
loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import anyio

__all__ = [
    "TREE_VARIABLE",
    "WATCH_SECONDS",
    "ProcessTree",
    "become_subreaper",
]

#: the environment variable that marks the processes of one tree
TREE_VARIABLE = "CORRAL_PROCESS_TREE"
#: how often a running tree is looked at for descendants (the first look after this long)
WATCH_SECONDS = 0.25
#: at most this many stop rounds: a tree still growing after them is killed as it is
_FREEZE_ROUNDS = 50
#: how long the members of a killed tree get to exit before they are left as they are
REAP_SECONDS = 2.0
_PR_SET_CHILD_SUBREAPER = 36
_PROC = Path("/proc")
_subreaper: bool | None = None


def become_subreaper() -> bool:
    """Make this process the reaper of orphans below it (once); whether it is one.

    Linux only (``prctl(PR_SET_CHILD_SUBREAPER)``); elsewhere it returns
    ``False`` and orphans go to PID 1 as before.
    """
    global _subreaper
    if _subreaper is None:
        _subreaper = False
        if sys.platform == "linux":
            libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols: libc's
            _subreaper = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    return _subreaper


def _stat(pid: int) -> tuple[int, str, int] | None:
    """``(ppid, state, start time)`` of ``pid`` from ``/proc``; ``None`` when it is gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    fields = text[text.rfind(")") + 2 :].split()  # the command name may hold spaces
    return int(fields[1]), fields[0], int(fields[19])


def _children(pid: int) -> list[int]:
    """The children of ``pid`` (every thread's)."""
    found: list[int] = []
    try:
        tasks = list((_PROC / str(pid) / "task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found.extend(int(c) for c in (task / "children").read_text().split())
        except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: scan /proc
            return [p for p in _all_pids() if (s := _stat(p)) is not None and s[0] == pid]
        except OSError:
            continue  # the thread ended meanwhile
    return found


def _all_pids() -> Iterable[int]:
    with contextlib.suppress(OSError):
        for entry in _PROC.iterdir():
            if entry.name.isdigit():
                yield int(entry.name)


def _marked(pid: int, marker: bytes) -> bool:
    try:
        return marker in (_PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _send(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


class ProcessTree:
    """One tool program and everything it starts; see the module docstring.

    Start the program with :meth:`environment` and tell the tree its pid with
    :meth:`started` when it is known; :meth:`watch` while it runs; :meth:`kill`
    and :meth:`reap` (or :meth:`end`) when the call ends, whatever way.
    """

    def __init__(self) -> None:
        become_subreaper()
        self.token = secrets.token_hex(12)
        self._marker = f"{TREE_VARIABLE}={self.token}".encode()
        self.leader: int | None = None
        #: pid -> the start time it was seen with (a pid can be reused once reaped)
        self.members: dict[int, int] = {}

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with this tree's mark, for the leader."""
        return {**env, TREE_VARIABLE: self.token}

    def started(self, pid: int) -> None:
        """The leader was spawned as ``pid``: a member from now on, never waited for here."""
        self.leader = pid
        stat = _stat(pid)
        # (it may be gone already, reaped by anyio: then its pid is no root of the tree)
        if stat is not None and stat[0] == os.getpid():
            self.members[pid] = stat[2]

    def _alive(self, pid: int) -> bool:
        stat = _stat(pid)
        return stat is not None and stat[2] == self.members.get(pid, stat[2]) and stat[1] != "Z"

    def look(self) -> list[int]:
        """Record the tree's members as they are now; the live ones."""
        if sys.platform != "linux":
            return []
        roots = [p for p in _children(os.getpid()) if p in self.members or _marked(p, self._marker)]
        roots.extend(p for p in self.members if self._alive(p))  # the leader among them
        seen: set[int] = set()
        pending = list(dict.fromkeys(roots))
        while pending:
            pid = pending.pop()
            if pid in seen:
                continue
            stat = _stat(pid)
            if stat is None or stat[2] != self.members.setdefault(pid, stat[2]):
                continue  # gone, or its pid now belongs to another process
            seen.add(pid)
            if stat[1] != "Z":
                pending.extend(_children(pid))
        return [p for p in seen if self._alive(p)]

    def running(self) -> bool:
        """Whether a member of the tree still runs (always ``True`` where it cannot tell)."""
        return sys.platform != "linux" or bool(self.look())

    async def watch(self, every: float = WATCH_SECONDS) -> None:
        """Look at the tree every ``every`` seconds until cancelled."""
        while True:
            await anyio.sleep(every)
            self.look()

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to every live member and to the leader's process group."""
        if self.leader is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.leader, sig)
        for pid in self.look():
            _send(pid, sig)

    def kill(self) -> None:
        """Stop every member until the tree stops growing, then kill them all."""
        stopped: set[int] = set()
        for _ in range(_FREEZE_ROUNDS):
            live = set(self.look())
            fresh = live - stopped
            if not fresh:
                break
            for pid in fresh:
                _send(pid, signal.SIGSTOP)
            stopped |= fresh
        self.signal(signal.SIGKILL)  # stopped processes die of it too

    async def end(self) -> None:
        """Kill and reap the whole tree, even from a cancelled task."""
        with anyio.CancelScope(shield=True):
            self.kill()
            await self.reap()

    async def reap(self) -> None:
        """Wait for the killed members to exit, then reap those this process adopted."""
        me = os.getpid()
        with anyio.move_on_after(REAP_SECONDS):  # a member we may not kill is left as it is
            for pid in list(self.members):
                if pid != self.leader and self._still_member(pid):
                    await _exited(pid)
        for pid in list(self.members):
            stat = _stat(pid)
            # anyio waits for the leader; a member with a live parent is that parent's
            if (
                pid != self.leader
                and stat is not None
                and stat[0] == me
                and self._still_member(pid)
            ):
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222 - it exited: WNOHANG never blocks

    def _still_member(self, pid: int) -> bool:
        """Whether ``pid`` is still the member seen (alive or a zombie), not a reused pid."""
        stat = _stat(pid)
        return stat is not None and stat[2] == self.members[pid]


async def _exited(pid: int) -> None:
    """Until ``pid`` has exited (its pidfd turns readable then)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await anyio.wait_readable(fd)
    finally:
        os.close(fd)
