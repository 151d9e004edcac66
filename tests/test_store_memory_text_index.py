"""The in-process full-text index of a Memory scope on SQLite (``store/sql/fulltext_index.py``,
scored in ``store/sql/fulltext_sqlite.py``): its answer is FTS5's full ranking - every
match ranked by ``bm25()``, then the entry written last, then id - hit for hit and score
for score, on corpora of common words and ties, after writes, rewrites, deletes and
prunes (the index brought up to date, not rebuilt), with entries that are not ASCII,
with filters, when another store object or another process changed the scope, and for
hostile entries and queries. The oracle is one SQL statement read with ``sqlite3``.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import random
import sqlite3
import string
import subprocess
import sys
import textwrap
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from corral.core.memory import MAX_ENTRY_CHARS, MemoryEntry, MemoryPlace, query_terms
from corral.store import Store, open_store
from corral.store.sql import fulltext_sqlite
from corral.store.sql.fulltext_index import (
    DEAD,
    LEARNED,
    TOKENIZER,
    TextIndex,
    ascii_form,
    index_tokens,
    learned,
)
from test_store_memory_fulltext import (
    COMMON,
    MIDDLING,
    NOTES,
    OTHER,
    RARE,
    text,
    write_corpus,
)

SRC = Path(__file__).resolve().parent.parent / "src"
KEY = ("default", "notes", "")


@pytest.fixture(name="db_path")
def db_path_fixture(tmp_path: Path) -> Path:
    return tmp_path / "corral.db"


@pytest.fixture(name="store")
async def store_fixture(db_path: Path) -> AsyncIterator[Store]:
    async with await open_store(f"sqlite:///{db_path}") as opened:
        yield opened


def full_ranking(
    db_path: Path, place: MemoryPlace, query: str, top_k: int, **filters: object
) -> list[tuple[str, float]]:
    """Every match of the scope (and filters) ranked by FTS5's bm25()."""
    terms = query_terms(query)
    if not terms:
        return []
    match = " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)
    where = "".join(f" AND json_extract(e.metadata, '$.{key}') = ?" for key in filters)
    with sqlite3.connect(db_path) as db:
        rows = db.execute(
            "SELECT e.key, bm25(memory_fts) FROM memory_fts JOIN memory_entries e "
            "ON e.id = memory_fts.rowid WHERE memory_fts MATCH ? AND e.namespace = ? "
            f"AND e.memory = ? AND e.scope_key = ?{where} "
            "ORDER BY bm25(memory_fts), e.updated_at DESC, e.id LIMIT ?",
            (match, place.namespace, place.memory, place.scope_key, *filters.values(), top_k),
        ).fetchall()
    return [(key, -score) for key, score in rows]


async def found(
    store: Store, place: MemoryPlace, query: str, top_k: int, **filters: object
) -> list[tuple[str, float]]:
    hits = await store.search_memory(place, query, top_k=top_k, filters=filters or None)
    return [(hit.entry.key, hit.score) for hit in hits]


async def agrees(store: Store, db_path: Path, queries: list[str], *tops: int) -> None:
    for query in queries:
        for place in (NOTES, OTHER):
            for top_k in tops or (1, 10):
                expected = full_ranking(db_path, place, query, top_k)
                assert await found(store, place, query, top_k) == expected, (query, top_k)


def kept(store: Store) -> fulltext_sqlite.FulltextCaches:
    return store.memory_fulltext  # type: ignore[attr-defined,no-any-return]


QUERIES = ["rare7 the mid3", "the and of", "mid1 mid2", "RARE5, rare6; the?", "rare299 of"]


async def test_the_index_gives_the_full_rankings_hits_and_scores_and_is_read_once(
    store: Store, db_path: Path
) -> None:
    rng = random.Random(18)
    await write_corpus(store, rng, 1_500)
    queries = QUERIES + [
        " ".join(rng.choice(COMMON + MIDDLING + RARE) for _ in range(rng.randint(1, 6)))
        for _ in range(40)
    ]
    await agrees(store, db_path, queries, 1, 5, 50)
    indexes = kept(store).indexes
    assert indexes.loads == 2 and indexes.updates == 0  # one per scope, searched many times


