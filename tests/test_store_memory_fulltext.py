"""Full-text search of Memory entries in the SQL store (``store/sql/fulltext.py`` over
``store/sql/fulltext_index.py``), the same on SQLite and PostgreSQL: the ranking is BM25
over the scope's own entries, hit for hit and score for score as a plain reference
computes it from the entries in the database (read with the database's own client), on
corpora of common words, ties and several scopes; after writes, rewrites, deletes and
prunes (the index brought up to date, not rebuilt) it is the ranking a fresh process
computes; and it stays so for hostile queries and texts that are not ASCII.
"""

from __future__ import annotations

import math
import random
import re
import sqlite3
import unicodedata
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from corral.core.memory import MAX_QUERY_TERMS, MemoryEntry, MemoryPlace, query_terms
from corral.store import Store, open_store
from databases import PostgresServer

NOTES = MemoryPlace("default", "notes")
OTHER = MemoryPlace("default", "notes", "other")
# a few very common words (in more than half the entries), some middling, many rare
COMMON = ["the", "and", "of"]
MIDDLING = [f"mid{n}" for n in range(12)]
RARE = [f"rare{n}" for n in range(300)]

Rows = Callable[[MemoryPlace], Awaitable[list[tuple[int, str, str, float]]]]


@dataclass
class Opened:
    """A store, how to open another on the same database, and the scope's rows as the
    database holds them (id, key, text, updated_at), read with its own client."""

    store: Store
    url: str
    rows: Rows


@pytest.fixture(name="opened", params=["sqlite", "postgresql"])
async def opened_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opened]:
    if request.param == "postgresql":
        postgres: PostgresServer = request.getfixturevalue("postgres")
        database = postgres.scratch()
        url = postgres.url(database)

        async def rows(place: MemoryPlace) -> list[tuple[int, str, str, float]]:
            found = await postgres.admin(
                "SELECT id, key, text, updated_at FROM memory_entries WHERE namespace = "
                f"'{place.namespace}' AND memory = '{place.memory}' "
                f"AND scope_key = '{place.scope_key}'",
                database=database,
            )
            return [tuple(row) for row in found]  # type: ignore[misc]

    else:
        path = tmp_path / "corral.db"
        url = f"sqlite:///{path}"

        async def rows(place: MemoryPlace) -> list[tuple[int, str, str, float]]:
            with sqlite3.connect(path) as db:
                return db.execute(
                    "SELECT id, key, text, updated_at FROM memory_entries "
                    "WHERE namespace = ? AND memory = ? AND scope_key = ?",
                    (place.namespace, place.memory, place.scope_key),
                ).fetchall()

    async with await open_store(url) as store:
        yield Opened(store, url, rows)


def reference_tokens(text: str) -> list[str]:
    return [w.lower() for w in re.findall(r"[^\W_]+", unicodedata.normalize("NFC", text))]


async def reference(opened: Opened, place: MemoryPlace, query: str, top_k: int) -> list[Any]:
    """BM25 of the scope's entries as the docs state it (k1 1.2, b 0.75, idf ln(1 + (N - n
    + 0.5) / (n + 0.5)), shares added in the query's order), best first, ties to the entry
    written last, then the lower id."""
    entries = await opened.rows(place)
    terms = query_terms(query)
    if not entries or not terms:
        return []
    counted = {n: Counter(reference_tokens(text)) for n, _, text, _ in entries}
    lengths = {n: sum(counts.values()) for n, counts in counted.items()}
    average = sum(lengths.values()) / len(entries)
    holding = {t: sum(1 for counts in counted.values() if counts[t]) for t in terms}
    ranked = []
    for n, key, _, updated_at in entries:
        score, matched = 0.0, False
        for term in terms:
            f = counted[n][term]
            if not f:
                continue
            held = holding[term]
            idf = math.log(1.0 + (len(entries) - held + 0.5) / (held + 0.5))
            norm = 1.2 * (1.0 - 0.75 + 0.75 * lengths[n] / average)
            score += idf * (f * (1.2 + 1.0)) / (f + norm)
            matched = True
        if matched:
            ranked.append((-score, -updated_at, n, key))
    return [(key, -score) for score, _, _, key in sorted(ranked)[:top_k]]


async def found(store: Store, place: MemoryPlace, query: str, top_k: int) -> list[Any]:
    hits = await store.search_memory(place, query, top_k=top_k)
    return [(hit.entry.key, hit.score) for hit in hits]


def text(rng: random.Random) -> str:
    """Entries of 3 to 30 words: common words most, then middling, then rare; some
    capitalised or punctuated."""
    words = []
    for _ in range(rng.randint(3, 30)):
        pick = rng.random()
        word = (
            rng.choice(COMMON)
            if pick < 0.5
            else rng.choice(MIDDLING)
            if pick < 0.8
            else rng.choice(RARE)
        )
        words.append(word.upper() if rng.random() < 0.05 else word)
    return " ".join(words) + rng.choice(["", ".", "!", " -- ok?"])


