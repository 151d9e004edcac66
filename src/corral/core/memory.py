"""Memory entries: the records a Memory keeps, and the checks every entry passes.

An entry lives at a :class:`MemoryPlace` - a namespace, a Memory of it, and a scope
key (``""`` for a namespace-wide Memory, the agent's name or the session id for the
narrower scopes) - under a key unique there. Its text is searched by full text; its
metadata is a flat JSON object of scalars, matched by equality in search filters.
"""

from __future__ import annotations

import dataclasses
import math
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

from corral.core.errors import CorralError, NotFoundError, UserError
from corral.core.messages import Embeddings, Usage

#: the longest text one entry may hold (characters): longer texts are refused, not cut
MAX_ENTRY_CHARS = 16_000
#: the longest key (characters)
MAX_KEY_CHARS = 255
#: how many metadata keys an entry may have, and how long a string value may be
MAX_METADATA_KEYS = 32
MAX_METADATA_VALUE_CHARS = 1000
#: the integers metadata may hold: a signed 64-bit one (what SQLite binds and compares)
MAX_METADATA_INT = 2**63 - 1
#: how many words of a search query are used (the rest are ignored)
MAX_QUERY_TERMS = 32
#: the most results one search or listing returns
MAX_RESULTS = 100
#: the characters of an entry shown in a search or listing result
PREVIEW_CHARS = 240

_METADATA_KEY = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Words as both full-text engines see them: letters and digits of any script.
_WORD = re.compile(r"[^\W_]+")

Scalar = str | int | float | bool | None


class MemoryInputError(UserError):
    """An entry, key, query or filter a Memory cannot take (too long, malformed)."""

    code = "invalid_memory_input"


class MemoryEntryNotFoundError(NotFoundError):
    """A Memory that exists has no entry of a key (404 ``memory_entry_not_found`` over
    the API; a missing Memory is plain ``not_found``)."""

    code = "memory_entry_not_found"


class MemoryBackendError(CorralError):
    """A Memory's remote backend (``backend: http``) failed. ``code`` says how, stably:

    - ``memory_backend_unavailable``: no connection, or it answered 408, 429 or 5xx
      (``retryable``);
    - ``memory_backend_timeout``: no whole answer within the Memory's timeout (``retryable``);
    - ``memory_backend_refused``: it refused the request (401, 403, 404, another 4xx);
    - ``memory_backend_bad_answer``: an answer the contract does not allow (not JSON,
      the wrong shape or version, too large, a redirect);
    - ``memory_backend_blocked``: the SSRF guard refused its URL;
    - ``memory_backend_unconfigured``: it cannot be opened in this process (its auth
      secret cannot be read here).
    """

    code = "memory_backend_error"
    CODES = frozenset(
        {
            "memory_backend_unavailable",
            "memory_backend_timeout",
            "memory_backend_refused",
            "memory_backend_bad_answer",
            "memory_backend_blocked",
            "memory_backend_unconfigured",
        }
    )

    def __init__(self, message: str, *, code: str, retryable: bool = False) -> None:
        super().__init__(message)
        assert code in self.CODES, code
        self.code = code
        self.retryable = retryable

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "retryable": self.retryable}


@dataclass
class EmbeddingSpend:
    """What the embeddings of one operation cost (tokens, requests, US dollars): a
    memory tool's call charges it to its run (:mod:`corral.tools.memory`)."""

    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0

    def add(self, embeddings: Embeddings) -> None:
        self.usage = self.usage + embeddings.usage
        self.cost_usd += embeddings.cost_usd

    def __bool__(self) -> bool:
        return self.usage.requests > 0 or self.usage.total_tokens > 0 or self.cost_usd > 0


@dataclass(frozen=True)
class MemoryPlace:
    """Where entries live: a namespace's Memory, and the scope key within it."""

    namespace: str
    memory: str
    scope_key: str = ""


