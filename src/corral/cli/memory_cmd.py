"""``corral memory write|read|search|list|delete|ingest NAME``: a Memory's entries, by hand.

On the local store, or on the server (``/v1/memories``) in remote mode. ``--agent`` /
``--session`` / ``--system-run`` pick the entries of one agent, session or agent
system run (by its id) in a Memory of that scope;
``-o json`` prints the entries as JSON.
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from corral.cli.common import EXIT_BAD_INPUT, NAMESPACE, fail, run_async

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from corral.api import MemoryIngestOut
    from corral.cli.backend import Backend, MemoryAt
    from corral.core.memory import MemoryScope

T = TypeVar("T")

memory_app = typer.Typer(
    help="The entries of a Memory: write, read, search, list, delete, ingest.",
    no_args_is_help=True,
)

MEMORY = typer.Argument(..., help="The Memory's name.")
KEY = typer.Argument(..., help="The entry's key.")
OUTPUT = typer.Option("text", "-o", "--output", help="text or json.")
#: where a command's ``scope`` stands among its parameters: :func:`scoped` puts the
#: options of whose entries there
SCOPE: Any = None
#: the options of whose entries, by the :class:`MemoryScope` field each fills
_SCOPE_OPTIONS = {
    "agent": typer.Option(
        None, "--agent", help="The agent whose entries (a Memory of scope agent)."
    ),
    "session": typer.Option(None, "--session", help="The session's entries (scope session)."),
    "system_run": typer.Option(
        None, "--system-run", help="The agent system run's entries, by its id (scope system_run)."
    ),
}


def scoped(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` with the options ``--agent``, ``--session`` and ``--system-run`` in
    place of its parameter ``scope``, which it is called with as one :class:`MemoryScope`:
    the options are declared once here, not in every command."""
    signature = inspect.signature(command)
    parameters: list[inspect.Parameter] = []
    for parameter in signature.parameters.values():
        if parameter.name != "scope":
            parameters.append(parameter)
            continue
        parameters += [
            parameter.replace(name=name, default=option, annotation="str | None")
            for name, option in _SCOPE_OPTIONS.items()
        ]

    @functools.wraps(command)
    def with_scope(*args: Any, **kwargs: Any) -> None:
        from corral.core.memory import MemoryScope

        given = {name: kwargs.pop(name) for name in _SCOPE_OPTIONS}
        command(*args, scope=MemoryScope(**given), **kwargs)

    # what typer reads: the signature, and the annotations it evaluates in this module
    with_scope.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    with_scope.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": "None"}
    return with_scope


def register(app: typer.Typer) -> None:
    app.add_typer(memory_app, name="memory")


def _pairs(items: list[str], what: str) -> dict[str, Any]:
    pairs: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"{what}: expected KEY=VALUE, not {item!r}", EXIT_BAD_INPUT)
        pairs[key] = value
    return pairs


def _stdin_text() -> str:
    """All of stdin as UTF-8 text (a clear error, not a traceback, when it is not)."""
    try:
        return sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError:
        fail("stdin is not UTF-8 text", EXIT_BAD_INPUT)


def _show(data: Any, output: str, lines: list[str]) -> None:
    if output == "json":
        typer.echo(json.dumps(data, ensure_ascii=False, indent=2))
    elif output == "text":
        for line in lines:
            typer.echo(line)
    else:
        fail(f"-o: 'text' or 'json', not {output!r}", EXIT_BAD_INPUT)


def _on_backend(
    namespace: str,
    name: str,
    scope: MemoryScope,
    work: Callable[[Backend, MemoryAt], Awaitable[T]],
) -> T:
    """Run ``work`` on this command's backend (a server, or the local store)."""

    async def go() -> T:
        from corral.cli.backend import MemoryAt
        from corral.cli.connect import open_backend

        async with open_backend() as backend:
            return await work(backend, MemoryAt(namespace, name, scope))

    return run_async(go())


