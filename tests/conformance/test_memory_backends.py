"""What every memory backend does, run against each one through the seam
(:class:`corral.tools.memory_backend.MemoryBackend`), as the memory tools and the front
doors call it.

Rows of :data:`BACKENDS`: the ``store`` backend on SQLite and on PostgreSQL (the
machine's server, a scratch database per test), and the ``http`` backend against a real
memory service speaking docs/memory-http.md (``tests/memory_service.py``: uvicorn on
127.0.0.1, bearer auth). Each backend is opened by ``open_memory_backend`` from a
Memory spec, as the runtime opens it. A new backend gets these tests by a row. What only
one backend does (the store's SQL, the http backend's hostile services) stays in its own
module (``tests/test_store_memory.py``, ``tests/test_memory_http.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from corral.core.memory import MemoryEntry, MemoryInputError, MemoryPlace
from corral.resources.memory import MemorySpec
from corral.store import Store, open_store
from corral.tools.memory_backend import MemoryBackend, open_memory_backend
from databases import PostgresServer
from memory_service import memory_service

BACKENDS = ["store-sqlite", "store-postgresql", "http"]
TOKEN = "svc-token-0123456789abcdef"

NOTES = MemoryPlace("default", "notes")
Opener = Callable[..., MemoryBackend]


def entry(key: str, text: str, place: MemoryPlace = NOTES, **extra: Any) -> MemoryEntry:
    return MemoryEntry(place.namespace, place.memory, place.scope_key, key, text, **extra)


@pytest.fixture(params=BACKENDS)
async def opener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """Opens a backend of the row for a Memory spec (``retention`` and the like);
    every backend opened is closed after the test."""
    async with AsyncExitStack() as stack:
        if request.param == "store-postgresql":
            postgres: PostgresServer = request.getfixturevalue("postgres")
            url = postgres.url(postgres.scratch())
        else:
            url = f"sqlite:///{tmp_path / 'corral.db'}"
        store: Store = await stack.enter_async_context(await open_store(url))
        extra: dict[str, Any] = {}
        secrets: dict[str, str] = {}
        if request.param == "http":
            service = stack.enter_context(memory_service(tmp_path / "service.db", token=TOKEN))
            extra = {
                "backend": "http",
                "http": {
                    "url": service.url,
                    "allow_private": True,
                    "auth": {"type": "bearer", "secret": "svc"},
                    "timeout_seconds": 10,
                },
            }
            secrets = {"svc": TOKEN}

        def open_backend(**spec: Any) -> MemoryBackend:
            backend = open_memory_backend("notes", MemorySpec(**spec, **extra), store, secrets)
            stack.push_async_callback(backend.aclose)
            return backend

        yield open_backend


async def keys_found(
    backend: MemoryBackend, query: str, place: MemoryPlace = NOTES, **kw: Any
) -> list[str]:
    return [hit.entry.key for hit in await backend.search(place, query, **kw)]


async def test_a_written_entry_is_read_listed_and_found_by_its_words(opener: Opener) -> None:
    backend = opener()
    stored, written = await backend.write(
        entry("k1", "The deploy key rotates every Tuesday", metadata={"topic": "ops"})
    )
    assert written and stored.key == "k1" and stored.metadata == {"topic": "ops"}
    assert stored.created_at > 0 and stored.updated_at >= stored.created_at
    await backend.write(entry("k2", "Lunch is at noon on Fridays"))
    read = await backend.read(NOTES, "k1")
    assert read is not None and read.text == "The deploy key rotates every Tuesday"
    assert read.place == NOTES
    assert await backend.read(NOTES, "absent") is None
    assert [e.key for e in await backend.list_entries(NOTES)] == ["k1", "k2"]
    hits = await backend.search(NOTES, "when does the DEPLOY key rotate?")
    assert [h.entry.key for h in hits] == ["k1"] and hits[0].score > 0


async def test_a_replayed_write_is_not_made_twice(opener: Opener) -> None:
    backend = opener()
    _, written = await backend.write(entry("a", "first words", idempotency_key="run1:1:0"))
    again, written_again = await backend.write(
        entry("b", "other words", idempotency_key="run1:1:0")
    )
    assert (written, written_again) == (True, False)
    assert again.key == "a" and again.text == "first words"
    assert [e.key for e in await backend.list_entries(NOTES)] == ["a"]


async def test_writing_a_key_again_replaces_it(opener: Opener) -> None:
    backend = opener()
    await backend.write(entry("k", "apples are red"))
    await backend.write(entry("k", "bananas are yellow", metadata={"fruit": True}))
    assert await keys_found(backend, "apples") == []
    assert await keys_found(backend, "bananas") == ["k"]
    read = await backend.read(NOTES, "k")
    assert read is not None and read.metadata == {"fruit": True}


async def test_scopes_and_foreign_namespaces_never_see_each_others_entries(
    opener: Opener,
) -> None:
    backend = opener()
    team = MemoryPlace("team", "notes")
    alice, bob = MemoryPlace("default", "notes", "alice"), MemoryPlace("default", "notes", "bob")
    await backend.write(entry("k", "secret plan zebra", team))
    await backend.write(entry("k", "alice likes zebra", alice))
    assert await keys_found(backend, "zebra") == []
    assert await backend.read(NOTES, "k") is None
    assert await backend.list_entries(bob) == []
    assert await keys_found(backend, "zebra", bob) == []
    assert await keys_found(backend, "zebra", alice) == ["k"]
    assert await keys_found(backend, "zebra", team) == ["k"]
    # a delete elsewhere deletes nothing here
    assert not await backend.delete(bob, "k")
    assert not await backend.delete(MemoryPlace("default", "notes"), "k")
    assert await backend.delete(alice, "k")
    assert not await backend.delete(alice, "k")
    assert await keys_found(backend, "zebra", alice) == []
    assert (await backend.read(team, "k")) is not None
    stats = await backend.stats("default", "notes")
    assert stats.entries == 0
    assert (await backend.stats("team", "notes")).entries == 1


async def test_filters_match_metadata_values_by_equality_and_type(opener: Opener) -> None:
    backend = opener()
    await backend.write(entry("a", "report alpha", metadata={"team": "red", "n": 1}))
    await backend.write(entry("b", "report beta", metadata={"team": "blue", "n": "1"}))
    await backend.write(entry("c", "report gamma", metadata={"team": "red", "ok": True}))
    assert sorted(await keys_found(backend, "report", filters={"team": "red"})) == ["a", "c"]
    assert await keys_found(backend, "report", filters={"n": 1}) == ["a"]
    assert await keys_found(backend, "report", filters={"n": "1"}) == ["b"]
    assert await keys_found(backend, "report", filters={"ok": True}) == ["c"]
    assert await keys_found(backend, "report", filters={"missing": "x"}) == []
    assert len(await backend.search(NOTES, "report", top_k=2)) == 2
    with pytest.raises(MemoryInputError, match="filter key"):
        await backend.search(NOTES, "report", filters={"a'b": 1})


async def test_retention_keeps_the_newest_entries_of_each_scope(opener: Opener) -> None:
    backend = opener(retention={"max_entries": 3, "max_age_days": 1})
    alice = MemoryPlace("default", "notes", "alice")
    for i in range(5):
        await backend.write(entry(f"k{i}", f"note {i}"))
    await backend.write(entry("x", "alice's own", alice))
    assert [e.key for e in await backend.list_entries(NOTES)] == ["k2", "k3", "k4"]
    assert [e.key for e in await backend.list_entries(alice)] == ["x"]
    # the age limit drops what was written before it
    far_future = 10_000 * 86_400.0 + (await backend.list_entries(NOTES))[0].updated_at
    assert await backend.prune(NOTES, now=far_future) == 3
    assert await backend.list_entries(NOTES) == []
    assert await keys_found(backend, "note") == []
    assert [e.key for e in await backend.list_entries(alice)] == ["x"]


async def test_listing_pages_by_key_and_prefix(opener: Opener) -> None:
    backend = opener()
    for key in ["user/1", "user/2", "user/3", "team/1", "user_x", "üser"]:
        await backend.write(entry(key, f"entry {key}"))
    first = await backend.list_entries(NOTES, prefix="user/", limit=2)
    assert [e.key for e in first] == ["user/1", "user/2"]
    rest = await backend.list_entries(NOTES, prefix="user/", limit=2, after=first[-1].key)
    assert [e.key for e in rest] == ["user/3"]
    assert [e.key for e in await backend.list_entries(NOTES, prefix="user_")] == ["user_x"]
    assert await backend.list_entries(NOTES, prefix="%") == []
    assert [e.key for e in await backend.list_entries(NOTES, prefix="ü")] == ["üser"]


async def test_unicode_text_round_trips_and_is_found(opener: Opener) -> None:
    backend = opener()
    text = "Ünïcödé naïve café — 東京 🚀 straße"
    await backend.write(entry("u", text, metadata={"lang": "日本語"}))
    read = await backend.read(NOTES, "u")
    assert read is not None and read.text == text and read.metadata == {"lang": "日本語"}
    assert await keys_found(backend, "café") == ["u"]


async def test_what_does_not_fit_is_refused_as_input_and_nothing_is_written(
    opener: Opener,
) -> None:
    backend = opener()
    with pytest.raises(MemoryInputError, match="at most"):
        await backend.write(entry("big", "x" * 16_001))
    with pytest.raises(MemoryInputError, match="key"):
        await backend.write(entry("k" * 256, "text"))
    with pytest.raises(MemoryInputError, match="lone surrogate"):
        await backend.write(entry("k", "broken \ud800 text"))
    with pytest.raises(MemoryInputError, match="must be a string, number or boolean"):
        await backend.write(entry("k", "text", metadata={"nested": {"a": 1}}))
    assert await backend.list_entries(NOTES) == []
    # query syntax is words, never syntax, whatever the backend
    await backend.write(entry("q", "plain words here"))
    assert await keys_found(backend, 'words" OR * NEAR(') == ["q"]


async def test_stats_count_every_scope_of_one_memory(opener: Opener) -> None:
    backend = opener()
    empty = await backend.stats("default", "notes")
    assert (empty.entries, empty.text_chars, empty.scopes) == (0, 0, 0)
    await backend.write(entry("a", "héllo"))
    await backend.write(entry("b", "world", MemoryPlace("default", "notes", "alice")))
    await backend.write(entry("c", "elsewhere", MemoryPlace("team", "notes")))
    stats = await backend.stats("default", "notes")
    assert (stats.entries, stats.text_chars, stats.scopes) == (2, 10, 2)
    assert stats.index