async def test_writes_rewrites_deletes_and_prunes_update_the_index_and_keep_the_answer(
    store: Store, db_path: Path
) -> None:
    rng = random.Random(7)
    await write_corpus(store, rng, 400)
    await agrees(store, db_path, QUERIES)
    indexes = kept(store).indexes
    loads = indexes.loads
    # a rewrite makes a rare word common; equal texts written again tie on a newer time
    await store.write_memories(
        [MemoryEntry("default", "notes", "", f"e{n:04d}", "rare11 " * 3) for n in range(20)]
    )
    await agrees(store, db_path, ["rare11 mid2", "rare11", "the rare11"])
    await store.write_memories(
        [MemoryEntry("default", "notes", "", f"tie{n}", "rare7 the mid3") for n in range(0, 30, 4)]
    )
    await agrees(store, db_path, ["rare7 the mid3", "mid3"], 3, 30)
    for n in range(0, 60, 3):
        assert await store.delete_memory_entry(NOTES, f"e{n:04d}")
    await agrees(store, db_path, QUERIES)
    # a text that is not ASCII (tokenized by FTS5), then made ASCII again, and a new one
    await store.write_memory(MemoryEntry("default", "notes", "", "e0100", "rare7 Café the"))
    await store.write_memory(MemoryEntry("default", "notes", "", "új", "mid3 naïve rare7"))
    await agrees(store, db_path, ["rare7 the mid3", "rare7", "caf mid3"], 2, 40)
    await store.write_memory(MemoryEntry("default", "notes", "", "új", "mid3 plain rare7"))
    await agrees(store, db_path, ["rare7 the mid3", "rare7"], 2, 40)
    assert indexes.loads == loads and indexes.updates == 5
    # a prune of a quarter of the scope: read whole again
    assert await store.prune_memory(NOTES, max_entries=300) > 0
    await agrees(store, db_path, [*QUERIES, "rare11"])
    # retention written with an entry: the newest 50 stay
    entry = MemoryEntry("default", "notes", "", "last", "rare11 the")
    await store.write_memory(entry, max_entries=50)
    await agrees(store, db_path, [*QUERIES, "rare11", "the"], 10, 60)