async def write_corpus(store: Store, rng: random.Random, size: int) -> None:
    entries = [MemoryEntry("default", "notes", "", f"e{n:04d}", text(rng)) for n in range(size)]
    # ties: the same text again and again, and another scope holding the same words
    entries += [MemoryEntry("default", "notes", "", f"tie{n}", "rare7 the mid3") for n in range(30)]
    entries += [
        MemoryEntry("default", "notes", "other", f"o{n:04d}", text(rng)) for n in range(size // 2)
    ]
    for start in range(0, len(entries), 200):
        await store.write_memories(entries[start : start + 200])


QUERIES = ["rare7 the mid3", "the and of", "mid1 mid2", "RARE5, rare6; the?", "rare299 of"]


async def agrees(opened: Opened, queries: list[str], tops: tuple[int, ...] = (1, 10)) -> None:
    for query in queries:
        for place in (NOTES, OTHER):
            for top_k in tops:
                expected = await reference(opened, place, query, top_k)
                got = await found(opened.store, place, query, top_k)
                assert got == expected, (query, place, top_k)


async def test_the_search_is_bm25_over_the_scope_hit_for_hit_and_score_for_score(
    opened: Opened,
) -> None:
    rng = random.Random(18)
    await write_corpus(opened.store, rng, 800)
    queries = QUERIES + [
        " ".join(rng.choice(COMMON + MIDDLING + RARE) for _ in range(rng.randint(1, 5)))
        for _ in range(20)
    ]
    await agrees(opened, queries, (1, 5, 50))


async def test_after_rewrites_deletes_and_prunes_the_ranking_is_a_fresh_processs(
    opened: Opened,
) -> None:
    """The index brought up to date from the scope's changes ranks as one built whole by
    a store opened afterwards (a restart, another process): the same hits, the same
    doubles; and as the reference."""
    rng = random.Random(7)
    await write_corpus(opened.store, rng, 400)
    await agrees(opened, QUERIES)  # the index is built and kept
    await opened.store.write_memories(
        [MemoryEntry("default", "notes", "", f"e{n:04d}", "rare11 " * 3) for n in range(10)]
    )
    await agrees(opened, ["rare11"])
    for n in range(100, 130, 3):
        await opened.store.delete_memory_entry(NOTES, f"e{n:04d}")
    await agrees(opened, ["rare11 the"])
    await opened.store.prune_memory(NOTES, max_entries=410)
    queries = [*QUERIES, "rare11 mid2", "rare11", "the rare11"]
    await agrees(opened, queries)
    assert opened.store.memory_fulltext.indexes.updates >= 3  # type: ignore[attr-defined]
    async with await open_store(opened.url) as fresh:
        for query in queries:
            assert await found(fresh, NOTES, query, 20) == await found(
                opened.store, NOTES, query, 20
            )
        assert fresh.memory_fulltext.indexes.updates == 0  # type: ignore[attr-defined]


async def test_words_that_are_not_ascii_are_found_and_ranked(opened: Opened) -> None:
    texts = [
        "Überraschung im Café am Fluss",
        "café crème and the rare1",
        "the rare1 naïve façade",
        "rare1 rare1 ÜBERRASCHUNG",
        "東京 の the 東京",
        "plain rare1 words the",
        "a cafe\u0301 written with a combining accent",  # found by "café" (composed)
        "snake_case words_joined",  # "_" parts words, as in a query
    ]
    await opened.store.write_memories(
        [MemoryEntry("default", "notes", "", f"k{n}", t) for n, t in enumerate(texts)]
    )
    for query in ("überraschung", "café rare1", "rare1 the", "東京", "naïve rare1", "joined"):
        for top_k in (1, 3, 10):
            expected = await reference(opened, NOTES, query, top_k)
            assert await found(opened.store, NOTES, query, top_k) == expected, query
    assert sorted(key for key, _ in await found(opened.store, NOTES, "café", 10)) == [
        "k0",
        "k1",
        "k6",
    ]
    assert [key for key, _ in await found(opened.store, NOTES, "ÜBERRASCHUNG", 10)] == [
        "k3",
        "k0",
    ]


async def test_hostile_queries_answer_as_the_reference(opened: Opened) -> None:
    # an empty scope first: nothing indexed at all
    assert await found(opened.store, NOTES, "anything at all", 5) == []
    rng = random.Random(3)
    await write_corpus(opened.store, rng, 300)
    thousand = " ".join(rng.choice(COMMON + MIDDLING + RARE + ["absent"]) for _ in range(1_000))
    assert len(query_terms(thousand)) == MAX_QUERY_TERMS
    only_common = "THE and, of the AND"
    syntax = ['rare3" OR "x', "mid1 NEAR(x) *", "absent missing", "memory_fts MATCH 'x'"]
    for query in (thousand, only_common, *syntax, "fts_vector @@ to_tsquery('x')"):
        expected = await reference(opened, NOTES, query, 20)
        assert await found(opened.store, NOTES, query, 20) == expected, query
    assert await found(opened.store, NOTES, "?!, ... --", 5) == []
    empty = MemoryPlace("default", "notes", "nobody")
    assert await found(opened.store, empty, "the rare7", 5) == []


async def test_a_scope_emptied_by_deletes_finds_nothing(opened: Opened) -> None:
    await opened.store.write_memories(
        [MemoryEntry("default", "notes", "", f"k{n}", "rare1 the") for n in range(5)]
    )
    assert len(await found(opened.store, NOTES, "rare1", 10)) == 5
    for n in range(5):
        await opened.store.delete_memory_entry(NOTES, f"k{n}")
    assert await found(opened.store, NOTES, "rare1", 10) == []