@memory_app.command("write")
@scoped
def memory_write(
    name: str = MEMORY,
    text: str = typer.Argument(..., help="The text ('-': read it from stdin)."),
    key: str | None = typer.Option(None, "--key", help="Replace the entry with this key."),
    meta: list[str] = typer.Option([], "--meta", help="Metadata KEY=VALUE (repeatable)."),
    scope: MemoryScope = SCOPE,
    namespace: str = NAMESPACE,
) -> None:
    """Write one entry."""
    body = _stdin_text() if text == "-" else text
    metadata = _pairs(meta, "--meta")
    entry = _on_backend(
        namespace,
        name,
        scope,
        lambda backend, at: backend.write_memory(at, body, key=key, metadata=metadata),
    )
    typer.echo(f"memory/{name} entry {entry.key} written")


@memory_app.command("read")
@scoped
def memory_read(
    name: str = MEMORY,
    key: str = KEY,
    scope: MemoryScope = SCOPE,
    namespace: str = NAMESPACE,
    output: str = OUTPUT,
) -> None:
    """Print one entry's text."""
    entry = _on_backend(
        namespace,
        name,
        scope,
        lambda backend, at: backend.read_memory(at, key),
    )
    if entry is None:
        fail(f"memory/{name} has no entry {key!r}", EXIT_BAD_INPUT)
    _show(entry.model_dump(mode="json"), output, [entry.text])


@memory_app.command("search")
@scoped
def memory_search(
    name: str = MEMORY,
    query: str = typer.Argument(..., help="Words to look for."),
    top_k: int = typer.Option(5, "--top-k", min=1, max=100, help="How many results."),
    filters: list[str] = typer.Option([], "--filter", help="Metadata KEY=VALUE (repeatable)."),
    scope: MemoryScope = SCOPE,
    namespace: str = NAMESPACE,
    output: str = OUTPUT,
) -> None:
    """Search entries, best first: by full text, and by vectors too when the Memory has
    an embedding model (each result says which found it)."""
    equal = _pairs(filters, "--filter")
    hits = _on_backend(
        namespace,
        name,
        scope,
        lambda backend, at: backend.search_memory(at, query, top_k=top_k, filters=equal),
    )
    _show(
        [h.model_dump(mode="json") for h in hits],
        output,
        [f"{h.score:.4g}  {'+'.join(h.signals)}  {h.key}  {h.preview}" for h in hits],
    )


@memory_app.command("list")
@scoped
def memory_list(
    name: str = MEMORY,
    prefix: str = typer.Option("", "--prefix", help="Only keys starting with this."),
    limit: int = typer.Option(20, "--limit", min=1, max=100, help="How many entries."),
    scope: MemoryScope = SCOPE,
    namespace: str = NAMESPACE,
    output: str = OUTPUT,
) -> None:
    """List entries by key."""
    entries = _on_backend(
        namespace,
        name,
        scope,
        lambda backend, at: backend.memory_entries(at, prefix=prefix, limit=limit),
    )
    _show(
        [e.model_dump(mode="json") for e in entries],
        output,
        [f"{e.key}  {e.text[:80]}" for e in entries],
    )


@memory_app.command("delete")
@scoped
def memory_delete(
    name: str = MEMORY,
    key: str = KEY,
    scope: MemoryScope = SCOPE,
    namespace: str = NAMESPACE,
) -> None:
    """Delete one entry."""
    deleted = _on_backend(
        namespace,
        name,
        scope,
        lambda backend, at: backend.delete_memory(at, key),
    )
    if not deleted:
        fail(f"memory/{name} has no entry {key!r}", EXIT_BAD_INPUT)
    typer.echo(f"memory/{name} entry {key} deleted")


#: a document this long (characters), or more than one, gets progress lines on stderr
LARGE_INGEST_CHARS = 100_000


def _documents(source: str) -> tuple[list[tuple[str, str]], int]:
    """The (name, text) of each document ``source`` names: stdin (``-``), a file, or
    the regular files under a directory (sorted; see :mod:`corral.runtime.memory_files`:
    no symbolic link followed, no FIFO or device, hidden entries passed over), and how
    many were skipped, each with a line on stderr saying why."""
    if source == "-":
        return [("stdin", _stdin_text())], 0
    from corral.core.memory import MemoryInputError
    from corral.runtime.memory_files import read_documents

    try:
        found, skipped = read_documents(Path(source))
    except MemoryInputError as exc:
        fail(exc.message, EXIT_BAD_INPUT)
    for passed in skipped:
        typer.echo(f"skipped {passed.path}: {passed.reason}", err=True)
    if not found:
        fail(f"{source}: no text to ingest", EXIT_BAD_INPUT)
    return [(d.path, d.text) for d in found], len(skipped)


