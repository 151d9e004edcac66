"""``corral memory write|read|search|list|delete NAME``: a Memory's entries, by hand.

These work on the store directly (no remote mode yet: the ``/v1/memories`` API is not
built). ``--agent`` / ``--session`` pick the entries of one agent or session in a
Memory of that scope. ``-o json`` prints the entries as JSON.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

from corral.cli.common import EXIT_BAD_INPUT, NAMESPACE, fail, run_async

memory_app = typer.Typer(
    help="The entries of a Memory (store backend): write, read, search, list, delete.",
    no_args_is_help=True,
)

MEMORY = typer.Argument(..., help="The Memory's name.")
KEY = typer.Argument(..., help="The entry's key.")
AGENT = typer.Option(None, "--agent", help="The agent whose entries (a Memory of scope agent).")
SESSION = typer.Option(None, "--session", help="The session's entries (scope session).")
JSON_OUTPUT = typer.Option("text", "-o", "--output", help="text or json.")


def register(app: typer.Typer) -> None:
    app.add_typer(memory_app, name="memory")


def _pairs(items: list[str], what: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"{what}: expected KEY=VALUE, not {item!r}", EXIT_BAD_INPUT)
        pairs[key] = value
    return pairs


def _show(data: Any, output: str, lines: list[str]) -> None:
    if output == "json":
        typer.echo(json.dumps(data, ensure_ascii=False, indent=2))
    elif output == "text":
        for line in lines:
            typer.echo(line)
    else:
        fail(f"-o: 'text' or 'json', not {output!r}", EXIT_BAD_INPUT)


def _local() -> None:
    from corral.cli.connect import require_local

    require_local("memory")


@memory_app.command("write")
def memory_write(
    name: str = MEMORY,
    text: str = typer.Argument(..., help="The text ('-': read it from stdin)."),
    key: str | None = typer.Option(None, "--key", help="Replace the entry with this key."),
    meta: list[str] = typer.Option([], "--meta", help="Metadata KEY=VALUE (repeatable)."),
    agent: str | None = AGENT,
    session: str | None = SESSION,
    namespace: str = NAMESPACE,
) -> None:
    """Write one entry."""
    _local()
    body = sys.stdin.read() if text == "-" else text
    metadata = _pairs(meta, "--meta")

    async def go() -> str:
        from corral.cli.connect import open_cli_store
        from corral.core.ids import new_id
        from corral.runtime.memory import write_entry

        async with open_cli_store() as (store, _):
            entry = await write_entry(
                store,
                namespace,
                name,
                body,
                key=key or new_id("mem"),
                metadata=metadata,
                agent=agent,
                session=session,
            )
            return entry.key

    typer.echo(f"memory/{name} entry {run_async(go())} written")


@memory_app.command("read")
def memory_read(
    name: str = MEMORY,
    key: str = KEY,
    agent: str | None = AGENT,
    session: str | None = SESSION,
    namespace: str = NAMESPACE,
    output: str = JSON_OUTPUT,
) -> None:
    """Print one entry's text."""
    _local()

    async def go() -> dict[str, Any] | None:
        from corral.cli.connect import open_cli_store
        from corral.runtime.memory import memory_place

        async with open_cli_store() as (store, _):
            _, place = await memory_place(store, namespace, name, agent=agent, session=session)
            entry = await store.read_memory(place, key)
        if entry is None:
            return None
        return {"key": entry.key, "text": entry.text, "metadata": entry.metadata}

    found = run_async(go())
    if found is None:
        fail(f"memory/{name} has no entry {key!r}", EXIT_BAD_INPUT)
    _show(found, output, [found["text"]])


@memory_app.command("search")
def memory_search(
    name: str = MEMORY,
    query: str = typer.Argument(..., help="Words to look for."),
    top_k: int = typer.Option(5, "--top-k", min=1, max=100, help="How many results."),
    filters: list[str] = typer.Option([], "--filter", help="Metadata KEY=VALUE (repeatable)."),
    agent: str | None = AGENT,
    session: str | None = SESSION,
    namespace: str = NAMESPACE,
    output: str = JSON_OUTPUT,
) -> None:
    """Search entries by full text, best first."""
    _local()
    equal = _pairs(filters, "--filter")

    async def go() -> list[dict[str, Any]]:
        from corral.cli.connect import open_cli_store
        from corral.runtime.memory import memory_place

        async with open_cli_store() as (store, _):
            _, place = await memory_place(store, namespace, name, agent=agent, session=session)
            hits = await store.search_memory(place, query, top_k=top_k, filters=equal)
        return [{"key": h.entry.key, "score": h.score, "preview": h.entry.preview()} for h in hits]

    hits = run_async(go())
    _show(hits, output, [f"{h['score']:.4g}  {h['key']}  {h['preview']}" for h in hits])


@memory_app.command("list")
def memory_list(
    name: str = MEMORY,
    prefix: str = typer.Option("", "--prefix", help="Only keys starting with this."),
    limit: int = typer.Option(20, "--limit", min=1, max=100, help="How many entries."),
    after: str | None = typer.Option(None, "--after", help="Start after this key."),
    agent: str | None = AGENT,
    session: str | None = SESSION,
    namespace: str = NAMESPACE,
    output: str = JSON_OUTPUT,
) -> None:
    """List entries by key."""
    _local()

    async def go() -> list[dict[str, Any]]:
        from corral.cli.connect import open_cli_store
        from corral.runtime.memory import memory_place

        async with open_cli_store() as (store, _):
            _, place = await memory_place(store, namespace, name, agent=agent, session=session)
            entries = await store.list_memory(place, prefix=prefix, limit=limit, after=after)
        return [{"key": e.key, "preview": e.preview(), "metadata": e.metadata} for e in entries]

    entries = run_async(go())
    _show(entries, output, [f"{e['key']}  {e['preview']}" for e in entries])


@memory_app.command("delete")
def memory_delete(
    name: str = MEMORY,
    key: str = KEY,
    agent: str | None = AGENT,
    session: str | None = SESSION,
    namespace: str = NAMESPACE,
) -> None:
    """Delete one entry."""
    _local()

    async def go() -> bool:
        from corral.cli.connect import open_cli_store
        from corral.runtime.memory import memory_place

        async with open_cli_store() as (store, _):
            _, place = await memory_place(store, namespace, name, agent=agent, session=session)
            return await store.delete_memory_entry(place, key)

    if not run_async(go()):
        fail(f"memory/{name} has no entry {key!r}", EXIT_BAD_INPUT)
    typer.echo(f"memory/{name} entry {key} deleted")
