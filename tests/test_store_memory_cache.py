"""The in-process cache of Memory vectors (``store/sql/vector_cache.py``): a change made
through another store object or another process is seen by the next search, deletes and
retention are reflected, a tiny byte budget evicts and still answers, and a filtered
search is the exact top-k among the entries the filters keep.

Run against every store URL of ``test_store_memory_vectors`` (SQLite on both paths,
the shared PostgreSQL without pgvector, pgvector on a private cluster - where search is
``<=>`` in SQL and the cache is not used, so the same answers must come out).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from corral.core.memory import MemoryInputError, MemoryPlace, MemoryVector
from corral.resources.secrets import SecretCipher
from corral.store import Store, open_store
from corral.store.sql import memory
from corral.store.sql.vector_cache import DEAD, Matrix, VectorCache, decode_arrays, decode_blobs
from corral.store.sql.vector_scan import FIRST_PASS, FIRST_PASS_MIN_ROWS
from test_store_memory_vectors import (  # noqa: F401 - fixtures
    EMBEDDER,
    NOTES,
    cipher_fixture,
    entry,
    keys,
    pgvector_cluster_fixture,
    store_fixture,
    store_url_fixture,
    vec,
)

SRC = Path(__file__).resolve().parent.parent / "src"


async def nearest(store: Store, *values: float, top_k: int = 3, **filters: object) -> list[str]:
    hits = await store.search_memory(
        NOTES, "", top_k=top_k, vector=vec(*values), filters=filters or None
    )
    return keys(hits)


async def test_a_write_through_another_store_object_is_seen_by_the_next_search(
    store: Store, store_url: str, cipher: SecretCipher
) -> None:
    await store.write_memory(entry("east", "east"), vector=vec(1, 0, 0, 0))
    await store.write_memory(entry("north", "north"), vector=vec(0, 1, 0, 0))
    assert await nearest(store, 0, 0, 1, 0, top_k=1) in (["east"], ["north"])
    async with await open_store(store_url, cipher=cipher) as other:
        await other.write_memory(entry("up", "up"), vector=vec(0, 0, 1, 0))
        assert await nearest(store, 0, 0, 1, 0, top_k=1) == ["up"]
        # a rewrite without a vector takes the old vector away
        await other.write_memory(entry("up", "up, no vector now"))
        assert "up" not in await nearest(store, 0, 0, 1, 0)
        await other.write_memory(entry("up", "up"), vector=vec(0, 0, 1, 0))
        assert await nearest(store, 0, 0, 1, 0, top_k=1) == ["up"]
        assert await other.delete_memory_entry(NOTES, "up")
        assert await nearest(store, 0, 0, 1, 0) == ["east", "north"]  # a tie: by id
        # retention: only the newest entry stays
        await other.write_memory(entry("west", "west"), vector=vec(-1, 0, 0, 0), max_entries=1)
        assert await nearest(store, 1, 0, 0, 0) == ["west"]
        await other.write_memory(entry("south", "south"), vector=vec(0, -1, 0, 0))
        assert await other.prune_memory(NOTES, max_entries=1) == 1
        assert await nearest(store, 0, 1, 0, 0) == ["south"]


async def test_a_write_by_another_process_is_seen_by_the_next_search(
    store: Store, store_url: str
) -> None:
    await store.write_memory(entry("east", "east"), vector=vec(1, 0, 0, 0))
    assert await nearest(store, 0, 0, 1, 0) == ["east"]
    program = textwrap.dedent(
        f"""
        import asyncio
        from corral.core.memory import MemoryEntry, MemoryVector
        from corral.store import open_store

        async def main():
            async with await open_store({store_url!r}) as store:
                await store.write_memory(
                    MemoryEntry("default", "notes", "", "up", "up"),
                    vector=MemoryVector({EMBEDDER!r}, [0.0, 0.0, 1.0, 0.0]),
                )

        asyncio.run(main())
        """
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    subprocess.run([sys.executable, "-c", program], check=True, env=env, timeout=120)
    assert await nearest(store, 0, 0, 1, 0, top_k=1) == ["up"]


async def test_a_tiny_byte_budget_evicts_and_every_search_still_answers(
    store: Store, store_url: str, cipher: SecretCipher, monkeypatch: pytest.MonkeyPatch
) -> None:
    places = [MemoryPlace("default", "notes", f"s{n}") for n in range(3)]
    for n, place in enumerate(places):
        await store.write_memory(
            entry("k", f"scope {n}", place), vector=vec(1, n, 0, 0, embedder=EMBEDDER)
        )
    # one scope's matrix (one id, 4 floats, and their int8 codes with scale and residual
    # where simsimd is) is 24 or 44 bytes: two fit, not three
    one = Matrix.of(1, [1], np.ones((1, 4), dtype=np.float32)).nbytes
    assert one == (44 if FIRST_PASS else 24)
    budget = 2 * one + one // 2
    monkeypatch.setenv("CORRAL_MEMORY_VECTOR_CACHE_BYTES", str(budget))
    async with await open_store(store_url, cipher=cipher) as small:
        cache = small.memory_vector_cache  # type: ignore[attr-defined]
        assert cache.max_bytes == budget
        for _ in range(2):
            for place in places:
                hits = await small.search_memory(place, "", vector=vec(1, 0, 0, 0))
                assert keys(hits) == ["k"]
                assert cache.nbytes <= budget
        if "pgvector" not in await small.memory_vector_index():
            assert len(cache.keys()) == 2  # the least recently used scope went
            assert cache.keys()[-1][2] == "s2"
            assert cache.loads == 6  # round robin over three with room for two: all miss
    monkeypatch.setenv("CORRAL_MEMORY_VECTOR_CACHE_BYTES", "0")
    async with await open_store(store_url, cipher=cipher) as none:
        hits = await none.search_memory(places[1], "", vector=vec(1, 1, 0, 0))
        assert keys(hits) == ["k"] and hits[0].signals == ("vector",)
        assert none.memory_vector_cache.keys() == []  # type: ignore[attr-defined]


async def test_a_filtered_search_is_the_exact_top_k_of_the_matching_entries(
    store: Store,
) -> None:
    """The filter keeps entries far from the query: they must still come back, best
    first, not be crowded out by the closer entries the filter drops."""
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((200, 4))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    query = np.array([1.0, 0.0, 0.0, 0.0])
    score = vectors @ query
    # the 20 entries farthest from the query are "kept"; the rest are "other"
    kept = set(np.argsort(score)[:20].tolist())
    await store.write_memories(
        [
            entry(f"e{n:03d}", f"entry {n}", metadata={"group": "kept" if n in kept else "other"})
            for n in range(200)
        ],
        [MemoryVector(EMBEDDER, vectors[n].tolist()) for n in range(200)],
    )
    want = sorted(kept, key=lambda n: -score[n])[:5]
    hits = await store.search_memory(
        NOTES, "", top_k=5, vector=vec(*query), filters={"group": "kept"}
    )
    assert keys(hits) == [f"e{n:03d}" for n in want]
    unfiltered = await store.search_memory(NOTES, "", top_k=5, vector=vec(*query))
    best = np.argsort(-score)[:5].tolist()
    assert keys(unfiltered) == [f"e{n:03d}" for n in best]
    nothing = await store.search_memory(
        NOTES, "", top_k=5, vector=vec(*query), filters={"group": "none"}
    )
    assert nothing == []


def test_the_matrix_ranks_exactly_with_ties_by_id_and_refuses_other_dimensions() -> None:
    rows = np.array([[1, 0], [0, 1], [1, 0], [1, 1]], dtype=np.float32)
    matrix = Matrix.of(3, [9, 4, 2, 7], rows)
    assert [i for i, _ in matrix.nearest([1.0, 0.0], 3)] == [2, 9, 7]
    assert [i for i, _ in matrix.nearest([1.0, 0.0], 10)] == [2, 9, 7, 4]
    assert matrix.nearest([1.0, 0.0], 2, np.array([4, 7], dtype=np.int64))[0][0] == 7
    assert matrix.nearest([1.0, 0.0], 2, np.array([], dtype=np.int64)) == []
    with pytest.raises(ValueError, match="dimensions"):
        matrix.nearest([1.0, 0.0, 0.0], 1)


def test_the_cache_drops_a_matrix_of_another_generation_and_one_over_budget() -> None:
    cache = VectorCache(max_bytes=1_000)
    small = Matrix.of(1, [1], np.ones((1, 4), dtype=np.float32))
    cache.put(("ns", "m", "", "e"), small)
    assert cache.get(("ns", "m", "", "e"), 1) is small
    assert cache.get(("ns", "m", "", "e"), 2) is None  # moved on: dropped
    assert cache.nbytes == 0
    big = Matrix.of(1, list(range(100)), np.ones((100, 4), dtype=np.float32))
    cache.put(("ns", "m", "", "e"), big)
    assert cache.keys() == [] and cache.nbytes == 0


async def test_full_text_is_the_same_whether_few_or_all_matches_are_checked_first(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filtered full-text search checks the filters on the best few matches first: the
    answer must be the scope's true top k whether few or all of them pass, with or
    without the scope's index kept, and another scope's better entries never count."""
    from corral.store.sql import fulltext

    crowd = MemoryPlace("default", "notes", "crowd")
    await store.write_memories(
        [entry(f"c{n:03d}", "apple apple apple", crowd) for n in range(40)]
        + [
            entry(f"n{n:03d}", "apple pear " + "filler " * (n % 7), metadata={"odd": n % 2 == 1})
            for n in range(30)
        ]
    )

    async def search(**filters: object) -> list[tuple[str, float]]:
        hits = await store.search_memory(NOTES, "apple pear", top_k=7, filters=filters or None)
        return [(hit.entry.key, hit.score) for hit in hits]

    answers = []
    for budget in (store.memory_fulltext.indexes.max_bytes, 0):  # type: ignore[attr-defined]
        store.memory_fulltext.indexes.max_bytes = budget  # type: ignore[attr-defined]
        for candidates in (1, 5, 45, 100_000):
            monkeypatch.setattr(fulltext, "FILTER_CANDIDATES", candidates)
            answers.append((await search(), await search(odd=True)))
    assert all(answer == answers[-1] for answer in answers)
    everything, odd = answers[-1]
    assert len(everything) == 7 and all(key.startswith("n") for key, _ in everything)
    assert len(odd) == 7 and all(int(key[1:]) % 2 == 1 for key, _ in odd)


