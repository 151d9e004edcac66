"""Ingesting a long text into a Memory: cut by the Memory's ``spec.chunking``
(:func:`corral.core.chunking.chunk_text`), each chunk one entry.

One operation for the ``memory_ingest`` tool and the front doors (``corral memory
ingest``, ``POST /v1/memories/{name}/ingest``). An ingest is idempotent by its key:
chunk ``i`` is written with the idempotency key ``KEY:i``, so an ingest replayed
(a run resumed after a crash mid-ingest, a file ingested again) writes no chunk twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from corral.core.chunking import chunk_text
from corral.core.memory import (
    MAX_KEY_CHARS,
    MAX_METADATA_VALUE_CHARS,
    EmbeddingSpend,
    MemoryEntry,
    MemoryInputError,
    MemoryPlace,
)
from corral.resources.memory import MemorySpec
from corral.tools.memory_backend import MemoryBackend

#: how many chunks are written (and embedded) together
INGEST_BATCH = 64
#: the longest key prefix (the chunk's number follows it)
MAX_PREFIX_CHARS = MAX_KEY_CHARS - 16


@dataclass(frozen=True)
class IngestResult:
    """What an ingest did: its chunks' keys, and how many were written now (the others
    were written by an earlier run of the same ingest)."""

    keys: list[str]
    written: int

    @property
    def chunks(self) -> int:
        return len(self.keys)


def chunk_key(idempotency_key: str, index: int) -> str:
    """The idempotency key of chunk ``index`` of the ingest keyed ``idempotency_key``."""
    key = f"{idempotency_key}:{index}"
    return key if len(key) <= 255 else "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def content_key(*parts: str) -> str:
    """An idempotency key from what is ingested (for ingests that are not tool calls):
    the same text under the same prefix is not written twice."""
    digest = hashlib.sha256("\x00".join(parts).encode("utf-8", "surrogatepass"))
    return "ingest:" + digest.hexdigest()[:32]


async def ingest_text(
    backend: MemoryBackend,
    place: MemoryPlace,
    spec: MemorySpec,
    text: str,
    *,
    source: str,
    key_prefix: str,
    idempotency_key: str,
    metadata: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
    spend: EmbeddingSpend | None = None,
) -> IngestResult:
    """Cut ``text`` and write each chunk as the entry ``KEY_PREFIX#N`` with metadata
    ``{..., source, chunk: N, chunks}``, :data:`INGEST_BATCH` chunks at a time (one
    transaction, one embeddings request each in the store); ``progress(done, total)``
    after each batch; what embedding the chunks cost is added to ``spend``."""
    if not key_prefix or len(key_prefix) > MAX_PREFIX_CHARS:
        raise MemoryInputError(f"a key prefix has 1 to {MAX_PREFIX_CHARS} characters")
    chunks = chunk_text(text, spec.chunking.size, spec.chunking.overlap)
    if not chunks:
        raise MemoryInputError("nothing to ingest: the text is empty")
    source = source[:MAX_METADATA_VALUE_CHARS]
    keys: list[str] = []
    written = 0
    for start in range(0, len(chunks), INGEST_BATCH):
        batch = [
            MemoryEntry(
                place.namespace,
                place.memory,
                place.scope_key,
                f"{key_prefix}#{index}",
                chunk,
                {**(metadata or {}), "source": source, "chunk": index, "chunks": len(chunks)},
                idempotency_key=chunk_key(idempotency_key, index),
            )
            for index, chunk in enumerate(chunks[start : start + INGEST_BATCH], start=start)
        ]
        for stored, fresh in await backend.write_many(batch, spend=spend):
            keys.append(stored.key)
            written += fresh
        if progress is not None:
            progress(start + len(batch), len(chunks))
    return IngestResult(keys, written)


__all__ = [
    "INGEST_BATCH",
    "MAX_PREFIX_CHARS",
    "IngestResult",
    "chunk_key",
    "content_key",
    "ingest_text",
]
