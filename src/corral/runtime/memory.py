"""Memory operations for the front doors (``corral memory ...``, ``/v1/memories``): a
Memory's entries read, written, ingested, searched, listed and deleted by a person, not
by an agent's tool call.

A Memory is found by namespace and name (``NotFoundError`` when absent, as for any
resource); its scope decides which entries an operation sees: a namespace-wide
Memory has one set, an ``agent`` or ``session`` Memory one per agent or session, named
by ``agent`` / ``session`` (``MemoryInputError`` when the scope needs the one not given).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from corral.core.errors import ConfigurationError, NotFoundError
from corral.core.memory import MemoryEntry, MemoryPlace, place_of
from corral.resources.memory import MemorySpec
from corral.store.base import Store
from corral.tools.memory_ingest import IngestResult, content_key, ingest_text

MEMORY_KIND = "Memory"


async def memory_spec(store: Store, namespace: str, name: str) -> MemorySpec:
    """The spec of the Memory ``name`` of ``namespace``."""
    stored = await store.get_resource(namespace, MEMORY_KIND, name)
    if stored is None:
        raise NotFoundError(f"Memory {name!r} not found in namespace {namespace!r}")
    spec = stored.resource.spec
    if not isinstance(spec, MemorySpec):  # the store returns validated specs
        raise ConfigurationError(f"Memory {name!r}: stored spec has the wrong type")
    return spec


async def memory_place(
    store: Store,
    namespace: str,
    name: str,
    *,
    agent: str | None = None,
    session: str | None = None,
) -> tuple[MemorySpec, MemoryPlace]:
    """The Memory's spec and the place of the entries ``agent`` / ``session`` see."""
    spec = await memory_spec(store, namespace, name)
    return spec, place_of(namespace, name, spec.scope, agent=agent, session=session)


async def write_entry(
    store: Store,
    namespace: str,
    name: str,
    text: str,
    *,
    key: str,
    metadata: Mapping[str, Any] | None = None,
    agent: str | None = None,
    session: str | None = None,
) -> MemoryEntry:
    """Write one entry (replacing the entry of ``key``), the Memory's retention applied."""
    spec, place = await memory_place(store, namespace, name, agent=agent, session=session)
    entry = MemoryEntry(
        place.namespace, place.memory, place.scope_key, key, text, dict(metadata or {})
    )
    stored, _ = await store.write_memory(
        entry,
        max_entries=spec.retention.max_entries,
        max_age_days=spec.retention.max_age_days,
    )
    return stored


async def ingest_document(
    store: Store,
    namespace: str,
    name: str,
    text: str,
    *,
    source: str,
    key_prefix: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    agent: str | None = None,
    session: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[str, IngestResult]:
    """Cut ``text`` by the Memory's chunking and write each chunk as ``KEY_PREFIX#N``
    (the prefix ``source`` when none is given). The ingest's idempotency key is its
    prefix and text: ingesting the same document again writes nothing twice. Returns
    the prefix used and what was written."""
    spec, place = await memory_place(store, namespace, name, agent=agent, session=session)
    prefix = key_prefix or source
    done = await ingest_text(
        store,
        place,
        spec,
        text,
        source=source,
        key_prefix=prefix,
        idempotency_key=content_key(prefix, text),
        metadata=metadata,
        progress=progress,
    )
    return prefix, done