async def test_a_few_changes_by_another_store_update_the_cached_vectors_without_a_reload(
    store: Store, store_url: str, cipher: SecretCipher
) -> None:
    """Writes, rewrites, deletes and retention through another store object reach this
    one's cached matrix as updates of the entries they changed: same answers as a fresh
    store, and no reload of the scope."""
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((120, 4))
    await store.write_memories(
        [entry(f"e{n:03d}", f"entry {n}") for n in range(120)],
        [MemoryVector(EMBEDDER, vectors[n].tolist()) for n in range(120)],
    )
    probes = [vectors[n] for n in (0, 7, 42)] + [np.array([0.0, 0.0, 1.0, 0.0])]
    cache = store.memory_vector_cache  # type: ignore[attr-defined]
    cached = "pgvector" not in await store.memory_vector_index()

    async def agrees() -> None:
        async with await open_store(store_url, cipher=cipher) as fresh:
            for probe in probes:
                assert await nearest(store, *probe, top_k=5) == await nearest(
                    fresh, *probe, top_k=5
                )

    await agrees()
    loads = cache.loads
    async with await open_store(store_url, cipher=cipher) as other:
        await other.write_memory(entry("up", "up"), vector=vec(0, 0, 1, 0))
        assert await nearest(store, 0, 0, 1, 0, top_k=1) == ["up"]
        await other.write_memory(entry("e007", "moved"), vector=vec(0, 0, 0, 1))
        assert "e007" not in await nearest(store, *vectors[7], top_k=1)
        await other.write_memory(entry("e042", "no vector now"))
        assert "e042" not in await nearest(store, *vectors[42], top_k=120)
        assert await other.delete_memory_entry(NOTES, "up")
        assert "up" not in await nearest(store, 0, 0, 1, 0, top_k=5)
        await other.write_memory(entry("new", "new"), vector=vec(1, 1, 1, 1), max_entries=118)
        await agrees()
        assert (await store.memory_stats("default", "notes")).vectors == 117  # 118, one without
    if cached:
        assert cache.loads == loads and cache.updates >= 5


