"""Directories only the server's user may enter: ``CORRAL_HOME`` and the workspaces.

A tool leaves files in its workspace, and a file left there must not be reachable by
the machine's other users (a setuid copy of an interpreter, a secret it read), so
every directory Corral makes for its state is made 0700, and one it finds looser
(made by an older version, or by hand) is tightened when it is the server user's.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

__all__ = ["PRIVATE_DIRECTORY_MODE", "private_directory"]

PRIVATE_DIRECTORY_MODE = 0o700


def private_directory(path: Path, *, tighten: bool = True) -> Path:
    """Make ``path`` (and the parents it lacks) 0700; blocking: call it from a thread.

    ``tighten``: an existing ``path`` of this user's that others may enter is made 0700
    too (not its parents: those are the operator's). A directory of another user is
    left as it is: theirs to guard.
    """
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=PRIVATE_DIRECTORY_MODE)
    if tighten:
        _tighten(path)
    return path


def _tighten(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError, PermissionError):
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            return
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.chmod(path, stat.S_IMODE(info.st_mode) & 0o700)
