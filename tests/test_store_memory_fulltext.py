"""Full-text search on SQLite (``store/sql/fulltext_sqlite.py``): its answer, over the
scope's index or by MaxScore, is the full ranking's - every match ranked by FTS5's own ``bm25()``, then the entry written
last, then id - hit for hit and score for score, on corpora of common words, ties and
several scopes; and it stays so for hostile queries.

The oracle is one SQL statement read straight from the database file with ``sqlite3``:
what the store answered before MaxScore and the scope indexes.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.core.memory import MAX_QUERY_TERMS, MemoryEntry, MemoryPlace, query_terms
from corral.store import Store, open_store
from corral.store.sql.fulltext_sqlite import varints

NOTES = MemoryPlace("default", "notes")
OTHER = MemoryPlace("default", "notes", "other")
# a few very common words (in more than half the entries: FTS5 clamps their idf), some
# middling, many rare: as in text
COMMON = ["the", "and", "of"]
MIDDLING = [f"mid{n}" for n in range(12)]
RARE = [f"rare{n}" for n in range(300)]


@pytest.fixture(name="db_path")
def db_path_fixture(tmp_path: Path) -> Path:
    return tmp_path / "corral.db"


@pytest.fixture(name="store", params=["index", "maxscore"])
async def store_fixture(
    db_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Store]:
    """A store searching over its scope indexes, or (a cache budget of 0: none kept) by
    MaxScore and FTS5's ranking."""
    if request.param == "maxscore":
        monkeypatch.setenv("CORRAL_MEMORY_VECTOR_CACHE_BYTES", "0")
    async with await open_store(f"sqlite:///{db_path}") as opened:
        yield opened


def full_ranking(
    db_path: Path, place: MemoryPlace, query: str, top_k: int
) -> list[tuple[str, float]]:
    """Every match of the scope ranked by FTS5's bm25() (the store's answer before)."""
    terms = query_terms(query)
    if not terms:
        return []
    match = " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)
    with sqlite3.connect(db_path) as db:
        rows = db.execute(
            "SELECT e.key, bm25(memory_fts) FROM memory_fts JOIN memory_entries e "
            "ON e.id = memory_fts.rowid WHERE memory_fts MATCH ? AND e.namespace = ? "
            "AND e.memory = ? AND e.scope_key = ? "
            "ORDER BY bm25(memory_fts), e.updated_at DESC, e.id LIMIT ?",
            (match, place.namespace, place.memory, place.scope_key, top_k),
        ).fetchall()
    return [(key, -score) for key, score in rows]


async def found(
    store: Store, place: MemoryPlace, query: str, top_k: int
) -> list[tuple[str, float]]:
    hits = await store.search_memory(place, query, top_k=top_k)
    return [(hit.entry.key, hit.score) for hit in hits]


def text(rng: random.Random) -> str:
    """Entries of 3 to 30 words: common words most, then middling, then rare; some
    capitalised or punctuated (the tokenizer folds and splits them as FTS5 does)."""
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


async def test_the_search_gives_the_full_rankings_hits_and_scores(
    store: Store, db_path: Path
) -> None:
    rng = random.Random(18)
    await write_corpus(store, rng, 1_500)
    queries = ["rare7 the mid3", "the and of", "mid1 mid2", "RARE5, rare6; the?", "rare299 of"]
    queries += [
        " ".join(rng.choice(COMMON + MIDDLING + RARE) for _ in range(rng.randint(1, 5)))
        for _ in range(40)
    ]
    for query in queries:
        for place in (NOTES, OTHER):
            for top_k in (1, 5, 50):
                expected = full_ranking(db_path, place, query, top_k)
                assert await found(store, place, query, top_k) == expected, (query, place, top_k)


async def test_after_rewrites_and_deletes_the_answer_is_still_the_full_rankings(
    store: Store, db_path: Path
) -> None:
    """The cached word counts follow the index: a rewrite makes a rare word common."""
    rng = random.Random(7)
    await write_corpus(store, rng, 400)
    assert await found(store, NOTES, "rare11 mid2", 10) == full_ranking(
        db_path, NOTES, "rare11 mid2", 10
    )
    await store.write_memories(
        [MemoryEntry("default", "notes", "", f"e{n:04d}", "rare11 " * 3) for n in range(250)]
    )
    for n in range(0, 400, 3):
        await store.delete_memory_entry(NOTES, f"e{n:04d}")
    for query in ("rare11 mid2", "rare11", "the rare11"):
        assert await found(store, NOTES, query, 10) == full_ranking(db_path, NOTES, query, 10)


async def test_non_ascii_words_and_texts_are_ranked_as_fts5_ranks_them(
    store: Store, db_path: Path
) -> None:
    texts = [
        "Überraschung im Café am Fluss",
        "café crème and the rare1",
        "the rare1 naïve façade",
        "rare1 rare1 ÜBERRASCHUNG",
        "東京 の the 東京",
        "plain rare1 words the",
    ]
    await store.write_memories(
        [MemoryEntry("default", "notes", "", f"k{n}", t) for n, t in enumerate(texts)]
    )
    for query in ("überraschung", "café rare1", "rare1 the", "東京", "naïve rare1"):
        for top_k in (1, 3, 10):
            assert await found(store, NOTES, query, top_k) == full_ranking(
                db_path, NOTES, query, top_k
            ), query


async def test_hostile_queries_answer_as_the_full_ranking(store: Store, db_path: Path) -> None:
    # an empty scope first: nothing indexed at all
    assert await found(store, NOTES, "anything at all", 5) == []
    rng = random.Random(3)
    await write_corpus(store, rng, 300)
    thousand = " ".join(rng.choice(COMMON + MIDDLING + RARE + ["absent"]) for _ in range(1_000))
    assert len(query_terms(thousand)) == MAX_QUERY_TERMS
    only_common = "THE and, of the AND"
    for query in (thousand, only_common, 'rare3" OR "x', "mid1 NEAR(x) *", "absent missing"):
        assert await found(store, NOTES, query, 20) == full_ranking(db_path, NOTES, query, 20)
    assert await found(store, NOTES, "?!, ... --", 5) == []
    empty = MemoryPlace("default", "notes", "nobody")
    assert await found(store, empty, "the rare7", 5) == []


def test_varints_read_sqlites_encoding_and_stop_at_a_cut() -> None:
    # 1 byte (< 128), 2 bytes (300 = 0b10_0101100), and the 9-byte form of 2**64 - 1
    assert varints(bytes([5])) == [5]
    assert varints(bytes([0x82, 0x2C, 0x7F])) == [300, 127]
    assert varints(bytes([0xFF] * 9)) == [2**64 - 1]
    assert varints(bytes([0x82])) == []  # a varint cut short is not read
