"""The memory-backend seam: where a Memory's entries live and are searched.

Every memory operation - the ``memory_*`` tools of an agent and the front doors'
operations (:mod:`corral.runtime.memory`) - goes through a :class:`MemoryBackend`
bound to one Memory's spec. :func:`open_memory_backend` is the one place a
Memory's ``spec.backend`` picks the implementation:

- ``store`` (:class:`StoreMemoryBackend`): the entries in the Corral store itself
  (SQLite embedded, PostgreSQL in scale-out), searched by its full-text index and,
  for a Memory with ``spec.embedding``, by their vectors too (hybrid search): entries
  are embedded before they are written (in batches of :data:`EMBED_BATCH` for many),
  the query before it is searched. A replayed write (an idempotency key already
  stored) is answered from the store before anything is embedded. An embedding model
  that fails or answers other dimensions fails the operation with a
  :class:`~corral.core.memory.MemoryBackendError` and nothing is written: a search
  never silently falls back to full text alone;
- ``http`` (:class:`corral.tools.memory_http.HttpMemoryBackend`): a remote memory
  service speaking the contract of docs/memory-http.md.

A backend applies its Memory's retention on every write (``spec.retention``) and
takes entries and places already checked by the caller (:mod:`corral.core.memory`);
it reports what it cannot take as ``MemoryInputError``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from corral.core.errors import ConfigurationError, EmbeddingDimensionsError, ModelError
from corral.core.memory import (
    EmbeddingSpend,
    MemoryBackendError,
    MemoryEntry,
    MemoryHit,
    MemoryPlace,
    MemoryStats,
    MemoryVector,
    embedder_id,
)
from corral.core.messages import Embeddings
from corral.resources.memory import MemorySpec
from corral.store.base import Store

__all__ = [
    "EMBED_BATCH",
    "MemoryBackend",
    "StoreMemoryBackend",
    "TextEmbedder",
    "open_memory_backend",
]

#: the most texts one embeddings request carries (OpenAI's API takes 2048)
EMBED_BATCH = 64


class TextEmbedder(Protocol):
    """What a Memory embeds with: a ModelEndpoint's model (``Model.embed``), as the
    tools see it."""

    name: str

    async def embed(self, texts: Sequence[str], *, dimensions: int | None = None) -> Embeddings:
        """One vector per text, ``dimensions`` long."""
        ...


class MemoryBackend(Protocol):
    """The entries of one Memory (every scope of it): written, read, listed, deleted,
    searched, counted and pruned. The methods' contracts are those of the store's
    memory operations (:class:`corral.store.base.Store`)."""

    async def write(
        self, entry: MemoryEntry, *, spend: EmbeddingSpend | None = None
    ) -> tuple[MemoryEntry, bool]:
        """Store ``entry`` (replacing its key's), the Memory's retention applied; the entry
        as stored and whether this call wrote it (``False``: its idempotency key was
        written before, and that entry comes back). What embedding it cost is added to
        ``spend`` (nothing for a replayed write, or a backend that embeds elsewhere)."""
        ...

    async def write_many(
        self, entries: Sequence[MemoryEntry], *, spend: EmbeddingSpend | None = None
    ) -> list[tuple[MemoryEntry, bool]]:
        """:meth:`write` for each entry, in order (an ingest's chunks); a backend may
        batch them (the store writes them in one transaction)."""
        ...

    async def read(self, place: MemoryPlace, key: str) -> MemoryEntry | None:
        """The entry of ``key`` at ``place``, or ``None``."""
        ...

    async def list_entries(
        self, place: MemoryPlace, *, prefix: str = "", limit: int = 20, after: str | None = None
    ) -> list[MemoryEntry]:
        """Entries by key (starting with ``prefix``, after the key ``after``), at most ``limit``."""
        ...

    async def delete(self, place: MemoryPlace, key: str) -> bool:
        """Delete one entry; whether it existed."""
        ...

    async def search(
        self,
        place: MemoryPlace,
        query: str,
        *,
        top_k: int = 5,
        filters: Mapping[str, Any] | None = None,
        spend: EmbeddingSpend | None = None,
    ) -> list[MemoryHit]:
        """Entries matching ``query``, best first, at most ``top_k``; with ``filters``,
        only those whose metadata has each key equal to its value. What embedding the
        query cost is added to ``spend``."""
        ...

    async def stats(self, namespace: str, memory: str) -> MemoryStats:
        """What the Memory holds, all scopes together, and how it is searched."""
        ...

    async def prune(self, place: MemoryPlace, *, now: float | None = None) -> int:
        """Apply the Memory's retention to one scope now; how many entries went."""
        ...

    async def aclose(self) -> None:
        """Release what the backend holds (connections); it is not used after."""
        ...


class StoreMemoryBackend:
    """A Memory whose entries live in the Corral store (``backend: store``), embedded
    by ``embedder`` when the spec has an ``embedding``."""

    def __init__(
        self,
        store: Store,
        spec: MemorySpec,
        embedder: TextEmbedder | None = None,
        name: str = "memory",
    ) -> None:
        if spec.embedding is not None and embedder is None:
            raise ConfigurationError(f"Memory {name!r} needs its embedding model to be opened")
        self.store = store
        self.spec = spec
        self.name = name
        self.embedder = embedder if spec.embedding is not None else None

    async def write(
        self, entry: MemoryEntry, *, spend: EmbeddingSpend | None = None
    ) -> tuple[MemoryEntry, bool]:
        [written] = await self.write_many([entry], spend=spend)
        return written

    async def write_many(
        self, entries: Sequence[MemoryEntry], *, spend: EmbeddingSpend | None = None
    ) -> list[tuple[MemoryEntry, bool]]:
        retention = self.spec.retention
        if self.embedder is None:
            return await self.store.write_memories(
                entries, max_entries=retention.max_entries, max_age_days=retention.max_age_days
            )
        done: dict[int, tuple[MemoryEntry, bool]] = {}
        for n, entry in enumerate(entries):
            if entry.idempotency_key is not None:
                found = await self.store.memory_by_idempotency_key(
                    entry.namespace, entry.memory, entry.idempotency_key
                )
                if found is not None:  # a replay: written before, not embedded again
                    done[n] = (found, False)
        todo = [n for n in range(len(entries)) if n not in done]
        vectors = await self._vectors([entries[n].text for n in todo], spend)
        written = await self.store.write_memories(
            [entries[n] for n in todo],
            vectors,
            max_entries=retention.max_entries,
            max_age_days=retention.max_age_days,
        )
        done.update(zip(todo, written, strict=True))
        return [done[n] for n in range(len(entries))]

    async def _vectors(
        self, texts: Sequence[str], spend: EmbeddingSpend | None
    ) -> list[MemoryVector]:
        """The embedding of each text, by the Memory's model (in batches); what each
        batch cost is added to ``spend`` as soon as it is answered."""
        assert self.embedder is not None and self.spec.embedding is not None
        dimensions = self.spec.embedding.dimensions
        made_by = embedder_id(self.embedder.name, dimensions)
        vectors: list[MemoryVector] = []
        for start in range(0, len(texts), EMBED_BATCH):
            batch = texts[start : start + EMBED_BATCH]
            try:
                answer = await self.embedder.embed(batch, dimensions=dimensions)
            except (ModelError, ConfigurationError) as exc:
                if spend is not None and isinstance(exc, ModelError) and exc.paid is not None:
                    spend.add(exc.paid)  # the model refused an answer its provider billed
                raise self._embedding_failed(exc) from None
            if spend is not None:  # paid, even when the answer is refused below
                spend.add(answer)
            if len(answer.vectors) != len(batch) or answer.dimensions not in (0, dimensions):
                raise self._embedding_failed(
                    EmbeddingDimensionsError(
                        f"{len(answer.vectors)} vectors of {answer.dimensions} dimensions for "
                        f"{len(batch)} texts of {dimensions}"
                    )
                )
            vectors += [MemoryVector(made_by, vector) for vector in answer.vectors]
        return vectors

    def _embedding_failed(self, exc: ModelError | ConfigurationError) -> MemoryBackendError:
        """An embedding model's failure, as the Memory's: nothing was written or searched."""
        model = self.embedder.name if self.embedder is not None else "?"
        message = f"Memory {self.name!r}: its embedding model {model!r} failed: {exc.message}"
        if isinstance(exc, EmbeddingDimensionsError):
            return MemoryBackendError(message, code="memory_backend_bad_answer")
        if isinstance(exc, ModelError) and exc.retryable:
            timeout = exc.code == "model_timeout"
            code = "memory_backend_timeout" if timeout else "memory_backend_unavailable"
            return MemoryBackendError(message, code=code, retryable=True)
        return MemoryBackendError(message, code="memory_backend_refused")

    async def read(self, place: MemoryPlace, key: str) -> MemoryEntry | None:
        return await self.store.read_memory(place, key)

    async def list_entries(
        self, place: MemoryPlace, *, prefix: str = "", limit: int = 20, after: str | None = None
    ) -> list[MemoryEntry]:
        return await self.store.list_memory(place, prefix=prefix, limit=limit, after=after)

    async def delete(self, place: MemoryPlace, key: str) -> bool:
        return await self.store.delete_memory_entry(place, key)

    async def search(
        self,
        place: MemoryPlace,
        query: str,
        *,
        top_k: int = 5,
        filters: Mapping[str, Any] | None = None,
        spend: EmbeddingSpend | None = None,
    ) -> list[MemoryHit]:
        vector = None
        if self.embedder is not None:
            [vector] = await self._vectors([query], spend)
        return await self.store.search_memory(
            place, query, top_k=top_k, filters=filters, vector=vector
        )

    async def stats(self, namespace: str, memory: str) -> MemoryStats:
        stats = await self.store.memory_stats(namespace, memory)
        embedding = self.spec.embedding
        if embedding is None:
            return stats
        index = stats.index
        if not stats.vectors:  # the store names its vector search once it holds vectors
            index += f"; vectors: {await self.store.memory_vector_index()}"
        index += f"; embedding model {embedding.model!r} ({embedding.dimensions} dimensions)"
        return replace(stats, index=index)

    async def prune(self, place: MemoryPlace, *, now: float | None = None) -> int:
        retention = self.spec.retention
        return await self.store.prune_memory(
            place, max_entries=retention.max_entries, max_age_days=retention.max_age_days, now=now
        )

    async def aclose(self) -> None:
        return None


def open_memory_backend(
    name: str,
    spec: MemorySpec,
    store: Store,
    secrets: Mapping[str, str] | None = None,
    embedder: TextEmbedder | None = None,
) -> MemoryBackend:
    """The backend of the Memory ``name`` (the one place ``spec.backend`` is read).
    ``secrets`` are the resolved values of the secrets the spec names (a remote
    backend's auth), ``embedder`` the model of its ``spec.embedding``; the caller
    closes the backend (:meth:`MemoryBackend.aclose`) and the embedder."""
    if spec.backend == "store":
        return StoreMemoryBackend(store, spec, embedder, name)
    if spec.backend == "http":
        from corral.tools.memory_http import HttpMemoryBackend

        return HttpMemoryBackend(name, spec, secrets or {})
    raise ConfigurationError(f"Memory {name!r}: unknown backend {spec.backend!r}")