async def test_a_scope_changed_by_another_store_or_process_is_seen_by_the_next_search(
    store: Store, db_path: Path
) -> None:
    rng = random.Random(11)
    await write_corpus(store, rng, 300)
    await agrees(store, db_path, QUERIES)
    url = f"sqlite:///{db_path}"
    async with await open_store(url) as other:
        await other.write_memories(
            [MemoryEntry("default", "notes", "", f"x{n}", "rare200 " * (n + 1)) for n in range(5)]
        )
        assert await other.delete_memory_entry(NOTES, "e0001")
        await agrees(store, db_path, ["rare200", "rare200 the", *QUERIES])
    program = textwrap.dedent(
        f"""
        import asyncio
        from corral.core.memory import MemoryEntry, MemoryPlace
        from corral.store import open_store

        async def main():
            async with await open_store({url!r}) as store:
                await store.write_memory(MemoryEntry("default", "notes", "", "p", "rare201 mid1"))
                await store.write_memory(MemoryEntry("default", "notes", "", "x0", "rare201"))
                await store.prune_memory(MemoryPlace("default", "notes"), max_entries=320)

        asyncio.run(main())
        """
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    subprocess.run([sys.executable, "-c", program], check=True, env=env, timeout=120)
    await agrees(store, db_path, ["rare201", "rare200 rare201 mid1", *QUERIES])
    assert kept(store).indexes.loads == 2  # brought up to date, never read whole again


async def test_filters_keep_the_full_rankings_order_whether_many_or_few_entries_pass(
    store: Store, db_path: Path
) -> None:
    rng = random.Random(5)
    entries = [
        MemoryEntry(
            "default", "notes", "", f"e{n:04d}", text(rng), metadata={"odd": n % 2, "one": n == 77}
        )
        for n in range(1_200)
    ]
    await store.write_memories(entries)
    for query in ("the mid1", "rare5 of", "and"):
        for filters in ({"odd": 1}, {"one": True}, {"odd": 0, "one": False}):
            for top_k in (1, 10, 100):
                expected = full_ranking(db_path, NOTES, query, top_k, **filters)
                assert await found(store, NOTES, query, top_k, **filters) == expected


async def test_hostile_entries_and_queries_answer_as_the_full_ranking(
    store: Store, db_path: Path
) -> None:
    rng = random.Random(9)
    distinct = [
        " ".join("".join(rng.choices(string.ascii_lowercase, k=6)) for _ in range(2_000))
        for _ in range(5)
    ]
    hostile = [
        ("a" * MAX_ENTRY_CHARS),  # one token of 16,000 letters
        ("the " * (MAX_ENTRY_CHARS // 4)).strip(),  # one word 4,000 times
        ("mid1," * (MAX_ENTRY_CHARS // 5)),  # the same, with punctuation for spaces
        "\x02the\x01mid2\x7f_rare3_ \t\n rare3-mid2",  # control characters, underscores
        "tokyo 東京 the 🙂 mid1",  # not ASCII: tokenized by FTS5 for the index
        "Kelvin \u212a and the e\u0301 mid1",  # a Kelvin sign, a combining accent
        *distinct,  # 2,000 distinct words each
    ]
    await store.write_memories(
        [MemoryEntry("default", "notes", "", f"h{n}", t) for n, t in enumerate(hostile)]
    )
    await write_corpus(store, rng, 200)
    thousand = " ".join(rng.choice(COMMON + MIDDLING + RARE + ["absent"]) for _ in range(1_000))
    words = distinct[0].split()
    queries = [
        thousand,
        "a" * MAX_ENTRY_CHARS,
        "the mid1 mid2 rare3",
        " ".join(words[:30]),
        "kelvin k e",
        "tokyo 東京",  # a word that is not ASCII: FTS5 ranks the query
    ]
    await agrees(store, db_path, queries, 1, 10, 100)


async def test_a_scope_too_large_for_the_cache_is_searched_without_an_index_still_exactly(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_MEMORY_VECTOR_CACHE_BYTES", "1000")
    async with await open_store(f"sqlite:///{db_path}") as store:
        await write_corpus(store, random.Random(4), 200)
        await agrees(store, db_path, QUERIES)
        assert kept(store).indexes.too_large.keys() == {KEY, ("default", "notes", "other")}
        assert kept(store).indexes.nbytes == 0


async def test_a_scope_mostly_not_ascii_is_indexed_as_fts5_tokenizes_it(
    store: Store, db_path: Path
) -> None:
    """German, French, Japanese and emoji texts with ASCII words among them: the index
    holds their ASCII words as FTS5 counts them, and their lengths in FTS5's tokens."""
    rng = random.Random(12)
    extra = ["Über", "straße", "Ørsted", "東京", "naïve", "🙂", "e\u0301", "\u212a", "ǅ", "ﬁ"]
    texts = [
        " ".join(
            rng.choice(COMMON + MIDDLING + RARE[:20] + extra) for _ in range(rng.randint(2, 25))
        )
        for _ in range(600)
    ]
    await store.write_memories(
        [MemoryEntry("default", "notes", "", f"u{n}", t) for n, t in enumerate(texts)]
    )
    await agrees(store, db_path, [*QUERIES, "k e", "the mid1 rare3", "fi ss"], 1, 10, 100)
    await store.write_memory(MemoryEntry("default", "notes", "", "u1", "Ærø rare3 the ﬁ"))
    await agrees(store, db_path, ["rare3 the", "fi"], 1, 10, 100)
    assert kept(store).indexes.loads == 2 and kept(store).indexes.updates == 1


def test_the_index_tokens_are_fts5s_tokens_at_the_same_places() -> None:
    """Random texts of every ASCII character but NUL (which no stored text holds:
    check_text) and the learned code points (Latin, Greek, Cyrillic, punctuation), and a
    few texts with others, against FTS5's own tokens: the same ASCII tokens in the same
    places, and a token that is not ASCII wherever FTS5 has one."""
    rng = random.Random(1)
    known = [chr(p) for p in learned() if p > 127]
    assert len(known) > 0.9 * sum(len(part) for part in LEARNED)  # a few marks are not
    alphabet = [chr(n) for n in range(1, 128)] + list("aZ9 ") * 20 + known
    texts = ["".join(rng.choices(alphabet, k=rng.randint(1, 200))) for _ in range(600)]
    texts += ["Ærø Straße naïve ΣΊΣΥΦΟΣ Москва “quoted” — x\u2019s \u2026", "東京 the", "e\u0301 a"]
    with sqlite3.connect(":memory:") as db:
        db.execute(f"CREATE VIRTUAL TABLE t USING fts5(x, tokenize='{TOKENIZER}')")
        db.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
        for n, value in enumerate(texts, start=1):
            db.execute("INSERT INTO t(rowid, x) VALUES (?, ?)", (n, value))
        instances = db.execute("SELECT doc, offset, term FROM v ORDER BY doc, offset").fetchall()
    by_text: dict[int, list[str | None]] = {}
    for doc, _, term in instances:
        by_text.setdefault(doc, []).append(term if term.isascii() else None)
    tokenized = 0
    for n, value in enumerate(texts, start=1):
        tokens = index_tokens(value)
        if tokens is None:  # FTS5 tokenizes it for the index: checked through the store
            assert not ascii_form(value)
            continue
        tokenized += 1
        mine = [token if "\x01" not in token else None for token in tokens]
        assert mine == by_text.get(n, []), json.dumps(value)
    assert tokenized == len(texts) - 2  # all but the Japanese and the combining accent
    assert index_tokens("a\x00b") is None


def test_an_update_kills_changed_rows_appends_the_new_and_gives_up_past_a_quarter() -> None:
    index = TextIndex.of(1, [(n, f"w{n % 3} common", float(n)) for n in range(1, 201)])
    updated = index.updated_to(2, np.array([5, 6, 999], dtype=np.int64), [(5, "w9 x", 300.0)])
    assert updated is not None and updated.generation == 2
    assert updated.ids.tolist().count(DEAD) == 2 and updated.ids[-1] == 5
    [(rows, counts)] = updated.postings("w9")
    assert rows.tolist() == [200] and counts.tolist() == [1]
    assert len(index.ids) == 200 and DEAD not in index.ids  # the old index is untouched
    assert sum(len(rows) for rows, _ in updated.postings("common")) == 200
    many = [(n, "again", 400.0) for n in range(1, 80)]
    assert updated.updated_to(3, np.arange(1, 80, dtype=np.int64), many) is None


def test_an_index_counts_the_bytes_its_updates_hold() -> None:
    """Entries of thousands of distinct words each, written after the index was read:
    their words' postings (a pair of arrays per word) are counted as they are held, so
    the cache's budget bounds them (not a third of what they take)."""
    rng = random.Random(3)

    def distinct(count: int) -> str:
        return " ".join("".join(rng.choices(string.ascii_lowercase, k=7)) for _ in range(count))

    index = TextIndex.of(1, [(n, distinct(50), float(n)) for n in range(1, 401)])
    fresh = [(n, distinct(2_000), 500.0 + n) for n in range(1, 41)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        updated = index.updated_to(2, np.arange(1, 41, dtype=np.int64), fresh)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert updated is not None and len(updated.delta) > 70_000
    assert 0.9 * held <= updated.nbytes - index.nbytes <= 1.5 * held


async def test_searches_of_a_scope_not_yet_indexed_at_once_build_its_index_once(
    store: Store, db_path: Path
) -> None:
    """Eight searches at once of a scope no search has indexed yet (after a restart, say):
    one reads and tokenizes the scope, the others wait for its index rather than each
    holding the scope's texts and a build of their own (eight times the memory and the
    CPU), and all answer as the full ranking; a write meanwhile is an update."""
    await write_corpus(store, random.Random(21), 1_000)
    queries = [QUERIES[n % len(QUERIES)] for n in range(8)]
    answers = await asyncio.gather(*(found(store, NOTES, query, 10) for query in queries))
    for query, answer in zip(queries, answers, strict=True):
        assert answer == full_ranking(db_path, NOTES, query, 10)
    indexes = kept(store).indexes
    assert indexes.loads == 1 and indexes.updates == 0
    await store.write_memory(MemoryEntry("default", "notes", "", "new", "rare7 the mid3"))
    answers = await asyncio.gather(*(found(store, NOTES, query, 10) for query in queries))
    for query, answer in zip(queries, answers, strict=True):
        assert answer == full_ranking(db_path, NOTES, query, 10)
    assert indexes.loads == 1 and indexes.updates == 1


async def test_searches_at_once_of_a_scope_too_large_to_keep_read_it_once(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_MEMORY_VECTOR_CACHE_BYTES", "1000")
    async with await open_store(f"sqlite:///{db_path}") as store:
        await write_corpus(store, random.Random(22), 300)
        queries = [QUERIES[n % len(QUERIES)] for n in range(8)]
        answers = await asyncio.gather(*(found(store, NOTES, query, 10) for query in queries))
        for query, answer in zip(queries, answers, strict=True):
            assert answer == full_ranking(db_path, NOTES, query, 10)
        assert kept(store).indexes.loads == 1 and KEY in kept(store).indexes.too_large
