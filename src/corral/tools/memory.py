"""The memory tools: ``memory_write``, ``memory_read``, ``memory_search``, ``memory_list``,
``memory_delete`` and ``memory_ingest``, over the Memories an Agent names in ``spec.memory``.

They are governed like every other tool (:mod:`corral.tools.governance`: schema,
approval, timeout, output cap, redaction). Their permissions are checked on the
Memory and operation a call names, as ``memory:NAME/OP`` (``by_target``): a
ToolPermission glob such as ``memory:notes/*`` allows or denies them for an agent
with roles. A Memory the agent may only read is refused to ``memory_write``,
``memory_delete`` and ``memory_ingest`` before anything else (``permission_denied``);
an agent with no writable Memory has none of them.

A write is idempotent by the call: its idempotency key is the call's own (run, step,
call index) with a digest of its arguments, and the backend writes an entry under a
key it has seen once only, so a replayed run never writes twice. Text and metadata
are redacted (every secret the agent resolved) before they are stored.

A write or ingest is journaled in the run's events as ``memory.write``, a search as
``memory.search`` (:attr:`ToolContext.journal`): keys and counts, and of the text or
query only a short preview, redacted. A call that embedded (a Memory with
``spec.embedding``) adds ``usage`` and ``cost_usd`` to its event: the engine charges
them to the run's budget and a replay counts them from the journal (a replayed write
embeds nothing and charges nothing).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from corral.core.chunking import MAX_INGEST_CHARS
from corral.core.errors import ToolError, ToolErrorCode
from corral.core.events import MemorySearchData, MemoryWriteData
from corral.core.ids import new_id
from corral.core.memory import (
    MAX_KEY_CHARS,
    EmbeddingSpend,
    MemoryBackendError,
    MemoryEntry,
    MemoryInputError,
    MemoryPlace,
    MemoryScope,
)
from corral.core.messages import ToolSpec, dump
from corral.core.redaction import Redactor
from corral.resources.memory import MemoryAccessLevel, MemorySpec
from corral.store.base import Store
from corral.tools.base import Tool, ToolContext
from corral.tools.memory_backend import MemoryBackend
from corral.tools.memory_ingest import MAX_PREFIX_CHARS, ingest_text

#: the prefix of a memory tool's permission ref: ``memory:NAME/OP``
MEMORY_PREFIX = "memory:"
#: the longest search query a call may send (characters)
MAX_QUERY_CHARS = 2000
#: the most results one search call asks for
MAX_TOP_K = 20

#: the characters of a written text or a query a memory event shows
EVENT_PREVIEW_CHARS = 80

#: the tool error of each code of a remote backend's failure (MemoryBackendError)
_BACKEND_CODES: Mapping[str, ToolErrorCode] = {
    "memory_backend_unavailable": ToolErrorCode.UNAVAILABLE,
    "memory_backend_timeout": ToolErrorCode.TIMEOUT,
    "memory_backend_blocked": ToolErrorCode.BLOCKED_DESTINATION,
}

Operation = Literal["write", "read", "search", "list", "delete", "ingest"]
_WRITES: frozenset[str] = frozenset({"write", "delete", "ingest"})


@dataclass(frozen=True)
class MemoryBinding:
    """One Memory an agent uses: its spec, the agent's access to it, and the backend
    holding its entries (:func:`corral.tools.memory_backend.open_memory_backend`)."""

    name: str
    spec: MemorySpec
    access: MemoryAccessLevel
    backend: MemoryBackend


_KEY = {"type": "string", "minLength": 1, "maxLength": MAX_KEY_CHARS}
_FILTER = {
    "type": "object",
    "description": "only entries whose metadata has each of these keys equal to its value",
    "additionalProperties": {"type": ["string", "number", "boolean", "null"]},
}

_DESCRIPTIONS: Mapping[str, str] = {
    "write": (
        "Remember a text for later runs. Give a key to replace what that key held; "
        "metadata (flat: strings, numbers, booleans) can be used to filter searches."
    ),
    "read": "Read the whole text of one remembered entry, by its key.",
    "search": (
        "Search what was remembered by words; results are best first, each with its key, "
        "a score and a preview (read the key for the whole text)."
    ),
    "list": "List remembered entries by key (those starting with prefix), a page at a time.",
    "delete": "Forget one remembered entry, by its key.",
    "ingest": (
        "Remember a long text (a document): it is cut into chunks, each one entry with "
        "metadata source and chunk; key_prefix names them (KEY_PREFIX#0, #1, ...)."
    ),
}

_PROPERTIES: Mapping[str, dict[str, Any]] = {
    "write": {
        "text": {"type": "string", "minLength": 1},
        "key": _KEY,
        "metadata": {
            "type": "object",
            "additionalProperties": {"type": ["string", "number", "boolean", "null"]},
        },
    },
    "read": {"key": _KEY},
    "search": {
        "query": {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_CHARS},
        "top_k": {"type": "integer", "minimum": 1, "maximum": MAX_TOP_K, "default": 5},
        "filter": _FILTER,
    },
    "list": {
        "prefix": {"type": "string", "maxLength": MAX_KEY_CHARS},
        "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
        "cursor": {"type": "string", "maxLength": MAX_KEY_CHARS, "description": "next_cursor"},
    },
    "delete": {"key": _KEY},
    "ingest": {
        "text": {"type": "string", "minLength": 1, "maxLength": MAX_INGEST_CHARS},
        "key_prefix": {"type": "string", "minLength": 1, "maxLength": MAX_PREFIX_CHARS},
        "metadata": {
            "type": "object",
            "additionalProperties": {"type": ["string", "number", "boolean", "null"]},
        },
    },
}
_REQUIRED: Mapping[str, list[str]] = {
    "write": ["text"],
    "read": ["key"],
    "search": ["query"],
    "list": [],
    "delete": ["key"],
    "ingest": ["text"],
}


class MemoryTool(Tool):
    """One memory operation over the agent's Memories (the ``memory`` argument picks one;
    it may be left out when the agent has just one)."""

    by_target: ClassVar[bool] = True
    # a write is made once per call (its idempotency key), a delete twice is a delete
    idempotent = True

    def __init__(
        self,
        operation: Operation,
        memories: Sequence[MemoryBinding],
        store: Store,
        redactor: Callable[[], Redactor],
    ) -> None:
        self.operation = operation
        self.memories = {m.name: m for m in memories}
        self.store = store
        self.redactor = redactor
        self.ref = f"memory_{operation}"
        names = sorted(self.memories)
        properties = {"memory": {"type": "string", "enum": names}, **_PROPERTIES[operation]}
        required = list(_REQUIRED[operation]) + ([] if len(names) == 1 else ["memory"])
        self.spec = ToolSpec(
            name=self.ref,
            description=f"{_DESCRIPTIONS[operation]} Memories: {', '.join(names)}.",
            parameters={
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        )

    def _memory(self, arguments: dict[str, Any]) -> MemoryBinding:
        name = arguments.get("memory")
        if name is None:
            if len(self.memories) != 1:
                raise ToolError(ToolErrorCode.INVALID_INPUT, "name the memory to use")
            return next(iter(self.memories.values()))
        binding = self.memories.get(str(name))
        if binding is None:
            known = ", ".join(sorted(self.memories))
            raise ToolError(
                ToolErrorCode.PERMISSION_DENIED,
                f"memory {name!r} is not one of this agent's (its memories: {known})",
            )
        return binding

    def targets(self, arguments: dict[str, Any]) -> Sequence[str]:
        binding = self._memory(arguments)
        if self.operation in _WRITES and binding.access != "write":
            raise ToolError(
                ToolErrorCode.PERMISSION_DENIED,
                f"this agent may only read memory {binding.name!r}",
            )
        return (f"{MEMORY_PREFIX}{binding.name}/{self.operation}",)

    async def _place(self, binding: MemoryBinding, ctx: ToolContext) -> MemoryPlace:
        session = system_run = None
        if binding.spec.scope in ("session", "system_run"):
            run = await self.store.get_run(ctx.run_id)
            if run is not None:
                session = run.session_id
                # the node runs of one system run share its entries (keyed by its id)
                if run.is_system_run:
                    system_run = run.id
                elif run.system is not None and run.branch_id is not None:
                    system_run = run.parent_run_id
        whose = MemoryScope(agent=ctx.agent, session=session, system_run=system_run)
        return whose.place_in(ctx.namespace, binding.name, binding.spec.scope)

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        binding = self._memory(arguments)
        spend = EmbeddingSpend()
        try:
            place = await self._place(binding, ctx)
            operation = getattr(self, f"_{self.operation}")
            return await operation(binding, place, arguments, ctx, spend)
        except MemoryInputError as exc:
            self._journal_failed(ctx, binding, spend, "invalid_memory_input")
            raise ToolError(ToolErrorCode.INVALID_INPUT, str(exc)) from None
        except MemoryBackendError as exc:
            # embeddings paid before the failure (a refused answer, an ingest's earlier
            # batches) are the run's all the same
            self._journal_failed(ctx, binding, spend, exc.code)
            # a remote backend's failure, said as the tool's (its message holds no secret)
            raise ToolError(
                _BACKEND_CODES.get(exc.code, ToolErrorCode.EXECUTION_FAILED),
                exc.message,
                retryable=exc.retryable,
                details={"memory_backend": exc.code},
            ) from None

    def _journal_failed(
        self, ctx: ToolContext, binding: MemoryBinding, spend: EmbeddingSpend, code: str
    ) -> None:
        """The event of a call that failed after paying for embeddings: what it cost, and
        why it failed (nothing when it paid nothing)."""
        if not spend:
            return
        kind = MemorySearchData if self.operation == "search" else MemoryWriteData
        ctx.journal.append(kind(memory=binding.name, failed=code, **_charged(spend)))

    def _redacted(self, arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """A write's text and metadata with every secret the agent saw redacted: no secret
        is ever stored in a memory."""
        redact = self.redactor()
        text = str(arguments["text"])
        metadata = dict(arguments.get("metadata") or {})
        if redact:
            text = redact.text(text)
            metadata = redact.data(metadata)
        return text, metadata

    def _redacted_key(self, key: Any) -> str | None:
        """A key (or key prefix) the agent chose, with every secret it saw redacted: a key
        is stored, listed and journaled as much as a text is."""
        if key is None:
            return None
        redact = self.redactor()
        return redact.text(str(key)) if redact else str(key)

    async def _write(
        self,
        binding: MemoryBinding,
        place: MemoryPlace,
        arguments: dict[str, Any],
        ctx: ToolContext,
        spend: EmbeddingSpend,
    ) -> Any:
        text, metadata = self._redacted(arguments)
        key = self._redacted_key(arguments.get("key"))
        entry = MemoryEntry(
            place.namespace,
            place.memory,
            place.scope_key,
            key if key is not None else new_id("mem"),
            text,
            metadata,
            idempotency_key=write_key(ctx, arguments),
        )
        # a replayed call finds the entry its first run wrote, and says the same
        stored, fresh = await binding.backend.write(entry, spend=spend)
        _journal_write(ctx, binding, text, spend, key=stored.key, written=fresh)
        return {"memory": binding.name, "key": stored.key, "stored": True}

    async def _read(
        self,
        binding: MemoryBinding,
        place: MemoryPlace,
        arguments: dict[str, Any],
        ctx: ToolContext,
        spend: EmbeddingSpend,
    ) -> Any:
        key = str(arguments["key"])
        entry = await binding.backend.read(place, key)
        if entry is None:
            return {"memory": binding.name, "key": key, "found": False}
        return {
            "memory": binding.name,
            "key": key,
            "found": True,
            "text": entry.text,
            "metadata": entry.metadata,
            "updated_at": entry.updated_at,
        }

    async def _search(
        self,
        binding: MemoryBinding,
        place: MemoryPlace,
        arguments: dict[str, Any],
        ctx: ToolContext,
        spend: EmbeddingSpend,
    ) -> Any:
        hits = await binding.backend.search(
            place,
            str(arguments["query"]),
            top_k=int(arguments.get("top_k", 5)),
            filters=arguments.get("filter"),
            spend=spend,
        )
        query = str(arguments["query"])
        ctx.journal.append(
            MemorySearchData(
                memory=binding.name, query=_short(query), hits=len(hits), **_charged(spend)
            )
        )
        results = [
            {
                "key": hit.entry.key,
                "score": round(hit.score, 6),
                "signals": list(hit.signals),
                "preview": hit.entry.preview(),
                "metadata": hit.entry.metadata,
            }
            for hit in hits
        ]
        return {"memory": binding.name, "results": results}

    async def _list(
        self,
        binding: MemoryBinding,
        place: MemoryPlace,
        arguments: dict[str, Any],
        ctx: ToolContext,
        spend: EmbeddingSpend,
    ) -> Any:
        limit = int(arguments.get("limit", 20))
        entries = await binding.backend.list_entries(
            place,
            prefix=str(arguments.get("prefix", "")),
            limit=limit,
            after=arguments.get("cursor"),
        )
        return {
            "memory": binding.name,
            "entries": [
                {"key": e.key, "preview": e.preview(), "metadata": e.metadata} for e in entries
            ],
            "next_cursor": entries[-1].key if len(entries) == limit else None,
        }

    async def _delete(
        self,
        binding: MemoryBinding,
        place: MemoryPlace,
        arguments: dict[str, Any],
        ctx: ToolContext,
        spend: EmbeddingSpend,
    ) -> Any:
        key = str(arguments["key"])
        deleted = await binding.backend.delete(place, key)
        return {"memory": binding.name, "key": key, "deleted": deleted}

    async def _ingest(
        self,
        binding: MemoryBinding,
        place: MemoryPlace,
        arguments: dict[str, Any],
        ctx: ToolContext,
        spend: EmbeddingSpend,
    ) -> Any:
        text, metadata = self._redacted(arguments)
        key = write_key(ctx, arguments)
        # no prefix given: one derived from the call, the same on a replay
        prefix = (
            self._redacted_key(arguments.get("key_prefix") or None)
            or "ingest-" + hashlib.sha256(key.encode()).hexdigest()[:12]
        )
        source = metadata.pop("source", None)
        done = await ingest_text(
            binding.backend,
            place,
            binding.spec,
            text,
            source=str(source) if source is not None else f"run {ctx.run_id}",
            key_prefix=str(prefix),
            idempotency_key=key,
            metadata=metadata,
            spend=spend,
        )
        _journal_write(
            ctx, binding, text, spend, key_prefix=prefix, chunks=done.chunks, written=done.written
        )
        return {
            "memory": binding.name,
            "key_prefix": prefix,
            "chunks": done.chunks,
            "keys": done.keys[:20],
        }


def _short(text: str) -> str:
    """The start of a text or query for an event (never the whole of a long one)."""
    flat = " ".join(text.split())
    if len(flat) <= EVENT_PREVIEW_CHARS:
        return flat
    return flat[: EVENT_PREVIEW_CHARS - 1] + "\u2026"


def write_key(ctx: ToolContext, arguments: dict[str, Any]) -> str:
    """The idempotency key of a write: the call's own key (the same on every replay) and a
    digest of its arguments, so that a model asked again after a crash, and answering
    differently, still gets its new text written."""
    digest = hashlib.sha256(
        json.dumps(arguments, sort_keys=True, ensure_ascii=False).encode()
    ).hexdigest()[:16]
    key = f"{ctx.idempotency_key}:{digest}"
    return key if len(key) <= 255 else "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def memory_tools(
    memories: Sequence[MemoryBinding], store: Store, redactor: Callable[[], Redactor]
) -> list[Tool]:
    """The memory tools of an agent with ``memories`` (none without): the reading ones
    always, ``memory_write``, ``memory_delete`` and ``memory_ingest`` when one of them
    is writable."""
    if not memories:
        return []
    operations: list[Operation] = ["search", "read", "list"]
    if any(m.access == "write" for m in memories):
        operations += ["write", "delete", "ingest"]
    return [MemoryTool(op, memories, store, redactor) for op in operations]


def _journal_write(
    ctx: ToolContext, binding: MemoryBinding, text: str, spend: EmbeddingSpend, **fields: Any
) -> None:
    """The call's ``memory.write`` event: a short preview of the (redacted) text, never all,
    and what embedding it cost."""
    ctx.journal.append(
        MemoryWriteData(
            memory=binding.name,
            **fields,
            preview=_short(text),
            chars=len(text),
            **_charged(spend),
        )
    )


def _charged(spend: EmbeddingSpend) -> dict[str, Any]:
    """An event's ``usage`` and ``cost_usd`` (what the run is charged for the call's
    embeddings; the engine charges what a journaled event carries), or nothing."""
    if not spend:
        return {}
    return {"usage": dump(spend.usage), "cost_usd": spend.cost_usd}