@dataclass(frozen=True)
class MemoryEntry:
    """One stored entry. ``idempotency_key`` is the tool call that wrote it last: a
    write with a key already stored is not made again."""

    namespace: str
    memory: str
    scope_key: str
    key: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict[str, Any])
    idempotency_key: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0

    @property
    def place(self) -> MemoryPlace:
        return MemoryPlace(self.namespace, self.memory, self.scope_key)

    def preview(self) -> str:
        """The start of the text, for results (the whole text is one ``read`` away)."""
        if len(self.text) <= PREVIEW_CHARS:
            return self.text
        return self.text[: PREVIEW_CHARS - 1] + "\u2026"


#: the signals a search result can be found by
FULLTEXT = "fulltext"
VECTOR = "vector"
#: reciprocal rank fusion's constant (Cormack et al. 2009): a hit ranked r by one signal
#: adds 1 / (RRF_K + r); large enough that no single first place outweighs agreement
RRF_K = 60


@dataclass(frozen=True)
class MemoryHit:
    """A search result: the entry, its score (higher is better) and the signals that
    found it. Without vectors the score is the full-text relevance (the backend's scale:
    BM25 over the scope on the SQL stores); a hybrid search's score is the reciprocal
    rank fusion of the signals (:func:`fuse`)."""

    entry: MemoryEntry
    score: float
    signals: tuple[str, ...] = (FULLTEXT,)


@dataclass(frozen=True)
class MemoryVector:
    """An embedding with the model that made it (``embedder``: its endpoint and
    dimensions): vectors of another embedder are never compared with it."""

    embedder: str
    values: list[float]

    @property
    def dimensions(self) -> int:
        return len(self.values)


def embedder_id(endpoint: str, dimensions: int) -> str:
    """How a Memory's embedding model is named on its vectors."""
    return f"{endpoint}/{dimensions}"


def fuse(rankings: dict[str, list[MemoryHit]], top_k: int, k: int = RRF_K) -> list[MemoryHit]:
    """Reciprocal rank fusion of each signal's ranking (best first): an entry scores the
    sum of ``1 / (k + rank)`` over the signals that found it (rank 1 is the best) and
    carries those signals. Ties go to the entry written last, then by key."""
    scores: dict[tuple[str, str], float] = {}
    found: dict[tuple[str, str], tuple[MemoryEntry, list[str]]] = {}
    for signal, hits in rankings.items():
        for rank, hit in enumerate(hits, start=1):
            ident = (hit.entry.scope_key, hit.entry.key)
            scores[ident] = scores.get(ident, 0.0) + 1.0 / (k + rank)
            signals = found.setdefault(ident, (hit.entry, []))[1]
            signals.append(signal)
    order = sorted(scores, key=lambda i: (-scores[i], -found[i][0].updated_at, found[i][0].key))
    return [MemoryHit(found[i][0], scores[i], tuple(sorted(found[i][1]))) for i in order[:top_k]]


@dataclass(frozen=True)
class MemoryStats:
    """What a Memory holds, all scopes together, and how its entries are searched."""

    entries: int
    text_chars: int
    scopes: int
    index: str
    #: how many entries have a vector (a Memory with an embedding model)
    vectors: int = 0


class ScopeFields(TypedDict, total=False):
    """A :class:`MemoryScope` on the wire: the query parameters and body fields of the
    memory routes, and the keyword arguments of the client's memory methods (a name
    left out is not given)."""

    agent: str
    session: str
    system_run: str


@dataclass(frozen=True)
class MemoryScope:
    """Whose entries an operation on a Memory sees: the ``agent``, the ``session`` or
    the agents of one ``system_run`` (its id). Which one counts is the Memory's scope
    (:meth:`place_in`); a namespace-wide Memory needs none. Every front door carries
    this one value, so the three names are spelled, checked and sent in one place."""

    agent: str | None = None
    session: str | None = None
    system_run: str | None = None

    def query(self) -> list[tuple[str, str]]:
        """Its wire form: the names given and their values (``None`` is not sent)."""
        given = dataclasses.asdict(self).items()
        return [(name, value) for name, value in given if value is not None]

    def fields(self) -> ScopeFields:
        """Its wire form as body fields (or a client method's keyword arguments)."""
        return cast(ScopeFields, dict(self.query()))

    def place_in(self, namespace: str, memory: str, scope: str) -> MemoryPlace:
        """Where a Memory of ``scope`` keeps these entries: ``MemoryInputError`` when the
        scope needs the one not given."""
        if scope == "namespace":
            return MemoryPlace(namespace, memory)
        needed = dataclasses.asdict(self)
        if scope not in needed:
            raise MemoryInputError(f"memory {memory!r} has an unknown scope {scope!r}")
        owner = needed[scope]
        if not owner:
            why = {
                "session": " (this run has no session)",
                "system_run": " (this run is not part of an agent system's run)",
            }
            raise MemoryInputError(
                f"memory {memory!r} is kept per {scope}, and no {scope} was given"
                + why.get(scope, "")
            )
        return MemoryPlace(namespace, memory, owner)


