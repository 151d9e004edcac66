"""The in-process full-text index of a Memory scope (``store/sql/fulltext_index.py``,
searched in ``store/sql/fulltext.py``) on SQLite and PostgreSQL: kept current through
writes, rewrites, deletes and prunes (brought up to date, not rebuilt), and through
changes by another store object or another process; filters; hostile entries and
queries; a scope too large to keep; searches at once of a scope not yet indexed; its
tokens against the words of a query. The oracle is the reference BM25 of
``test_store_memory_fulltext`` over the entries read with the database's own client.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import string
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from corral.core.memory import MAX_ENTRY_CHARS, MemoryEntry, MemoryPlace, query_terms
from corral.store import Store, open_store
from corral.store.sql import fulltext
from corral.store.sql.fulltext_index import DEAD, Postings, TextIndex, tokens
from test_store_memory_fulltext import (  # noqa: F401 - fixtures
    COMMON,
    MIDDLING,
    NOTES,
    QUERIES,
    RARE,
    Opened,
    agrees,
    opened_fixture,
    reference,
    text,
    write_corpus,
)

SRC = Path(__file__).resolve().parent.parent / "src"
KEY = ("default", "notes", "")


def kept(store: Store) -> fulltext.FulltextCaches:
    return store.memory_fulltext  # type: ignore[attr-defined,no-any-return]


async def found(
    store: Store, place: MemoryPlace, query: str, top_k: int, **filters: object
) -> list[tuple[str, float]]:
    hits = await store.search_memory(place, query, top_k=top_k, filters=filters or None)
    return [(hit.entry.key, hit.score) for hit in hits]


async def test_the_index_is_read_once_per_scope_and_searched_many_times(opened: Opened) -> None:
    rng = random.Random(18)
    await write_corpus(opened.store, rng, 600)
    await agrees(opened, QUERIES, (1, 5, 50))
    indexes = kept(opened.store).indexes
    assert indexes.loads == 2 and indexes.updates == 0  # one per scope, searched many times


async def test_writes_rewrites_deletes_and_prunes_update_the_index_and_keep_the_answer(
    opened: Opened,
) -> None:
    store = opened.store
    rng = random.Random(7)
    await write_corpus(store, rng, 400)
    await agrees(opened, QUERIES)
    indexes = kept(store).indexes
    loads = indexes.loads
    # a rewrite makes a rare word common; equal texts written again tie on a newer time
    await store.write_memories(
        [MemoryEntry("default", "notes", "", f"e{n:04d}", "rare11 " * 3) for n in range(20)]
    )
    await agrees(opened, ["rare11 mid2", "rare11", "the rare11"])
    await store.write_memories(
        [MemoryEntry("default", "notes", "", f"tie{n}", "rare7 the mid3") for n in range(0, 30, 4)]
    )
    await agrees(opened, ["rare7 the mid3", "mid3"], (3, 30))
    for n in range(0, 60, 3):
        assert await store.delete_memory_entry(NOTES, f"e{n:04d}")
    await agrees(opened, QUERIES)
    # a text that is not ASCII, then made ASCII again, and a new one
    await store.write_memory(MemoryEntry("default", "notes", "", "e0100", "rare7 Café the"))
    await store.write_memory(MemoryEntry("default", "notes", "", "új", "mid3 naïve rare7"))
    await agrees(opened, ["rare7 the mid3", "rare7", "café naïve mid3"], (2, 40))
    await store.write_memory(MemoryEntry("default", "notes", "", "új", "mid3 plain rare7"))
    await agrees(opened, ["rare7 the mid3", "rare7", "naïve"], (2, 40))
    assert indexes.loads == loads and indexes.updates == 5
    # a prune of a quarter of the scope: read whole again
    assert await store.prune_memory(NOTES, max_entries=300) > 0
    await agrees(opened, [*QUERIES, "rare11"])
    # retention written with an entry: the newest 50 stay
    entry = MemoryEntry("default", "notes", "", "last", "rare11 the")
    await store.write_memory(entry, max_entries=50)
    await agrees(opened, [*QUERIES, "rare11", "the"], (10, 60))


async def test_a_scope_changed_by_another_store_or_process_is_seen_by_the_next_search(
    opened: Opened,
) -> None:
    """Another store object and another process write, delete and prune: the next
    search brings the index up to date, and ranks as that other process does (the same
    doubles: scores are computed from the scope's integers alone)."""
    store, url = opened.store, opened.url
    rng = random.Random(11)
    await write_corpus(store, rng, 300)
    await agrees(opened, QUERIES)
    async with await open_store(url) as other:
        await other.write_memories(
            [MemoryEntry("default", "notes", "", f"x{n}", "rare200 " * (n + 1)) for n in range(5)]
        )
        assert await other.delete_memory_entry(NOTES, "e0001")
        await agrees(opened, ["rare200", "rare200 the", *QUERIES])
    queries = ["rare201", "rare200 rare201 mid1", *QUERIES]
    program = textwrap.dedent(
        f"""
        import asyncio, json
        from corral.core.memory import MemoryEntry, MemoryPlace
        from corral.store import open_store

        async def main():
            notes = MemoryPlace("default", "notes")
            async with await open_store({url!r}) as store:
                await store.write_memory(MemoryEntry("default", "notes", "", "p", "rare201 mid1"))
                await store.write_memory(MemoryEntry("default", "notes", "", "x0", "rare201"))
                await store.prune_memory(notes, max_entries=320)
                answers = []
                for query in {queries!r}:
                    hits = await store.search_memory(notes, query, top_k=20)
                    answers.append([[hit.entry.key, hit.score.hex()] for hit in hits])
                print(json.dumps(answers))

        asyncio.run(main())
        """
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    ran = subprocess.run(
        [sys.executable, "-c", program],
        check=True,
        env=env,
        timeout=120,
        capture_output=True,
        text=True,
    )
    theirs = __import__("json").loads(ran.stdout)
    for query, answer in zip(queries, theirs, strict=True):
        ours = await found(store, NOTES, query, 20)
        assert [[key, score.hex()] for key, score in ours] == answer, query
    await agrees(opened, queries)
    assert kept(store).indexes.loads == 2  # brought up to date, never read whole again


async def test_filters_keep_the_rankings_order_whether_many_or_few_entries_pass(
    opened: Opened, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = opened.store
    rng = random.Random(5)
    entries = [
        MemoryEntry(
            "default", "notes", "", f"e{n:04d}", text(rng), metadata={"odd": n % 2, "one": n == 77}
        )
        for n in range(600)
    ]
    await store.write_memories(entries)
    keys = {e.key: e.metadata for e in entries}
    for candidates in (1, 50, 100_000):  # few or all of the best checked first
        monkeypatch.setattr(fulltext, "FILTER_CANDIDATES", candidates)
        for query in ("the mid1", "rare5 of", "and"):
            for filters in ({"odd": 1}, {"one": True}, {"odd": 0, "one": False}):
                for top_k in (1, 10, 100):
                    everything = await reference(opened, NOTES, query, 1_000)
                    expected = [
                        hit
                        for hit in everything
                        if all(keys[hit[0]][k] == v for k, v in filters.items())
                    ][:top_k]
                    assert await found(store, NOTES, query, top_k, **filters) == expected


async def test_hostile_entries_and_queries_answer_as_the_reference(opened: Opened) -> None:
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
        "tokyo 東京 the 🙂 mid1",
        "Kelvin \u212a and the e\u0301 mid1",  # a Kelvin sign, a combining accent
        *distinct,  # 2,000 distinct words each
    ]
    await opened.store.write_memories(
        [MemoryEntry("default", "notes", "", f"h{n}", t) for n, t in enumerate(hostile)]
    )
    await write_corpus(opened.store, rng, 200)
    thousand = " ".join(rng.choice(COMMON + MIDDLING + RARE + ["absent"]) for _ in range(1_000))
    words = distinct[0].split()
    queries = [
        thousand,
        "a" * MAX_ENTRY_CHARS,
        "the mid1 mid2 rare3",
        " ".join(words[:30]),
        "kelvin k e é",
        "tokyo 東京",
    ]
    await agrees(opened, queries, (1, 10, 100))


async def test_a_scope_too_large_for_the_cache_is_indexed_per_search_and_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache budget too small for the scope: each search indexes it (one at a time)
    and answers the same; nothing is kept."""
    monkeypatch.setenv("CORRAL_MEMORY_VECTOR_CACHE_BYTES", "1000")
    url = f"sqlite:///{tmp_path / 'corral.db'}"
    async with await open_store(url) as store:
        opened = Opened(store, url, _sqlite_rows(tmp_path / "corral.db"))
        await write_corpus(store, random.Random(4), 200)
        await agrees(opened, QUERIES)
        assert kept(store).indexes.too_large.keys() == {KEY, ("default", "notes", "other")}
        assert kept(store).indexes.nbytes == 0
        queries = [QUERIES[n % len(QUERIES)] for n in range(8)]
        answers = await asyncio.gather(*(found(store, NOTES, query, 10) for query in queries))
        for query, answer in zip(queries, answers, strict=True):
            assert answer == await reference(opened, NOTES, query, 10)


def _sqlite_rows(path: Path) -> Any:
    import sqlite3

    async def rows(place: MemoryPlace) -> list[tuple[int, str, str, float]]:
        with sqlite3.connect(path) as db:
            return db.execute(
                "SELECT id, key, text, updated_at FROM memory_entries "
                "WHERE namespace = ? AND memory = ? AND scope_key = ?",
                (place.namespace, place.memory, place.scope_key),
            ).fetchall()

    return rows


def test_the_index_splits_every_text_into_the_words_a_query_is_made_of() -> None:
    """Random texts of every ASCII character, letters of several scripts, combining
    marks, underscores and NUL, split together into postings: each text's words and
    length are those of :func:`tokens`, which are the words :func:`query_terms` makes
    of the same text (before its cap on the number of words)."""
    rng = random.Random(1)
    alphabet = [chr(n) for n in range(0, 128)] + list("aZ9 _") * 20
    alphabet += list("ÄäßøΣςЖж東京🙂\u0301\u212aǅﬁİ") * 3
    texts = ["".join(rng.choices(alphabet, k=rng.randint(0, 200))) for _ in range(600)]
    texts += ["Ærø Straße naïve ΣΊΣΥΦΟΣ Москва “quoted” — x\u2019s \u2026", "東京 the", "e\u0301 a"]
    postings, lengths = Postings.of(texts, np.arange(len(texts), dtype=np.int64))
    held: dict[int, dict[str, int]] = {}
    for word, n in postings.words.items():
        start, end = int(postings.starts[n]), int(postings.starts[n + 1])
        for row, count in zip(postings.rows[start:end], postings.counts[start:end], strict=True):
            held.setdefault(int(row), {})[word] = int(count)
    for n, value in enumerate(texts):
        words = tokens(value)
        assert lengths[n] == len(words), repr(value)
        counted: dict[str, int] = {}
        for word in words:
            counted[word] = counted.get(word, 0) + 1
        assert held.get(n, {}) == counted, repr(value)
        if len(set(words)) < 16:
            assert query_terms(value) == list(dict.fromkeys(words))


def test_an_update_kills_changed_rows_appends_the_new_and_gives_up_past_a_quarter() -> None:
    index = TextIndex.of(1, [(n, f"w{n % 3} common", float(n)) for n in range(1, 201)])
    updated = index.updated_to(2, np.array([5, 6, 999], dtype=np.int64), [(5, "w9 x", 300.0)])
    assert updated is not None and updated.generation == 2
    assert updated.ids.tolist().count(DEAD) == 2 and updated.ids[-1] == 5
    assert updated.live == 199 and updated.tokens == 2 * 199
    [(rows, counts)] = updated.postings("w9")
    assert rows.tolist() == [200] and counts.tolist() == [1]
    assert len(index.ids) == 200 and DEAD not in index.ids  # the old index is untouched
    assert sum(len(rows) for rows, _ in updated.postings("common")) == 198  # live rows only
    many = [(n, "again", 400.0) for n in range(1, 80)]
    assert updated.updated_to(3, np.arange(1, 80, dtype=np.int64), many) is None


def test_an_updated_index_scores_as_one_built_whole() -> None:
    rng = random.Random(2)
    entries = [(n, text(rng), float(n % 7)) for n in range(1, 301)]
    index = TextIndex.of(1, entries)
    changed = [3, 50, 51, 299]
    fresh = [(n, text(rng), 10.0) for n in changed[:-1]]
    updated = index.updated_to(2, np.asarray(changed, dtype=np.int64), fresh)
    assert updated is not None
    kept_entries = [e for e in entries if e[0] not in changed] + fresh
    whole = TextIndex.of(2, kept_entries)
    for query in QUERIES:
        words = query_terms(query)
        ours, theirs = updated.scores(words), whole.scores(words)
        by_id_ours = {int(updated.ids[r]): float(ours[0][r]) for r in ours[1]}
        by_id_theirs = {int(whole.ids[r]): float(theirs[0][r]) for r in theirs[1]}
        assert by_id_ours == by_id_theirs, query


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
    opened: Opened,
) -> None:
    """Eight searches at once of a scope no search has indexed yet (after a restart, say):
    one reads and tokenizes the scope, the others wait for its index rather than each
    holding the scope's texts and a build of their own (eight times the memory and the
    CPU), and all answer as the reference; a write meanwhile is an update."""
    store = opened.store
    await write_corpus(store, random.Random(21), 600)
    queries = [QUERIES[n % len(QUERIES)] for n in range(8)]
    answers = await asyncio.gather(*(found(store, NOTES, query, 10) for query in queries))
    for query, answer in zip(queries, answers, strict=True):
        assert answer == await reference(opened, NOTES, query, 10)
    indexes = kept(store).indexes
    assert indexes.loads == 1 and indexes.updates == 0
    await store.write_memory(MemoryEntry("default", "notes", "", "new", "rare7 the mid3"))
    answers = await asyncio.gather(*(found(store, NOTES, query, 10) for query in queries))
    for query, answer in zip(queries, answers, strict=True):
        assert answer == await reference(opened, NOTES, query, 10)
    assert indexes.loads == 1 and indexes.updates == 1
    assert indexes.keys() == [KEY]  # the other scope is never read by these searches
