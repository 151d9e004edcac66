"""Memory operations for the front doors (``corral memory ...``, ``/v1/memories``): a
Memory's entries read, written, ingested, searched, listed and deleted by a person, not
by an agent's tool call.

A Memory is found by namespace and name (``NotFoundError`` when absent, as for any
resource); its scope decides which entries an operation sees: a namespace-wide
Memory has one set, an ``agent``, ``session`` or ``system_run`` Memory one per agent,
session or agent system's run, named by the operation's :class:`MemoryScope` (the
system run by its id; ``MemoryInputError`` when the scope needs the one not given,
``NotFoundError`` for a system run that is not one of the namespace's).
Each operation opens the Memory's backend (:func:`open_memory_backend`: the store, or
a remote service) and closes it when done.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from corral.core.errors import ConfigurationError, NotFoundError
from corral.core.memory import (
    MemoryBackendError,
    MemoryEntry,
    MemoryEntryNotFoundError,
    MemoryHit,
    MemoryInputError,
    MemoryPlace,
    MemoryScope,
    MemoryStats,
)
from corral.core.settings import Settings
from corral.models.base import EMBEDDING_PROVIDERS, Model
from corral.models.registry import build_model
from corral.resources.kinds import ModelEndpointSpec
from corral.resources.memory import MemorySpec
from corral.resources.secrets import SecretResolver, header_secret
from corral.store.base import Store
from corral.tools.memory_backend import MemoryBackend, open_memory_backend
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


def check_embeds(endpoint: str, spec: ModelEndpointSpec) -> None:
    """``ConfigurationError`` unless the ModelEndpoint's provider has embeddings."""
    if spec.provider not in EMBEDDING_PROVIDERS:
        raise ConfigurationError(
            f"the embedding model {endpoint!r} of a Memory: provider {spec.provider!r} "
            f"has no embeddings (providers that embed: {', '.join(sorted(EMBEDDING_PROVIDERS))})"
        )


async def embedding_model(
    store: Store, settings: Settings, namespace: str, spec: MemorySpec
) -> Model:
    """The model of a Memory's ``spec.embedding`` (its ModelEndpoint, with the endpoint's
    retries and pricing), refused with a clear reason when its provider cannot embed."""
    assert spec.embedding is not None
    endpoint = spec.embedding.model
    stored = await store.get_resource(namespace, "ModelEndpoint", endpoint)
    if stored is None or not isinstance(stored.resource.spec, ModelEndpointSpec):
        raise NotFoundError(f"ModelEndpoint {endpoint!r} not found in namespace {namespace!r}")
    model_spec = stored.resource.spec
    check_embeds(endpoint, model_spec)
    api_key = None
    if model_spec.api_key is not None:
        secret = model_spec.api_key.secret
        api_key = header_secret(
            await SecretResolver(store, settings).resolve(namespace, secret),
            owner=f"model endpoint {endpoint!r}",
            secret=secret,
        )
    return build_model(endpoint, model_spec, api_key)


@dataclass(frozen=True)
class OpenMemory:
    """A Memory opened for one operation: its spec, the place of the entries asked
    for, and its backend."""

    spec: MemorySpec
    place: MemoryPlace
    backend: MemoryBackend