class _IngestProgress:
    """How far a large ingest is, on stderr only: a bar over the documents' characters
    when stderr is a terminal, else a line per document (logs and pipes keep lines)."""

    def __init__(self, documents: list[tuple[str, str]], *, shown: bool) -> None:
        self.documents = documents
        self.shown = shown
        self.bar: Progress | None = None
        self.task: TaskID | None = None
        if shown and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

            self.bar = Progress(
                TextColumn("ingest"),
                BarColumn(),
                TaskProgressColumn(),
                TextColumn("{task.fields[document]}", style="dim"),
                console=Console(stderr=True),
                transient=False,
            )

    def __enter__(self) -> _IngestProgress:
        if self.bar is not None:
            self.bar.start()
            total = sum(len(text) for _, text in self.documents)
            self.task = self.bar.add_task("ingest", total=total, document="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def _chars_before(self, number: int) -> int:
        return sum(len(text) for _, text in self.documents[: number - 1])

    def chunks(self, number: int) -> Callable[[int, int], None] | None:
        """The progress callback of document ``number`` (chunks written of its chunks)."""
        bar, task = self.bar, self.task
        if bar is None or task is None:
            return None
        path, text = self.documents[number - 1]
        before = self._chars_before(number)

        def advance(done: int, chunks: int) -> None:
            part = len(text) * done // max(chunks, 1)
            bar.update(task, completed=before + part, document=path)

        return advance

    def document(self, number: int, result: MemoryIngestOut) -> None:
        """Document ``number`` is done."""
        path, text = self.documents[number - 1]
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, completed=self._chars_before(number) + len(text))
        elif self.shown:
            typer.echo(
                f"[{number}/{len(self.documents)}] {path}: {result.chunks} chunks "
                f"({result.written} written)",
                err=True,
            )


@memory_app.command("ingest")
@scoped
def memory_ingest(
    name: str = MEMORY,
    source: str = typer.Argument(..., help="A file, a directory (recursively), or '-' (stdin)."),
    key_prefix: str | None = typer.Option(
        None, "--key-prefix", help="The entries' keys' start (default: each file's path)."
    ),
    meta: list[str] = typer.Option([], "--meta", help="Metadata KEY=VALUE (repeatable)."),
    scope: MemoryScope = SCOPE,
    namespace: str = NAMESPACE,
    output: str = OUTPUT,
) -> None:
    """Ingest text and Markdown documents, cut by the Memory's spec.chunking."""
    metadata = _pairs(meta, "--meta")
    documents, skipped = _documents(source)
    chatty = len(documents) > 1 or len(documents[0][1]) > LARGE_INGEST_CHARS
    several = len(documents) > 1

    async def work(backend: Backend, at: MemoryAt) -> list[MemoryIngestOut]:
        done = []
        with _IngestProgress(documents, shown=chatty) as progress:
            for number, (path, text) in enumerate(documents, 1):
                prefix = key_prefix
                if key_prefix is not None and several:  # one prefix per file
                    prefix = f"{key_prefix}/{path}"
                result = await backend.ingest_memory(
                    at,
                    text,
                    source=path,
                    key_prefix=prefix,
                    metadata=metadata,
                    progress=progress.chunks(number),
                )
                done.append(result)
                progress.document(number, result)
        return done

    results = _on_backend(namespace, name, scope, work)
    chunks = sum(r.chunks for r in results)
    written = sum(r.written for r in results)
    _show(
        [r.model_dump(mode="json") for r in results],
        output,
        [
            f"memory/{name}: {len(results)} document(s), {chunks} chunks, "
            f"{written} written ({chunks - written} already there)"
            + (f", {skipped} path(s) skipped" if skipped else "")
        ],
    )
