"""Memory entries in the store: written once per idempotency key, searched by full text
(BM25 over the scope's words, indexed in process, on both dialects), filtered, kept by retention,
isolated by namespace and scope, and deleted with their Memory.

Run against every store URL of ``store_url`` (SQLite, both paths, and PostgreSQL).
"""

from __future__ import annotations

import pytest

from corral.core.errors import ConflictError
from corral.core.memory import (
    MAX_ENTRY_CHARS,
    MAX_QUERY_TERMS,
    MemoryEntry,
    MemoryInputError,
    MemoryPlace,
    query_terms,
)
from corral.resources.loader import load_text
from corral.store import Store
from test_store import (  # noqa: F401 - fixtures
    cipher_fixture,
    store_fixture,
    store_url_fixture,
)

NOTES = MemoryPlace("default", "notes")


def entry(key: str, text: str, place: MemoryPlace = NOTES, **extra: object) -> MemoryEntry:
    return MemoryEntry(place.namespace, place.memory, place.scope_key, key, text, **extra)  # type: ignore[arg-type]


async def keys_found(
    store: Store, query: str, place: MemoryPlace = NOTES, **kw: object
) -> list[str]:
    return [hit.entry.key for hit in await store.search_memory(place, query, **kw)]  # type: ignore[arg-type]


async def test_a_written_entry_is_read_listed_and_found_by_its_words(store: Store) -> None:
    stored, written = await store.write_memory(
        entry("k1", "The deploy key rotates every Tuesday", metadata={"topic": "ops"})
    )
    assert written and stored.key == "k1" and stored.metadata == {"topic": "ops"}
    await store.write_memory(entry("k2", "Lunch is at noon on Fridays"))
    read = await store.read_memory(NOTES, "k1")
    assert read is not None and read.text == "The deploy key rotates every Tuesday"
    assert [e.key for e in await store.list_memory(NOTES)] == ["k1", "k2"]
    hits = await store.search_memory(NOTES, "when does the DEPLOY key rotate?")
    assert [h.entry.key for h in hits] == ["k1"]
    assert hits[0].score > 0
    # more and rarer matching words rank higher
    await store.write_memory(entry("k3", "Fridays: the deploy freeze starts at noon"))
    assert (await keys_found(store, "deploy freeze"))[0] == "k3"


async def test_a_write_with_a_used_idempotency_key_is_not_made_again(store: Store) -> None:
    _, written = await store.write_memory(entry("a", "first words", idempotency_key="run1:1:0"))
    again, written_again = await store.write_memory(
        entry("b", "other words", idempotency_key="run1:1:0")
    )
    assert (written, written_again) == (True, False)
    assert again.key == "a" and again.text == "first words"
    assert [e.key for e in await store.list_memory(NOTES)] == ["a"]


async def test_writing_a_key_again_replaces_its_text_and_the_old_words_are_not_found(
    store: Store,
) -> None:
    await store.write_memory(entry("k", "apples are red"))
    await store.write_memory(entry("k", "bananas are yellow", metadata={"fruit": True}))
    assert await keys_found(store, "apples") == []
    assert await keys_found(store, "bananas") == ["k"]
    read = await store.read_memory(NOTES, "k")
    assert read is not None and read.metadata == {"fruit": True}
    assert read.created_at <= read.updated_at


async def test_namespaces_and_scopes_never_see_each_others_entries(store: Store) -> None:
    team = MemoryPlace("team", "notes")
    alice, bob = MemoryPlace("default", "notes", "alice"), MemoryPlace("default", "notes", "bob")
    await store.write_memory(entry("k", "secret plan zebra", team))
    await store.write_memory(entry("k", "alice likes zebra", alice))
    assert await keys_found(store, "zebra") == []
    assert await store.read_memory(NOTES, "k") is None
    assert await keys_found(store, "zebra", bob) == []
    assert await keys_found(store, "zebra", alice) == ["k"]
    assert await keys_found(store, "zebra", team) == ["k"]
    assert not await store.delete_memory_entry(bob, "k")
    assert await store.delete_memory_entry(alice, "k")
    assert await keys_found(store, "zebra", alice) == []


