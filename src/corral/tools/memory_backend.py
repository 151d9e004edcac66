"""The memory-backend seam: where a Memory's entries live and are searched.

Every memory operation - the ``memory_*`` tools of an agent and the front doors'
operations (:mod:`corral.runtime.memory`) - goes through a :class:`MemoryBackend`
bound to one Memory's spec. :func:`open_memory_backend` is the one place a
Memory's ``spec.backend`` picks the implementation:

- ``store`` (:class:`StoreMemoryBackend`): the entries in the Corral store itself
  (SQLite embedded, PostgreSQL in scale-out), searched by its full-text index;
- ``http`` (:class:`corral.tools.memory_http.HttpMemoryBackend`): a remote memory
  service speaking the contract of docs/memory-http.md.

A backend applies its Memory's retention on every write (``spec.retention``) and
takes entries and places already checked by the caller (:mod:`corral.core.memory`);
it reports what it cannot take as ``MemoryInputError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from corral.core.errors import ConfigurationError
from corral.core.memory import MemoryEntry, MemoryHit, MemoryPlace, MemoryStats
from corral.resources.memory import MemorySpec
from corral.store.base import Store

__all__ = ["MemoryBackend", "StoreMemoryBackend", "open_memory_backend"]


class MemoryBackend(Protocol):
    """The entries of one Memory (every scope of it): written, read, listed, deleted,
    searched, counted and pruned. The methods' contracts are those of the store's
    memory operations (:class:`corral.store.base.Store`)."""

    async def write(self, entry: MemoryEntry) -> tuple[MemoryEntry, bool]:
        """Store ``entry`` (replacing its key's), the Memory's retention applied; the entry
        as stored and whether this call wrote it (``False``: its idempotency key was
        written before, and that entry comes back)."""
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
    ) -> list[MemoryHit]:
        """Entries matching ``query``, best first, at most ``top_k``; with ``filters``,
        only those whose metadata has each key equal to its value."""
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
    """A Memory whose entries live in the Corral store (``backend: store``)."""

    def __init__(self, store: Store, spec: MemorySpec) -> None:
        self.store = store
        self.spec = spec

    async def write(self, entry: MemoryEntry) -> tuple[MemoryEntry, bool]:
        retention = self.spec.retention
        return await self.store.write_memory(
            entry, max_entries=retention.max_entries, max_age_days=retention.max_age_days
        )

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
    ) -> list[MemoryHit]:
        return await self.store.search_memory(place, query, top_k=top_k, filters=filters)

    async def stats(self, namespace: str, memory: str) -> MemoryStats:
        return await self.store.memory_stats(namespace, memory)

    async def prune(self, place: MemoryPlace, *, now: float | None = None) -> int:
        retention = self.spec.retention
        return await self.store.prune_memory(
            place, max_entries=retention.max_entries, max_age_days=retention.max_age_days, now=now
        )

    async def aclose(self) -> None:
        return None


def open_memory_backend(
    name: str, spec: MemorySpec, store: Store, secrets: Mapping[str, str] | None = None
) -> MemoryBackend:
    """The backend of the Memory ``name`` (the one place ``spec.backend`` is read).
    ``secrets`` are the resolved values of the secrets the spec names (a remote
    backend's auth); the caller closes the backend (:meth:`MemoryBackend.aclose`)."""
    if spec.backend == "store":
        return StoreMemoryBackend(store, spec)
    if spec.backend == "http":
        from corral.tools.memory_http import HttpMemoryBackend

        return HttpMemoryBackend(name, spec, secrets or {})
    raise ConfigurationError(f"Memory {name!r}: unknown backend {spec.backend!r}")