class Memories:
    """The memory operations both front doors offer, over one store (and the settings
    its secrets are read with: a remote backend's auth)."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings

    @asynccontextmanager
    async def open(
        self,
        namespace: str,
        name: str,
        scope: MemoryScope = MemoryScope(),
        *,
        every_scope: bool = False,
    ) -> AsyncIterator[OpenMemory]:
        """The Memory ``name`` and the place of the entries ``scope`` sees (with
        ``every_scope``, its namespace-wide place: for operations on all scopes)."""
        spec = await memory_spec(self.store, namespace, name)
        if every_scope:
            place = MemoryPlace(namespace, name)
        else:
            if spec.scope == "system_run" and scope.system_run:
                await self._check_system_run(namespace, scope.system_run)
            place = scope.place_in(namespace, name, spec.scope)
        embedder = await self._embedder(namespace, name, spec)
        try:
            backend = await self._backend(namespace, name, spec, embedder)
            try:
                yield OpenMemory(spec, place, backend)
            finally:
                await backend.aclose()
        finally:
            if embedder is not None:
                await embedder.aclose()

    async def _check_system_run(self, namespace: str, run_id: str) -> None:
        """``run_id`` names a system run of ``namespace`` (a run of another namespace, or
        none, is not found; a node run of one is named by its system run's id)."""
        run = await self.store.get_run(run_id)
        if run is None or run.namespace != namespace:
            raise NotFoundError(f"system run {run_id!r} not found in namespace {namespace!r}")
        if not run.is_system_run:
            parent = (
                f": it is a node of the system run {run.parent_run_id!r}, name that one"
                if run.system is not None and run.parent_run_id
                else ""
            )
            raise MemoryInputError(f"run {run_id!r} is not an agent system's run{parent}")

    async def _embedder(self, namespace: str, name: str, spec: MemorySpec) -> Model | None:
        """The model of the Memory's ``spec.embedding`` (a store backend's), if it has one;
        one that cannot embed here is the backend's failure, as in :meth:`_backend`."""
        if spec.embedding is None or spec.backend != "store":
            return None
        try:
            return await embedding_model(self.store, self.settings, namespace, spec)
        except ConfigurationError as exc:
            raise MemoryBackendError(
                f"memory {name!r}: {exc.message}", code="memory_backend_unconfigured"
            ) from None

    async def _backend(
        self, namespace: str, name: str, spec: MemorySpec, embedder: Model | None
    ) -> MemoryBackend:
        """The Memory's backend, its auth secret resolved in this process. A secret that
        cannot be had here is the backend's failure (``memory_backend_unconfigured``),
        not the server's: the request says so, and the process goes on serving."""
        secrets: dict[str, str] = {}
        try:
            if spec.http is not None and spec.http.auth is not None:
                resolver = SecretResolver(self.store, self.settings)
                secrets[spec.http.auth.secret] = await resolver.resolve(
                    namespace, spec.http.auth.secret
                )
            return open_memory_backend(name, spec, self.store, secrets, embedder)
        except ConfigurationError as exc:
            raise MemoryBackendError(
                f"memory {name!r}: {exc.message}", code="memory_backend_unconfigured"
            ) from None

    async def stats(self, namespace: str, name: str) -> MemoryStats:
        """How many entries the Memory holds (every scope), their size, its index."""
        async with self.open(namespace, name, every_scope=True) as memory:
            return await memory.backend.stats(namespace, name)

    async def write(
        self,
        namespace: str,
        name: str,
        text: str,
        *,
        key: str,
        metadata: Mapping[str, Any] | None = None,
        scope: MemoryScope = MemoryScope(),
    ) -> MemoryEntry:
        """Write one entry (replacing the entry of ``key``), the Memory's retention applied."""
        async with self.open(namespace, name, scope) as memory:
            place = memory.place
            entry = MemoryEntry(
                place.namespace, place.memory, place.scope_key, key, text, dict(metadata or {})
            )
            stored, _ = await memory.backend.write(entry)
            return stored

    async def ingest(
        self,
        namespace: str,
        name: str,
        text: str,
        *,
        source: str,
        key_prefix: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        scope: MemoryScope = MemoryScope(),
        progress: Callable[[int, int], None] | None = None,
    ) -> tuple[str, IngestResult]:
        """Cut ``text`` by the Memory's chunking and write each chunk as ``KEY_PREFIX#N``
        (the prefix ``source`` when none is given). The ingest's idempotency key is its
        prefix and text (and the agent or session whose entries they are: the keys are
        unique in the whole Memory): ingesting the same document again writes nothing
        twice. Returns the prefix used and what was written."""
        prefix = key_prefix or source
        async with self.open(namespace, name, scope) as memory:
            owner = memory.place.scope_key
            done = await ingest_text(
                memory.backend,
                memory.place,
                memory.spec,
                text,
                source=source,
                key_prefix=prefix,
                idempotency_key=content_key(prefix, text, *([owner] if owner else [])),
                metadata=metadata,
                progress=progress,
            )
        return prefix, done

    async def read(
        self,
        namespace: str,
        name: str,
        key: str,
        *,
        scope: MemoryScope = MemoryScope(),
    ) -> MemoryEntry:
        """The entry of ``key`` (``MemoryEntryNotFoundError`` when absent)."""
        async with self.open(namespace, name, scope) as memory:
            entry = await memory.backend.read(memory.place, key)
        if entry is None:
            raise MemoryEntryNotFoundError(f"memory {name!r} has no entry {key!r}")
        return entry

    async def delete(
        self,
        namespace: str,
        name: str,
        key: str,
        *,
        scope: MemoryScope = MemoryScope(),
    ) -> None:
        """Delete the entry of ``key`` (``MemoryEntryNotFoundError`` when absent)."""
        async with self.open(namespace, name, scope) as memory:
            deleted = await memory.backend.delete(memory.place, key)
        if not deleted:
            raise MemoryEntryNotFoundError(f"memory {name!r} has no entry {key!r}")

    async def list_entries(
        self,
        namespace: str,
        name: str,
        *,
        prefix: str = "",
        limit: int = 20,
        after: str | None = None,
        scope: MemoryScope = MemoryScope(),
    ) -> list[MemoryEntry]:
        """The entries by key (starting with ``prefix``, after the key ``after``)."""
        async with self.open(namespace, name, scope) as memory:
            return await memory.backend.list_entries(
                memory.place, prefix=prefix, limit=limit, after=after
            )

    async def search(
        self,
        namespace: str,
        name: str,
        query: str,
        *,
        top_k: int = 5,
        filters: Mapping[str, Any] | None = None,
        scope: MemoryScope = MemoryScope(),
    ) -> list[MemoryHit]:
        """The entries matching ``query``, best first."""
        async with self.open(namespace, name, scope) as memory:
            return await memory.backend.search(memory.place, query, top_k=top_k, filters=filters)