async def test_a_cache_older_than_the_kept_changes_or_of_a_deleted_memory_loads_again(
    store: Store, store_url: str, cipher: SecretCipher
) -> None:
    from corral.store.sql.memory import KEPT_GENERATIONS

    await store.write_memory(entry("a", "a"), vector=vec(1, 0, 0, 0))
    assert await nearest(store, 1, 0, 0, 0) == ["a"]
    cache = store.memory_vector_cache  # type: ignore[attr-defined]
    cached = "pgvector" not in await store.memory_vector_index()
    loads = cache.loads
    async with await open_store(store_url, cipher=cipher) as other:
        for n in range(KEPT_GENERATIONS + 1):
            await other.write_memory(entry(f"k{n}", "k"), vector=vec(0, 1, 0, n))
    assert await nearest(store, 0, 1, 0, 0, top_k=1) == ["k0"]
    if cached:
        assert cache.loads == loads + 1  # the changes since were no longer all kept
    assert len(await nearest(store, 1, 0, 0, 0, top_k=100)) == KEPT_GENERATIONS + 2


def test_an_update_replaces_changed_rows_keeps_the_rest_and_may_empty_the_matrix() -> None:
    rows = np.eye(3, 4, dtype=np.float32)
    matrix = Matrix.of(1, list(range(1, 33)), np.tile(rows, (11, 1))[:32])
    fresh = Matrix.of(2, [2, 99], np.array([[0, 0, 0, 2], [0, 0, 0, 3]], dtype=np.float32))
    # 3 changed and is not in fresh: deleted; 2 changed: replaced; 99 is new
    updated = matrix.updated(np.array([2, 3, 99], dtype=np.int64), fresh)
    assert updated.rows is matrix.rows  # appended in the spare rows: nothing copied
    alive = sorted(n for n in updated.ids.tolist() if n != DEAD)
    assert updated.generation == 2 and alive == [1, 2, *range(4, 33), 99]
    assert [i for i, _ in updated.nearest([0.0, 0.0, 0.0, 1.0], 2)] == [2, 99]
    assert 3 not in [i for i, _ in updated.nearest([0.0, 0.0, 1.0, 0.0], 40)]
    assert len(updated.nearest([1.0, 0.0, 0.0, 0.0], 100)) == 32  # 32 - 2 dead + 2 new
    filtered = updated.nearest([1.0, 0.0, 0.0, 0.0], 5, np.array([3, 2, 1], dtype=np.int64))
    assert [i for i, _ in filtered] == [1, 2]
    # the old matrix still answers as it was: its rows were not written over
    assert [i for i, _ in matrix.nearest([0.0, 0.0, 1.0, 0.0], 1)] == [3]
    # a second update from the old matrix cannot append after the first: it copies
    again = matrix.updated(np.array([5], dtype=np.int64), Matrix.of(2, [], rows[:0]))
    assert again.rows is not matrix.rows and 5 not in again.ids.tolist()
    assert again.vectors.flags.c_contiguous and again.vectors.dtype == np.float32
    nothing = Matrix.of(3, [], np.zeros((0, 0), dtype=np.float32))
    emptied = updated.updated(np.array(alive, dtype=np.int64), nothing)
    assert emptied.nearest([1.0, 0.0, 0.0, 0.0], 5) == []