def _storable(text: str, what: str) -> str:
    """``text`` if both databases can store it: no NUL (PostgreSQL refuses it), no lone
    surrogate (not UTF-8 at all)."""
    if "\x00" in text:
        raise MemoryInputError(f"{what} cannot hold a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise MemoryInputError(f"{what} is not valid Unicode (a lone surrogate)") from None
    return text


def check_key(key: str) -> str:
    """``key`` if usable as an entry key, else :class:`MemoryInputError`."""
    if not key or len(key) > MAX_KEY_CHARS:
        raise MemoryInputError(f"a memory key has 1 to {MAX_KEY_CHARS} characters")
    if any(ord(c) < 32 for c in key):
        raise MemoryInputError("a memory key has no control characters")
    return _storable(key, "a memory key")


def check_text(text: str) -> str:
    """``text`` if it fits in one entry, else :class:`MemoryInputError` saying the cap."""
    if not text.strip():
        raise MemoryInputError("a memory entry needs some text")
    if len(text) > MAX_ENTRY_CHARS:
        raise MemoryInputError(
            f"a memory entry holds at most {MAX_ENTRY_CHARS} characters, not {len(text)}: "
            "write it as several entries"
        )
    return _storable(text, "a memory entry")


def check_metadata(metadata: dict[str, Any], *, what: str = "metadata") -> dict[str, Scalar]:
    """A flat object of scalars with plain keys (filters compare them by equality)."""
    if len(metadata) > MAX_METADATA_KEYS:
        raise MemoryInputError(f"{what} has at most {MAX_METADATA_KEYS} keys")
    for key, value in metadata.items():
        if not isinstance(key, str) or not _METADATA_KEY.match(key):
            raise MemoryInputError(
                f"{what} key {key!r} must be 1 to 64 letters, digits, '_' or '-'"
            )
        if value is not None and not isinstance(value, str | int | float | bool):
            raise MemoryInputError(f"{what} value of {key!r} must be a string, number or boolean")
        if isinstance(value, str) and len(value) > MAX_METADATA_VALUE_CHARS:
            raise MemoryInputError(
                f"{what} value of {key!r} is longer than {MAX_METADATA_VALUE_CHARS} characters"
            )
        if isinstance(value, str):
            _storable(value, f"{what} value of {key!r}")
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and not -MAX_METADATA_INT - 1 <= value <= MAX_METADATA_INT
        ):
            raise MemoryInputError(f"{what} value of {key!r} is not a 64-bit integer")
        if isinstance(value, float) and not math.isfinite(value):
            raise MemoryInputError(f"{what} value of {key!r} is not a finite number")
    return dict(metadata)


def query_terms(query: str) -> list[str]:
    """The words of a search query, lower-cased, at most :data:`MAX_QUERY_TERMS`.

    Only words reach the full-text engines, each as a plain term: quotes, operators
    (``AND``, ``NEAR``, ``*``, ``:``, ``!``) and other syntax in a query are never
    read as query syntax, so no query is malformed. A result matches any of the
    words; the ranking favours those that match more, and rarer, words.
    """
    terms: list[str] = []
    # composed (NFC): an accent typed as a combining mark is part of its word, not a break
    for word in _WORD.findall(unicodedata.normalize("NFC", query)):
        lowered = word.lower()
        if lowered not in terms:
            terms.append(lowered)
        if len(terms) == MAX_QUERY_TERMS:
            break
    return terms
