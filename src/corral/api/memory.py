"""Memory entries over the API: what a write and a search take, and what they answer."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self, cast

from pydantic import BaseModel, Field

from corral.api.common import (
    FromRecord,
    Id,
    JsonObject,
    Name,
    Request,
    SessionId,
    Text,
    Timestamp,
)
from corral.core.chunking import MAX_INGEST_CHARS
from corral.core.memory import (
    MAX_KEY_CHARS,
    MAX_RESULTS,
    MemoryEntry,
    MemoryHit,
    MemoryScope,
    MemoryStats,
)

Key = Annotated[str, Field(min_length=1, max_length=MAX_KEY_CHARS, pattern=r"^[^\x00-\x1f]+$")]


#: what each field of a :class:`MemoryScope` names, in a body and in a query alike
SCOPE_HELP: dict[str, str] = {
    "agent": "The agent's entries (scope agent).",
    "session": "The session's (scope session).",
    "system_run": "The agent system run's, by its id (scope system_run).",
}


class _Scoped(Request):
    """A body naming whose entries: a :class:`MemoryScope`'s fields, flat in the body."""

    agent: Name | None = Field(default=None, description=SCOPE_HELP["agent"])
    session: SessionId | None = Field(default=None, description=SCOPE_HELP["session"])
    system_run: Id | None = Field(default=None, description=SCOPE_HELP["system_run"])

    @property
    def scope(self) -> MemoryScope:
        return MemoryScope(self.agent, self.session, self.system_run)


class MemoryWriteRequest(_Scoped):
    """One entry to write (the entry of ``key`` is replaced; a new key without one)."""

    text: Text = Field(min_length=1)
    key: Key | None = None
    metadata: JsonObject = Field(default_factory=dict[str, Any])


class MemoryIngestRequest(_Scoped):
    """A long text to cut by the Memory's ``spec.chunking``, each chunk one entry
    ``KEY_PREFIX#N`` with metadata ``source``, ``chunk`` and ``chunks``."""

    text: Text = Field(min_length=1, max_length=MAX_INGEST_CHARS)
    source: str = Field(default="api", min_length=1, max_length=1000)
    key_prefix: Key | None = Field(default=None, description="The entries' keys' start.")
    metadata: JsonObject = Field(default_factory=dict[str, Any])


class MemoryIngestOut(BaseModel):
    key_prefix: str
    chunks: int
    written: int = Field(description="Chunks written now (the others were written before).")
    keys: list[str]


class MemorySearchRequest(_Scoped):
    query: Text = Field(min_length=1, max_length=2000)
    top_k: int = Field(default=5, ge=1, le=MAX_RESULTS)
    filter: JsonObject = Field(
        default_factory=dict[str, Any], description="Metadata keys and the values they must equal."
    )


class MemoryEntryOut(FromRecord):
    key: str
    text: str
    metadata: dict[str, Any]
    scope_key: str = Field(
        description="The agent, session or system run whose entry it is ('' for all)."
    )
    created_at: Timestamp
    updated_at: Timestamp

    @classmethod
    def from_entry(cls, entry: MemoryEntry) -> Self:
        return cls.model_validate(entry)


class MemoryEntryPage(BaseModel):
    items: list[MemoryEntryOut]
    next_cursor: str | None


#: a search that found an entry
Signal = Literal["fulltext", "vector"]


class MemoryHitOut(BaseModel):
    key: str
    score: float = Field(
        description=(
            "Higher is better: the full-text relevance (the backend's scale), or for a Memory "
            "with an embedding model the reciprocal rank fusion of full text and vectors."
        )
    )
    signals: list[Signal] = Field(
        default_factory=lambda: list[Signal](["fulltext"]),
        description="Which searches found the entry.",
    )
    preview: str
    metadata: dict[str, Any]

    @classmethod
    def from_hit(cls, hit: MemoryHit) -> Self:
        entry = hit.entry
        return cls(
            key=entry.key,
            score=hit.score,
            signals=[cast(Signal, signal) for signal in hit.signals],
            preview=entry.preview(),
            metadata=entry.metadata,
        )


class MemorySearchResult(BaseModel):
    items: list[MemoryHitOut]


class MemoryStatsOut(FromRecord):
    """What a Memory holds (every scope) and how it is searched."""

    entries: int
    text_chars: int = Field(description="The size of the entries' text, in characters.")
    scopes: int = Field(description="How many agents or sessions (or the namespace) have entries.")
    index: str
    vectors: int = Field(default=0, description="Entries with a vector (an embedding model).")

    @classmethod
    def from_stats(cls, stats: MemoryStats) -> Self:
        return cls.model_validate(stats)
