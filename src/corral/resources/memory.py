"""The ``Memory`` kind's spec, and the ``memory`` entries of an Agent.

A Memory is a store of text entries agents write and search across runs. Its
``backend`` says where they live: ``store`` (the Corral store itself: SQLite embedded,
PostgreSQL in scale-out, with full-text search) or ``http`` (a remote memory service
speaking the contract of docs/memory-http.md, at ``spec.http.url``). ``embedding``
(store backend) names a ModelEndpoint that embeds (a reference, checked at apply) and
the dimensions of its vectors: entries are embedded when written and the query when
searched, and search is hybrid (full text and vectors, fused).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from corral.core.addresses import url_problem
from corral.resources.http_auth import HttpAuth
from corral.resources.spec import Spec

_NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"

#: who shares a Memory's entries: every agent of the namespace, each agent on its own,
#: or the runs of one session
MemoryScope = Literal["namespace", "agent", "session", "system_run"]
MemoryAccessLevel = Literal["read", "write"]


class Chunking(Spec):
    """How long texts are cut into entries (for ingestion; in characters)."""

    size: int = Field(default=1000, ge=100, le=100_000)
    overlap: int = Field(default=200, ge=0)

    @model_validator(mode="after")
    def _overlap_below_size(self) -> Chunking:
        if self.overlap >= self.size:
            raise ValueError("'overlap' must be smaller than 'size'")
        return self


class Retention(Spec):
    """What a Memory keeps, per scope (each agent's, each session's entries): at most
    ``max_entries`` (the most recently written), none older than ``max_age_days``."""

    max_entries: int | None = Field(default=None, ge=1)
    max_age_days: float | None = Field(default=None, gt=0)


#: the longest vector a Memory takes (pgvector's limit for an indexed vector is 2000,
#: its storage limit 16000; the largest common embedding models answer 3072)
MAX_DIMENSIONS = 16_000


class EmbeddingSettings(Spec):
    """The embedding model of a Memory and the length of its vectors (fixed: a model
    answering another length is an error, and nothing is written)."""

    model: Annotated[str, Field(pattern=_NAME_PATTERN, description="A ModelEndpoint that embeds.")]
    dimensions: int = Field(ge=1, le=MAX_DIMENSIONS)


class MemoryHttp(Spec):
    """Where a Memory of ``backend: http`` keeps its entries: a remote memory service
    (docs/memory-http.md), called past the SSRF guard like an ``http`` Tool.

    ``url`` is checked when applied (http or https, a host, no credentials, and unless
    ``allow_private`` no loopback, private or metadata address); every call checks it
    again, resolving its name, and goes to the checked address.
    """

    # Declared before ``url`` so that the url's validator can read it.
    allow_private: bool = Field(
        default=False,
        description=(
            "reach the loopback, link-local and private destinations that the operator lists "
            "in CORRAL_ALLOWED_PRIVATE_DESTINATIONS (no others)"
        ),
    )
    url: str = Field(description="the service's base URL (each operation is a path under it)")
    auth: HttpAuth | None = None
    timeout_seconds: float = Field(default=10.0, gt=0, le=300)

    @field_validator("url")
    @classmethod
    def _callable_url(cls, url: str, info: ValidationInfo) -> str:
        if info.context is not None and info.context.get("stored"):
            return url
        problem = url_problem(url, allow_private=info.data.get("allow_private") is True)
        if problem is not None:
            raise ValueError(problem)
        return url


class MemorySpec(Spec):
    """A memory agents write to and search (``Agent.spec.memory``)."""

    backend: Literal["store", "http"] = Field(
        default="store",
        description=(
            "store: entries in the Corral store (SQLite or PostgreSQL, full-text search); "
            "http: a remote memory service (spec.http)"
        ),
    )
    http: MemoryHttp | None = None
    scope: MemoryScope = "namespace"
    embedding: EmbeddingSettings | None = Field(
        default=None,
        description="embed entries and queries with this model: hybrid search (else full text)",
    )
    chunking: Chunking = Field(default_factory=Chunking)
    retention: Retention = Field(default_factory=Retention)

    @model_validator(mode="after")
    def _http_for_http(self) -> MemorySpec:
        if self.backend == "http" and self.http is None:
            raise ValueError("backend 'http' needs an 'http' block (url, auth, timeout_seconds)")
        if self.backend != "http" and self.http is not None:
            raise ValueError("'http' is for backend 'http' only")
        return self

    @model_validator(mode="before")
    @classmethod
    def _not_built_yet(cls, data: Any) -> Any:
        # Planned fields get a reason, not pydantic's bare "extra inputs are not permitted".
        if (
            isinstance(data, dict)
            and data.get("backend") == "http"
            and data.get("embedding") is not None
        ):
            raise ValueError(
                "'embedding' is for backend 'store': an http memory service searches "
                "its entries itself"
            )
        return data


class MemoryAccess(Spec):
    """One Memory an Agent may use, and how: ``read`` (search, read, list) or ``write``
    (also write and delete)."""

    ref: Annotated[str, Field(pattern=_NAME_PATTERN)]
    access: MemoryAccessLevel = "read"


def distinct_memories(memories: list[MemoryAccess]) -> list[MemoryAccess]:
    """``memories``, refused when one Memory is named twice."""
    seen: set[str] = set()
    for entry in memories:
        if entry.ref in seen:
            raise ValueError(f"memory {entry.ref!r} is named twice")
        seen.add(entry.ref)
    return memories


__all__ = [
    "MAX_DIMENSIONS",
    "Chunking",
    "EmbeddingSettings",
    "MemoryAccess",
    "MemoryAccessLevel",
    "MemoryHttp",
    "MemoryScope",
    "MemorySpec",
    "Retention",
    "distinct_memories",
]