async def test_filters_match_metadata_values_by_equality_and_type(store: Store) -> None:
    await store.write_memory(entry("a", "report alpha", metadata={"team": "red", "n": 1}))
    await store.write_memory(entry("b", "report beta", metadata={"team": "blue", "n": "1"}))
    await store.write_memory(entry("c", "report gamma", metadata={"team": "red", "ok": True}))
    assert sorted(await keys_found(store, "report", filters={"team": "red"})) == ["a", "c"]
    assert await keys_found(store, "report", filters={"n": 1}) == ["a"]
    assert await keys_found(store, "report", filters={"n": "1"}) == ["b"]
    assert await keys_found(store, "report", filters={"ok": True}) == ["c"]
    assert await keys_found(store, "report", filters={"team": "red", "ok": False}) == []
    assert await keys_found(store, "report", filters={"missing": "x"}) == []
    with pytest.raises(MemoryInputError, match="filter key"):
        await store.search_memory(NOTES, "report", filters={"a'b": 1})


async def test_retention_keeps_the_newest_entries_of_each_scope(store: Store) -> None:
    alice = MemoryPlace("default", "notes", "alice")
    for i in range(5):
        await store.write_memory(entry(f"k{i}", f"note {i}"), max_entries=3)
    await store.write_memory(entry("x", "alice's own"), max_entries=3)
    await store.write_memory(entry("x", "alice's own", alice), max_entries=3)
    assert [e.key for e in await store.list_memory(NOTES)] == ["k3", "k4", "x"]
    assert [e.key for e in await store.list_memory(alice)] == ["x"]
    # an age limit drops what was written before it
    far_future = 10_000 * 86_400.0 + (await store.list_memory(NOTES))[0].updated_at
    assert await store.prune_memory(NOTES, max_age_days=1, now=far_future) == 3
    assert await store.list_memory(NOTES) == []
    assert await keys_found(store, "note") == []


async def test_listing_pages_by_key_and_prefix(store: Store) -> None:
    for key in ["user/1", "user/2", "user/3", "team/1", "user_x"]:
        await store.write_memory(entry(key, f"entry {key}"))
    first = await store.list_memory(NOTES, prefix="user/", limit=2)
    assert [e.key for e in first] == ["user/1", "user/2"]
    rest = await store.list_memory(NOTES, prefix="user/", limit=2, after=first[-1].key)
    assert [e.key for e in rest] == ["user/3"]
    # no LIKE wildcards: '_' and '%' are themselves
    assert [e.key for e in await store.list_memory(NOTES, prefix="user_")] == ["user_x"]
    assert await store.list_memory(NOTES, prefix="%") == []


HOSTILE_QUERIES = [
    '"',
    '""',
    "'",
    "a AND",
    "OR OR OR",
    "NOT",
    "NEAR(a b, 2)",
    "text:apple",
    "appl*",
    "^apple",
    "(apple",
    "apple) OR (",
    "-apple",
    "!apple & | <-> :*",
    "\\",
    "\x00 apple \x1f",
    "🍎 apple 🍏",
    "' OR 1=1 --",
    "memory_fts MATCH 'x'",
    "",
    "   ",
    "x" * 5000,
    " ".join(f"w{i}" for i in range(500)),
]


@pytest.mark.parametrize("query", HOSTILE_QUERIES, ids=range(len(HOSTILE_QUERIES)))
async def test_no_query_text_is_read_as_full_text_syntax(store: Store, query: str) -> None:
    await store.write_memory(entry("k", "an apple a day; NEAR and OR are words too"))
    hits = await store.search_memory(NOTES, query)
    words = query_terms(query)
    assert len(words) <= MAX_QUERY_TERMS
    assert [h.entry.key for h in hits] == (
        ["k"] if {"apple", "near", "or", "and"} & set(words) else []
    )


