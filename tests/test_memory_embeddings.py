"""A Memory with an embedding model: entries embedded on write (in batches on ingest),
queries embedded on search, hybrid results with their signals, and an embedding model
that fails, hangs or answers other dimensions leaves nothing half-written.

The store backend runs on SQLite and on PostgreSQL (the machine's server); the model is
the ``openai`` provider against the fake OpenAI server's ``/v1/embeddings`` (real HTTP),
built as agents get it (retries, timeout, pricing). Through the front doors: the HTTP
API's search answers the signals, and an agent's ``memory_write`` replayed embeds once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from corral.core.memory import FULLTEXT, VECTOR, MemoryBackendError, MemoryEntry, MemoryPlace
from corral.models.base import Model
from corral.models.registry import build_model
from corral.resources.memory import MemorySpec
from corral.store import Store, open_store
from corral.testing.fake_openai import FakeOpenAIServer
from corral.tools.memory_backend import EMBED_BATCH, MemoryBackend, open_memory_backend
from corral.tools.memory_ingest import ingest_text
from databases import PostgresServer
from fixtures_models import endpoint

NOTES = MemoryPlace("default", "notes")
DIMENSIONS = 16


def entry(key: str, text: str, **extra: Any) -> MemoryEntry:
    return MemoryEntry(NOTES.namespace, NOTES.memory, NOTES.scope_key, key, text, **extra)


@pytest.fixture(scope="module")
def embeddings_server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(embedding_dimensions=DIMENSIONS) as server:
        yield server


@pytest.fixture
def fake(embeddings_server: FakeOpenAIServer) -> FakeOpenAIServer:
    embeddings_server.reset()
    return embeddings_server


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "postgresql":
        postgres: PostgresServer = request.getfixturevalue("postgres")
        url = postgres.url(postgres.scratch())
    else:
        url = f"sqlite:///{tmp_path / 'corral.db'}"
    async with await open_store(url) as opened:
        yield opened


class Opened:
    """Backends of the test's store over the fake server, closed after the test."""

    def __init__(self, store: Store, server: FakeOpenAIServer, stack: AsyncExitStack) -> None:
        self.store, self.server, self.stack = store, server, stack

    def model(self, **kw: Any) -> Model:
        model = build_model("embedder", endpoint("openai", self.server.base_url, **kw), "sk-t")
        self.stack.push_async_callback(model.aclose)
        return model

    def backend(self, dimensions: int = DIMENSIONS, **kw: Any) -> MemoryBackend:
        spec = MemorySpec(embedding={"model": "embedder", "dimensions": dimensions})  # type: ignore[arg-type]
        backend = open_memory_backend("notes", spec, self.store, {}, self.model(**kw))
        self.stack.push_async_callback(backend.aclose)
        return backend


@pytest.fixture
async def opened(store: Store, fake: FakeOpenAIServer) -> AsyncIterator[Opened]:
    async with AsyncExitStack() as stack:
        yield Opened(store, fake, stack)


def embedded(server: FakeOpenAIServer) -> list[list[str]]:
    """The texts of each embeddings request the server received."""
    return [r.json["input"] for r in server.requests if r.path.endswith("/embeddings")]


async def test_a_write_embeds_its_text_and_a_search_its_query(opened: Opened) -> None:
    backend = opened.backend()
    await backend.write(entry("cats", "the cat sat on the mat"))
    await backend.write(entry("stocks", "stock prices fell sharply"))
    hits = await backend.search(NOTES, "cat mat", top_k=2)
    assert embedded(opened.server) == [
        ["the cat sat on the mat"],
        ["stock prices fell sharply"],
        ["cat mat"],
    ]
    assert [h.entry.key for h in hits] == ["cats", "stocks"]
    assert hits[0].signals == (FULLTEXT, VECTOR)
    assert hits[1].signals == (VECTOR,)  # no shared word: found by its vector alone
    stats = await backend.stats("default", "notes")
    assert stats.vectors == 2 and "embedding model 'embedder' (16 dimensions)" in stats.index