async def test_a_large_scope_ranks_by_the_int8_first_pass_as_by_float32_through_updates(
    store: Store,
) -> None:
    """A scope above the first pass's threshold: the store's hits are the exact top k, and
    its cached matrix answers alike by either pass, before and after writes patch it."""
    rng = np.random.default_rng(11)
    count, dims, embedder = FIRST_PASS_MIN_ROWS + 500, 64, "embedder/64"
    rows = {f"e{n:05d}": row for n, row in enumerate(rng.standard_normal((count, dims)))}
    await store.write_memories(
        [entry(key, key) for key in rows],
        [vec(*map(float, row), embedder=embedder) for row in rows.values()],
    )
    query = rng.standard_normal(dims)
    unit = (query / np.linalg.norm(query)).tolist()

    async def exact_top(loads: int) -> None:
        hits = await store.search_memory(
            NOTES, "", top_k=50, vector=vec(*map(float, query), embedder=embedder)
        )
        truth = {key: float(row @ query / np.linalg.norm(row)) for key, row in rows.items()}
        ranked = sorted(truth, key=lambda key: -truth[key])[:51]
        gaps = np.diff([truth[key] for key in ranked])
        assert (np.abs(gaps) > 1e-5).all()  # no near-tie for float32 to decide
        assert keys(hits) == ranked[:50]
        if "pgvector" in await store.memory_vector_index():
            return
        cache: VectorCache = store.memory_vector_cache  # type: ignore[attr-defined]
        [key] = cache.keys()
        matrix = cache.latest(key)
        assert matrix is not None and (matrix.codes is not None) == FIRST_PASS
        full = matrix.nearest(unit, 50, first_pass=False)
        assert matrix.nearest(unit, 50, first_pass=True) == full
        assert cache.loads == loads

    await exact_top(1)
    # a few writes: the cached matrix is patched (rows appended, old ones dead)
    changed = {f"e{n:05d}": rng.standard_normal(dims) for n in range(0, 40, 4)}
    changed["new"] = query + 0.1 * rng.standard_normal(dims)
    await store.write_memories(
        [entry(key, key) for key in changed],
        [vec(*map(float, row), embedder=embedder) for row in changed.values()],
    )
    rows.update(changed)
    await store.delete_memory_entry(NOTES, "e00001")
    del rows["e00001"]
    await exact_top(1)


