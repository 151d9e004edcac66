"""No setuid or setgid bit a tool's program set survives its call.

Inside the sandbox the workspace is mounted ``nosuid``, but on the host it is an
ordinary directory: a program that copied an interpreter into its workspace and
made it setuid (as the sandbox's root, which is the server's user on the host) left
a file that runs as the server's user for whoever can reach it. The workspaces are
0700 (:mod:`corral.core.private_files`), and after each call (and when a stdio MCP
server stops) :func:`strip_setid_bits` clears those bits of every file and directory
in the workspace.

The walk follows no symlink: directories are walked by descriptor (``os.fwalk``),
each entry is opened ``O_PATH | O_NOFOLLOW`` and changed through that descriptor,
so a program still running (an MCP server's) cannot swap an entry for a symlink and
have the server change a file outside the workspace.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

__all__ = ["SETID_BITS", "strip_setid_bits"]

log = logging.getLogger(__name__)

SETID_BITS = stat.S_ISUID | stat.S_ISGID


def strip_setid_bits(workspace: Path) -> int:
    """Clear the setuid and setgid bits under ``workspace``; how many entries had them.

    Blocking: call it from a thread.
    """
    stripped = 0
    if not workspace.is_dir() or workspace.is_symlink():
        return 0
    with contextlib.suppress(OSError):
        stripped = _strip(str(workspace), None)
    for _, dirs, files, dir_fd in os.fwalk(workspace, follow_symlinks=False):
        for name in (*dirs, *files):
            with contextlib.suppress(OSError):
                stripped += _strip(name, dir_fd)
    if stripped:
        log.warning("cleared setuid/setgid bits of %d entries in %s", stripped, workspace)
    return stripped


def _strip(name: str, dir_fd: int | None) -> int:
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        mode = stat.S_IMODE(info.st_mode)
        if not mode & SETID_BITS or not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
            return 0
        # an O_PATH descriptor takes no fchmod; its /proc link names exactly this inode
        os.chmod(f"/proc/self/fd/{fd}", mode & ~SETID_BITS)
        return 1
    finally:
        os.close(fd)
