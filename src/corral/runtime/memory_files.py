"""The documents of a file or a directory, as ``corral memory ingest`` reads them.

A directory to ingest may hold what someone else put there: a tool's workspace, a
checkout, a download. Only what lies inside it is read, and only regular files:

- no symbolic link is followed, neither to a file nor to a directory: each entry is
  opened with ``O_NOFOLLOW`` relative to its directory's descriptor, so a link
  swapped in between the listing and the open is refused too (``docs/key.md ->
  $CORRAL_HOME/secret.key`` reads nothing);
- no FIFO, socket or device (opened non-blocking, checked with ``fstat`` on what was
  opened, before any read);
- at most :data:`MAX_FILE_BYTES` of each file (the longest text one ingest takes);
- hidden entries (``.git``, ``.env``) are passed over without a word; everything else
  passed over is a :class:`Skipped` with the reason.

A file named on the command line is read under the same rules: a symbolic link named
there is refused with its target, which the user may name instead.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from corral.core.chunking import MAX_INGEST_CHARS
from corral.core.memory import MemoryInputError

__all__ = ["MAX_DEPTH", "MAX_FILE_BYTES", "Document", "Skipped", "read_documents"]

#: the most bytes read of one file: :data:`MAX_INGEST_CHARS` characters of UTF-8 at most
MAX_FILE_BYTES = 4 * MAX_INGEST_CHARS
#: how deep directories are walked (each level holds a descriptor open)
MAX_DEPTH = 64
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


@dataclass(frozen=True)
class Document:
    """One text document: the path it was read from, as given, and its text."""

    path: str
    text: str


@dataclass(frozen=True)
class Skipped:
    """A path passed over, and why."""

    path: str
    reason: str


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link (not followed)"
    if stat.S_ISFIFO(mode):
        return "a FIFO, not a regular file"
    if stat.S_ISSOCK(mode):
        return "a socket, not a regular file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a regular file"
    return "not a regular file"


def _open(name: str, directory: int | None, flags: int = 0) -> int | str:
    """A descriptor of ``name`` (in ``directory``), never through a symbolic link; or why
    not."""
    try:
        return os.open(name, _FLAGS | flags, dir_fd=directory)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link (not followed)"
        if exc.errno == errno.ENOTDIR:
            return "not a directory (replaced while it was read)"
        return exc.strerror or str(exc)


def _text(fd: int, max_bytes: int) -> str | None:
    """The UTF-8 text of the regular file ``fd``; ``None`` when it is no text (binary)."""
    chunks, size = [], 0
    while size <= max_bytes:
        chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise _TooLarge
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\x00" in text else text


class _TooLarge(Exception):
    """A file grew past the cap while it was read."""


def _file(path: str, fd: int, max_bytes: int) -> Document | Skipped:
    """The document of the open ``fd``, or why it is passed over."""
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        return Skipped(path, _kind(status.st_mode))
    too_large = Skipped(path, f"larger than {max_bytes} bytes (more than one ingest takes)")
    if status.st_size > max_bytes:
        return too_large
    try:
        text = _text(fd, max_bytes)
    except _TooLarge:  # grew since
        return too_large
    except OSError as exc:
        return Skipped(path, exc.strerror or str(exc))
    if text is None:
        return Skipped(path, "not a UTF-8 text file")
    if len(text) > MAX_INGEST_CHARS:
        return Skipped(path, f"an ingest takes at most {MAX_INGEST_CHARS} characters")
    if not text.strip():
        return Skipped(path, "empty")
    return Document(path, text)


def _walk(
    path: str, directory: int, max_bytes: int, depth: int = 0
) -> Iterator[Document | Skipped]:
    """What the open ``directory`` holds, recursively, by name."""
    if depth > MAX_DEPTH:
        yield Skipped(path, f"deeper than {MAX_DEPTH} directories")
        return
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        yield Skipped(path, exc.strerror or str(exc))
        return
    for name in names:
        if name.startswith("."):
            continue
        inner = os.path.join(path, name)
        try:
            mode = os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode
        except OSError as exc:  # gone since the listing
            yield Skipped(inner, exc.strerror or str(exc))
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            yield Skipped(inner, _kind(mode))  # never opened: a device's open may act
            continue
        opened = _open(name, directory, os.O_DIRECTORY if stat.S_ISDIR(mode) else 0)
        if isinstance(opened, str):
            yield Skipped(inner, opened)
            continue
        try:
            if stat.S_ISDIR(mode):
                yield from _walk(inner, opened, max_bytes, depth + 1)
            else:
                yield _file(inner, opened, max_bytes)
        finally:
            os.close(opened)


def read_documents(
    source: Path, *, max_bytes: int = MAX_FILE_BYTES
) -> tuple[list[Document], list[Skipped]]:
    """The documents of ``source`` (a file, or the files under a directory, sorted) and
    what was passed over (see the module docstring). ``MemoryInputError`` when
    ``source`` itself cannot be read: absent, a symbolic link, not a regular file or
    directory, or a file that is no text."""
    where = str(source)
    try:
        mode = os.lstat(source).st_mode
    except OSError as exc:
        raise MemoryInputError(f"{where}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(mode):
        target = os.path.realpath(source)
        raise MemoryInputError(
            f"{where} is a symbolic link (to {target}): links are not followed; "
            "name the file or directory itself"
        )
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise MemoryInputError(f"{where}: {_kind(mode)}")
    opened = _open(where, None, os.O_DIRECTORY if stat.S_ISDIR(mode) else 0)
    if isinstance(opened, str):
        raise MemoryInputError(f"{where}: {opened}")
    try:
        if stat.S_ISDIR(mode):
            found = list(_walk(where, opened, max_bytes))
        else:
            found = [_file(where, opened, max_bytes)]
    finally:
        os.close(opened)
    documents = [d for d in found if isinstance(d, Document)]
    skipped = [s for s in found if isinstance(s, Skipped)]
    if not stat.S_ISDIR(mode) and skipped:
        raise MemoryInputError(f"{where}: {skipped[0].reason}")
    return documents, skipped