async def test_vectors_of_one_embedder_in_several_dimensions_are_refused_not_misread(
    store: Store, request: pytest.FixtureRequest
) -> None:
    """The store takes any vector under an embedder's name; rows of 3, 2 and 4 dimensions
    (9 numbers: three rows of 3, read end to end) are a clear error at search, never
    vectors cut out of their neighbours (the 2-dimensional one read as (0, 1, 0))."""
    if request.node.callspec.params["store_url"] == "pgvector":
        pytest.skip("pgvector compares in SQL, where PostgreSQL refuses the mix itself")
    await store.write_memories(
        [entry(key, key) for key in ("three", "two", "four")],
        [vec(1, 0, 0), vec(0, 1), vec(0, 0, 0, 1)],
    )
    with pytest.raises(MemoryInputError, match="dimensions differ") as raised:
        await store.search_memory(NOTES, "", vector=vec(0, 1, 0))
    assert raised.value.code == "invalid_memory_input"
    # a few rows of another size written later are refused as the update reads them
    await store.delete_memory_entry(NOTES, "two")
    await store.delete_memory_entry(NOTES, "four")
    assert await nearest(store, 1, 0, 0, top_k=1) == ["three"]
    await store.write_memory(entry("five", "five"), vector=vec(0, 0, 0, 0, 1))
    with pytest.raises(MemoryInputError, match="dimensions differ"):
        await store.search_memory(NOTES, "", vector=vec(1, 0, 0))


def test_decoding_rows_of_several_sizes_fails_rather_than_realigning_them() -> None:
    blobs = [np.asarray(row, dtype="<f4").tobytes() for row in ([1, 0, 0], [0, 1], [0, 0, 0, 1])]
    with pytest.raises(ValueError, match="dimensions differ"):
        decode_blobs(blobs, 3)
    with pytest.raises(ValueError, match="dimensions differ"):
        decode_blobs([b"\x00" * 6], 1)  # not whole float32s
    sent = [_array_send(row) for row in ([1.0, 0.0, 0.0], [0.0, 1.0], [0.0, 0.0, 0.0, 1.0])]
    with pytest.raises(ValueError, match="dimensions differ"):
        decode_arrays(sent)
    assert decode_arrays(sent[:1]).tolist() == [[1.0, 0.0, 0.0]]


def _array_send(values: list[float]) -> bytes:
    """PostgreSQL's ``array_send`` of a one-dimensional ``real[]`` (float4's oid, 700)."""
    header = np.asarray([1, 0, 700, len(values), 1], dtype=">i4").tobytes()
    return header + b"".join(
        np.asarray([4], dtype=">i4").tobytes() + np.asarray([v], dtype=">f4").tobytes()
        for v in values
    )