async def test_unicode_text_is_found_by_its_words(store: Store) -> None:
    await store.write_memory(entry("de", "Die Brücke über den Fluß ist gesperrt"))
    await store.write_memory(entry("ru", "привет мир, это заметка"))
    await store.write_memory(entry("el", "Καλημέρα κόσμε"))
    await store.write_memory(entry("emoji", "status 🚀 launched"))
    assert await keys_found(store, "brücke") == ["de"]
    assert await keys_found(store, "fluß") == ["de"]
    assert await keys_found(store, "мир") == ["ru"]
    assert await keys_found(store, "κόσμε") == ["el"]
    assert await keys_found(store, "launched 🚀") == ["emoji"]


async def test_entries_that_do_not_fit_are_refused_with_a_reason(store: Store) -> None:
    with pytest.raises(MemoryInputError, match=f"at most {MAX_ENTRY_CHARS} characters"):
        await store.write_memory(entry("big", "x" * (MAX_ENTRY_CHARS + 1)))
    with pytest.raises(MemoryInputError, match="needs some text"):
        await store.write_memory(entry("empty", "  \n"))
    with pytest.raises(MemoryInputError, match="key"):
        await store.write_memory(entry("", "text"))
    with pytest.raises(MemoryInputError, match="must be a string, number or boolean"):
        await store.write_memory(entry("k", "text", metadata={"nested": {"a": 1}}))
    with pytest.raises(MemoryInputError, match="NUL"):
        await store.write_memory(entry("k", "before\x00after"))
    with pytest.raises(MemoryInputError, match="lone surrogate"):
        await store.write_memory(entry("k", "broken \ud800 text"))
    with pytest.raises(MemoryInputError, match="NUL"):
        await store.write_memory(entry("k", "text", metadata={"a": "\x00"}))
    with pytest.raises(MemoryInputError, match="finite"):
        await store.write_memory(entry("k", "text", metadata={"a": float("nan")}))
    # a query of such characters finds nothing and fails nothing
    assert await store.search_memory(NOTES, "\ud800 \x00") == []
    assert await store.list_memory(NOTES) == []


MEMORY_AND_AGENT = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: script}
spec: {provider: scripted}
---
apiVersion: corral/v1
kind: Memory
metadata: {name: notes}
spec: {scope: namespace}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: writer}
spec: {model: script, memory: [{ref: notes, access: write}]}
"""


async def test_a_memory_in_use_is_not_deleted_and_its_entries_go_with_it(store: Store) -> None:
    await store.apply(load_text(MEMORY_AND_AGENT, "m.yaml"))
    await store.write_memory(entry("k", "kept until the memory goes"))
    other = MemoryPlace("team", "notes")
    await store.write_memory(entry("k", "another namespace's", other))
    with pytest.raises(ConflictError, match=r"Agent 'writer' \(spec.memory\[0\].ref\)"):
        await store.delete_resource("default", "Memory", "notes")
    assert await store.read_memory(NOTES, "k") is not None
    await store.delete_resource("default", "Agent", "writer")
    await store.delete_resource("default", "Memory", "notes")
    assert await store.read_memory(NOTES, "k") is None
    assert await keys_found(store, "kept") == []
    assert await store.read_memory(other, "k") is not None


async def test_stats_count_every_scope_of_one_memory(store: Store, store_url: str) -> None:
    empty = await store.memory_stats("default", "notes")
    assert (empty.entries, empty.text_chars, empty.scopes) == (0, 0, 0)
    await store.write_memory(entry("a", "héllo"))
    await store.write_memory(entry("b", "world", MemoryPlace("default", "notes", "alice")))
    await store.write_memory(entry("c", "elsewhere", MemoryPlace("team", "notes")))
    stats = await store.memory_stats("default", "notes")
    assert (stats.entries, stats.text_chars, stats.scopes) == (2, 10, 2)
    assert "BM25" in stats.index
