"""What the kernel opens to start a program: its symlinks, and its ``#!`` interpreters.

Inside a sandbox ``execve`` walks the same way as on the host, so every path on the way
must be there: each symbolic link the program's path goes through (a pipx or ``uv tool``
entry point in ``~/.local/bin`` links to a script in its own virtualenv), and for a
script the interpreter its ``#!`` line names, with that interpreter's links (a
virtualenv's ``python`` links to the installation it was made from). An interpreter may
itself be a script: the kernel follows up to :data:`MAX_INTERPRETERS` of them.

pip writes a console script whose interpreter path is too long for a ``#!`` line
(over 127 bytes) or holds a space as a ``/bin/sh`` script that ``exec``s it::

    #!/bin/sh
    '''exec' "/a/very/long/venv/bin/python" "$0" "$@"
    ' '''

That interpreter is the one the program needs, and is named here too.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_INTERPRETERS", "Interpreter", "interpreters", "symlink_chain"]

#: how many nested ``#!`` interpreters Linux follows (``BINPRM_MAX_RECURSION`` is 4)
MAX_INTERPRETERS = 4
#: how much of a file is read for its ``#!`` line (Linux reads 256 bytes; pip's
#: ``/bin/sh`` form has the interpreter on the second line)
_HEAD_BYTES = 4096
#: the most links followed on one path (Linux's ``MAXSYMLINKS``)
_MAX_LINKS = 40
_PIP_SH_EXEC = re.compile(r"^'''exec' \"(/[^\"]+)\" \"\$0\" \"\$@\"$", re.MULTILINE)


@dataclass(frozen=True)
class Interpreter:
    """An interpreter a program's ``#!`` line (or pip's ``/bin/sh`` form) names."""

    path: Path
    #: the script whose first line names it
    script: Path


def symlink_chain(path: Path) -> list[Path]:
    """``path`` (absolute), then each path its symbolic links lead to, up to the file
    itself as :func:`os.path.realpath` resolves it (a link in a directory's name, too)."""
    chain = [Path(os.path.abspath(path))]
    current = chain[0]
    for _ in range(_MAX_LINKS):
        try:
            target = os.readlink(current)
        except OSError:  # not a link (or not there): the walk ends
            break
        current = Path(os.path.normpath(os.path.join(current.parent, target)))
        if current in chain:  # a loop: the kernel says ELOOP, the program fails to start
            break
        chain.append(current)
    resolved = Path(os.path.realpath(path))
    if resolved not in chain:
        chain.append(resolved)
    return chain


def _named_interpreter(script: Path) -> Path | None:
    """The absolute interpreter ``script``'s first lines name, if it is a script."""
    try:
        with open(script, "rb") as file:
            head = file.read(_HEAD_BYTES)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    first, _, rest = head[2:].partition(b"\n")
    words = first.decode("utf-8", "replace").split()
    if not words or not words[0].startswith("/"):
        return None
    if words[0] in ("/bin/sh", "/usr/bin/sh") and (
        exec_line := _PIP_SH_EXEC.search(rest.decode("utf-8", "replace"))
    ):
        return Path(exec_line.group(1))
    return Path(words[0])


def interpreters(program: Path) -> list[Interpreter]:
    """The interpreters starting ``program`` takes, outermost first: the one its ``#!``
    line names, the one that one's names (when it is a script too), ...; none for a
    binary. ``#!/usr/bin/env NAME`` names ``env``: ``NAME`` is found on the sandbox's
    own ``PATH`` when the program runs."""
    found: list[Interpreter] = []
    script = Path(os.path.realpath(program))
    while len(found) < MAX_INTERPRETERS:
        named = _named_interpreter(script)
        if named is None or any(named == known.path for known in found):
            break
        found.append(Interpreter(named, script))
        script = Path(os.path.realpath(named))
    return found