async def test_an_ingest_embeds_its_chunks_in_batches(opened: Opened) -> None:
    backend = opened.backend()
    spec = MemorySpec(chunking={"size": 100, "overlap": 0})  # type: ignore[arg-type]
    text = " ".join(f"Sentence number {n} talks about topic {n}." for n in range(200))
    done = await ingest_text(
        backend, NOTES, spec, text, source="doc", key_prefix="doc", idempotency_key="i1"
    )
    requests = embedded(opened.server)
    assert sum(len(r) for r in requests) == done.chunks == done.written
    assert len(requests) == -(-done.chunks // EMBED_BATCH) and done.chunks > EMBED_BATCH
    again = await ingest_text(
        backend, NOTES, spec, text, source="doc", key_prefix="doc", idempotency_key="i1"
    )
    assert again.written == 0 and len(embedded(opened.server)) == len(requests)


async def test_a_replayed_write_neither_embeds_nor_writes_again(opened: Opened) -> None:
    backend = opened.backend()
    first, fresh = await backend.write(entry("k", "first text", idempotency_key="call-1"))
    again, fresh_again = await backend.write(entry("k2", "other text", idempotency_key="call-1"))
    assert (fresh, fresh_again) == (True, False) and again.key == first.key == "k"
    assert embedded(opened.server) == [["first text"]]
    assert [e.key for e in await backend.list_entries(NOTES)] == ["k"]


async def test_a_model_answering_other_dimensions_writes_nothing(opened: Opened) -> None:
    backend = opened.backend(dimensions=32)
    with pytest.raises(MemoryBackendError) as caught:
        await backend.write(entry("k", "some text"))
    assert caught.value.code == "memory_backend_bad_answer"
    assert "16 dimensions, not the 32" in caught.value.message
    assert await backend.list_entries(NOTES) == []
    with pytest.raises(MemoryBackendError, match="16 dimensions, not the 32"):
        await backend.search(NOTES, "some text")


async def test_an_embedding_model_that_hangs_during_a_write_writes_nothing(
    opened: Opened,
) -> None:
    backend = opened.backend(timeout=0.3)
    opened.server.delay(5.0)
    with pytest.raises(MemoryBackendError) as caught:
        await backend.write(entry("k", "some text"))
    assert caught.value.code == "memory_backend_timeout" and caught.value.retryable
    assert await backend.list_entries(NOTES) == []
    # the next write, with the model back, goes through (a loaded machine's model answer
    # may take longer than the 0.3 s that made the hang quick to see)
    await opened.backend().write(entry("k", "some text"))
    assert [e.key for e in await backend.list_entries(NOTES)] == ["k"]


async def test_an_embedding_model_that_dies_during_an_ingest_writes_no_chunk(
    opened: Opened,
) -> None:
    backend = opened.backend()
    opened.server.fail(500, times=None)
    spec = MemorySpec(chunking={"size": 100, "overlap": 0})  # type: ignore[arg-type]
    with pytest.raises(MemoryBackendError) as caught:
        await ingest_text(
            backend, NOTES, spec, "word " * 200, source="d", key_prefix="d", idempotency_key="x"
        )
    assert caught.value.code == "memory_backend_unavailable" and caught.value.retryable
    assert await backend.list_entries(NOTES) == []


async def test_a_search_whose_embedding_fails_is_an_error_not_full_text_alone(
    opened: Opened,
) -> None:
    """Decided: no silent fallback to full text (results would change meaning without a
    word); the caller gets a retryable error and may search again."""
    backend = opened.backend(max_attempts=2)
    await backend.write(entry("k", "findable words"))
    opened.server.fail(503, times=None)
    with pytest.raises(MemoryBackendError) as caught:
        await backend.search(NOTES, "findable")
    assert caught.value.code == "memory_backend_unavailable"
    assert "embedder" in caught.value.message
    assert len(embedded(opened.server)) == 1 + 2  # the write, and the search's two attempts


async def test_a_chat_only_provider_as_embedding_model_is_refused_clearly(
    store: Store, tmp_path: Path
) -> None:
    from corral.testing.fake_anthropic import FakeAnthropicServer

    with FakeAnthropicServer() as server:
        model = build_model("chat", endpoint("anthropic", server.root_url, model="c"), "k")
        spec = MemorySpec(embedding={"model": "chat", "dimensions": 8})  # type: ignore[arg-type]
        backend = open_memory_backend("notes", spec, store, {}, model)
        with pytest.raises(MemoryBackendError, match="has no embeddings") as caught:
            await backend.write(entry("k", "text"))
        assert caught.value.code == "memory_backend_refused"
        await model.aclose()