async def test_a_scopes_vectors_are_read_and_patched_off_the_event_loop(
    store: Store, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Normalising and quantising a scope read whole, and copying a matrix an update
    cannot append to, take a large scope's tenths of a second: in a worker thread, as the
    full-text index is tokenized, never on the event loop's."""
    if request.node.callspec.params["store_url"] == "pgvector":
        pytest.skip("pgvector compares in SQL: no matrix")
    loop = threading.get_ident()
    threads: dict[str, set[int]] = {"of": set(), "updated": set()}
    of, updated = Matrix.of, Matrix.updated

    def recorded_of(*args: Any) -> Matrix:
        threads["of"].add(threading.get_ident())
        return of(*args)

    def recorded_updated(self: Matrix, *args: Any) -> Matrix:
        threads["updated"].add(threading.get_ident())
        return updated(self, *args)

    monkeypatch.setattr(Matrix, "of", staticmethod(recorded_of))
    monkeypatch.setattr(Matrix, "updated", recorded_updated)
    await store.write_memories(
        [entry(f"k{n}", "x") for n in range(8)],
        [vec(1, n, 0, 0) for n in range(8)],
    )
    assert await nearest(store, 1, 0, 0, 0, top_k=1) == ["k0"]
    await store.write_memory(entry("k9", "x"), vector=vec(0, 0, 1, 0))
    assert await nearest(store, 0, 0, 1, 0, top_k=1) == ["k9"]
    assert threads["of"] and threads["updated"]
    assert loop not in threads["of"] | threads["updated"]


async def test_an_update_reads_the_changed_vectors_a_statements_worth_of_ids_at_a_time(
    store: Store, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quarter of a large scope changed at once (40,000 of 160,000 entries, in one
    batch) is more ids than one statement may bind (asyncpg takes 32,767): the update
    reads them in parts, here of 3, and patches the cached matrix alike."""
    if request.node.callspec.params["store_url"] == "pgvector":
        pytest.skip("pgvector compares in SQL: no matrix")
    monkeypatch.setattr(memory, "IDS_PER_STATEMENT", 3, raising=False)
    bound: list[int] = []

    def count(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "memory_vectors" in statement and statement.lstrip().upper().startswith("SELECT"):
            bound.append(len(params))

    engine = store._engine.sync_engine  # type: ignore[attr-defined]
    sa.event.listen(engine, "before_cursor_execute", count)
    try:
        await store.write_memories(
            [entry(f"k{n}", "x") for n in range(40)], [vec(1, n, 0, 0) for n in range(40)]
        )
        assert await nearest(store, 1, 0, 0, 0, top_k=1) == ["k0"]
        await store.write_memories(
            [entry(f"k{n}", "x") for n in range(1, 10)],
            [vec(0, 0, n, 1) for n in range(1, 10)],
        )
        assert await nearest(store, 0, 0, 1, 0, top_k=2) == ["k9", "k8"]
    finally:
        sa.event.remove(engine, "before_cursor_execute", count)
    cache: VectorCache = store.memory_vector_cache  # type: ignore[attr-defined]
    assert cache.loads == 1 and cache.updates == 1
    # the scope read whole (its place and the embedder), then 3 ids at a time with them
    assert [n for n in bound if n] == [4, 3 + 4, 3 + 4, 3 + 4]


async def test_searches_at_once_of_a_scope_not_yet_cached_load_its_vectors_once(
    store: Store, request: pytest.FixtureRequest
) -> None:
    """Eight vector searches at once of a scope whose vectors no search has read: one
    loads the matrix, the others wait for it (not eight matrices of the scope at once)."""
    if request.node.callspec.params["store_url"] == "pgvector":
        pytest.skip("pgvector compares in SQL: no matrix")
    await store.write_memories(
        [entry(f"k{n}", "x") for n in range(50)], [vec(1, n, 0, 0) for n in range(50)]
    )
    answers = await asyncio.gather(*(nearest(store, 1, 0, 0, 0, top_k=2) for _ in range(8)))
    assert answers == [["k0", "k1"]] * 8
    cache: VectorCache = store.memory_vector_cache  # type: ignore[attr-defined]
    assert cache.loads == 1 and cache.updates == 0


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # (the matrix is the same)
async def test_searches_at_once_of_a_scope_too_large_to_keep_load_it_each_at_once(
    store_url: str, cipher: SecretCipher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scope over the whole budget is loaded for each search: searches at once of it,
    once it is known too large, do not wait for one another's loads."""
    monkeypatch.setenv("CORRAL_MEMORY_VECTOR_CACHE_BYTES", "100")
    async with await open_store(store_url, cipher=cipher) as store:
        await store.write_memories(
            [entry(f"k{n}", "x") for n in range(50)], [vec(1, n, 0, 0) for n in range(50)]
        )
        assert await nearest(store, 1, 0, 0, 0, top_k=2) == ["k0", "k1"]
        cache: VectorCache = store.memory_vector_cache  # type: ignore[attr-defined]
        assert cache.too_large and cache.keys() == []
        loading = store._memory_vector_loading  # type: ignore[attr-defined]
        entered: list[int] = []
        turn = loading.turn

        def counted(key: str) -> Any:
            entered.append(1)
            return turn(key)

        monkeypatch.setattr(loading, "turn", counted)
        answers = await asyncio.gather(*(nearest(store, 1, 0, 0, 0, top_k=2) for _ in range(4)))
        assert answers == [["k0", "k1"]] * 4 and entered == [] and cache.loads == 5
