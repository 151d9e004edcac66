"""The ``http`` memory backend: a Memory's entries kept by a remote memory service that
speaks the contract of ``docs/memory-http.md`` (version 1).

Each operation is ``POST {url}/{operation}`` with a JSON body naming the place
(namespace, memory, scope key); a write carries its idempotency key in the
``Idempotency-Key`` header. Calls go out like an ``http`` Tool's
(:func:`corral.tools.http.send_checked`): past the SSRF guard to the checked address,
no redirects followed, no proxies from the environment, the auth profile's header,
answers read up to :data:`MAX_ANSWER_BYTES`.

Nothing the service answers is trusted: an answer is parsed and checked against the
contract (version, shape, types, entries within the caps of :mod:`corral.core.memory`,
no more results than asked, keys in order and in range), and a service that hangs,
dies, redirects or lies fails the operation with a :class:`MemoryBackendError` of a
stable code - never a traceback. Messages never hold the auth secret: what the
service says back is cut short and redacted.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar

import anyio
import httpx
from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr
from pydantic import ValidationError as PydanticValidationError

from corral.core.errors import ToolError, ToolErrorCode
from corral.core.memory import (
    MAX_RESULTS,
    EmbeddingSpend,
    MemoryBackendError,
    MemoryEntry,
    MemoryHit,
    MemoryInputError,
    MemoryPlace,
    MemoryStats,
    check_key,
    check_metadata,
    check_text,
)
from corral.core.redaction import Redactor
from corral.resources.memory import MemoryHttp, MemorySpec
from corral.tools.http import auth_headers, http_client, send_checked
from corral.tools.ssrf import Resolver, system_resolver

__all__ = ["CONTRACT_VERSION", "MAX_ANSWER_BYTES", "HttpMemoryBackend"]

#: the version of the contract this client speaks (sent, and required back)
CONTRACT_VERSION = 1
#: the largest answer read (a page of 100 entries of 16,000 characters fits)
MAX_ANSWER_BYTES = 8 * 1024 * 1024
#: how much of what the service says about an error a message shows
_SAID_CHARS = 300
_RETRYABLE_STATUS = frozenset({408, 425, 429})

Operation = Literal["write", "read", "list", "delete", "search", "stats", "prune"]


class _Answer(BaseModel):
    # Fields the contract does not name are ignored: a newer service may add some.
    model_config = ConfigDict(extra="ignore", frozen=True)

    version: Literal[1]


A = TypeVar("A", bound=_Answer)


class _Entry(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    key: StrictStr
    text: StrictStr
    metadata: dict[str, Any] = {}
    created_at: StrictFloat | StrictInt = 0.0
    updated_at: StrictFloat | StrictInt = 0.0


class _WriteAnswer(_Answer):
    entry: _Entry
    written: StrictBool


class _ReadAnswer(_Answer):
    entry: _Entry | None


class _ListAnswer(_Answer):
    entries: list[_Entry]


class _DeleteAnswer(_Answer):
    deleted: StrictBool


class _Hit(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    entry: _Entry
    score: StrictFloat | StrictInt


class _SearchAnswer(_Answer):
    hits: list[_Hit]


class _StatsAnswer(_Answer):
    entries: StrictInt
    text_chars: StrictInt
    scopes: StrictInt
    index: StrictStr


class _PruneAnswer(_Answer):
    pruned: StrictInt


class _ErrorBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    code: StrictStr = ""
    message: StrictStr = ""


class _ErrorAnswer(BaseModel):
    model_config = ConfigDict(extra="ignore")

    error: _ErrorBody


def _header_value(key: str) -> str:
    """``key`` as a header can carry it (printable ASCII), else its digest."""
    if key.isascii() and key.isprintable():
        return key
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def _place(place: MemoryPlace) -> dict[str, str]:
    return {"namespace": place.namespace, "memory": place.memory, "scope_key": place.scope_key}


class HttpMemoryBackend:
    """A Memory whose entries a remote service keeps (``backend: http``); see the module
    docstring. One connection pool per backend: :meth:`aclose` releases it."""

    def __init__(
        self,
        name: str,
        spec: MemorySpec,
        secrets: Mapping[str, str],
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        resolver: Resolver = system_resolver,
    ) -> None:
        assert spec.http is not None
        self.name = name
        self.spec = spec
        self._http: MemoryHttp = spec.http
        owner = f"Memory {name!r}"
        self._headers = auth_headers(self._http.auth, secrets, owner=owner)
        # what an error message may never show: the secrets and the headers made of them
        named = {f"secret-{n}": v for n, v in secrets.items()}
        self._redactor = Redactor({**named, **{f"header-{h}": v for h, v in self._headers.items()}})
        if self._http.auth is not None and self._http.auth.type == "basic":
            password = secrets.get(self._http.auth.secret, "").partition(":")[2]
            self._redactor = self._redactor.merged(Redactor({"basic-password": password}))
        self._timeout = self._http.timeout_seconds
        self._transport = transport
        self._resolver = resolver
        self._client: httpx.AsyncClient | None = None

    # ------------------------------------------------------------------ the seam

    # ``spend``: the service embeds (or not) on its own account; nothing is charged here

    async def write_many(
        self, entries: Sequence[MemoryEntry], *, spend: EmbeddingSpend | None = None
    ) -> list[tuple[MemoryEntry, bool]]:
        # the contract writes one entry per request
        return [await self.write(entry) for entry in entries]

    async def write(
        self, entry: MemoryEntry, *, spend: EmbeddingSpend | None = None
    ) -> tuple[MemoryEntry, bool]:
        # refused here as the store refuses it: the service need not be asked
        key, text = check_key(entry.key), check_text(entry.text)
        metadata = check_metadata(dict(entry.metadata))
        retention = self.spec.retention
        body = {
            "place": _place(entry.place),
            "entry": {"key": key, "text": text, "metadata": metadata},
            "retention": {
                "max_entries": retention.max_entries,
                "max_age_days": retention.max_age_days,
            },
        }
        headers = {}
        if entry.idempotency_key:
            headers["Idempotency-Key"] = _header_value(entry.idempotency_key)
        answer = await self._call("write", body, _WriteAnswer, headers=headers)
        stored = self._entry(answer.entry, entry.place)
        if answer.written and stored.key != entry.key:
            raise self._bad("write", f"wrote key {stored.key!r}, not {entry.key!r}")
        return stored, answer.written

    async def read(self, place: MemoryPlace, key: str) -> MemoryEntry | None:
        answer = await self._call("read", {"place": _place(place), "key": key}, _ReadAnswer)
        if answer.entry is None:
            return None
        found = self._entry(answer.entry, place)
        if found.key != key:
            raise self._bad("read", f"answered key {found.key!r} for {key!r}")
        return found

    async def list_entries(
        self, place: MemoryPlace, *, prefix: str = "", limit: int = 20, after: str | None = None
    ) -> list[MemoryEntry]:
        limit = max(1, min(limit, MAX_RESULTS + 1))
        body = {"place": _place(place), "prefix": prefix, "limit": limit, "after": after}
        answer = await self._call("list", body, _ListAnswer)
        if len(answer.entries) > limit:
            raise self._bad("list", f"{len(answer.entries)} entries for a limit of {limit}")
        entries = [self._entry(e, place) for e in answer.entries]
        keys = [e.key for e in entries]
        if any(a >= b for a, b in itertools.pairwise(keys)):
            raise self._bad("list", "entries not in ascending key order")
        if any(not k.startswith(prefix) or (after is not None and k <= after) for k in keys):
            raise self._bad("list", "an entry outside the prefix or the page asked for")
        return entries

    async def delete(self, place: MemoryPlace, key: str) -> bool:
        answer = await self._call("delete", {"place": _place(place), "key": key}, _DeleteAnswer)
        return answer.deleted

    async def search(
        self,
        place: MemoryPlace,
        query: str,
        *,
        top_k: int = 5,
        filters: Mapping[str, Any] | None = None,
        spend: EmbeddingSpend | None = None,
    ) -> list[MemoryHit]:
        top_k = max(1, min(top_k, MAX_RESULTS))
        wanted = check_metadata(dict(filters or {}), what="filter")
        body = {"place": _place(place), "query": query, "top_k": top_k, "filters": wanted}
        answer = await self._call("search", body, _SearchAnswer)
        if len(answer.hits) > top_k:
            raise self._bad("search", f"{len(answer.hits)} hits for top_k {top_k}")
        hits: list[MemoryHit] = []
        for hit in answer.hits:
            entry = self._entry(hit.entry, place)
            score = float(hit.score)
            if not math.isfinite(score):
                raise self._bad("search", "a score that is not a finite number")
            if any(entry.metadata.get(k, _MISSING) != v for k, v in wanted.items()):
                raise self._bad("search", f"hit {entry.key!r} does not match the filter")
            hits.append(MemoryHit(entry, score))
        return hits

    async def stats(self, namespace: str, memory: str) -> MemoryStats:
        body = {"namespace": namespace, "memory": memory}
        answer = await self._call("stats", body, _StatsAnswer)
        if min(answer.entries, answer.text_chars, answer.scopes) < 0:
            raise self._bad("stats", "a negative count")
        # shown on terminals: printable characters only (no escape sequences), and short
        index = "".join(c for c in answer.index if c.isprintable())[:80]
        return MemoryStats(answer.entries, answer.text_chars, answer.scopes, f"http: {index}")

    async def prune(self, place: MemoryPlace, *, now: float | None = None) -> int:
        retention = self.spec.retention
        body = {
            "place": _place(place),
            "retention": {
                "max_entries": retention.max_entries,
                "max_age_days": retention.max_age_days,
            },
            "now": now,
        }
        answer = await self._call("prune", body, _PruneAnswer)
        if answer.pruned < 0:
            raise self._bad("prune", "a negative count")
        return answer.pruned

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    # ------------------------------------------------------------------ the wire

    def _url(self, operation: Operation) -> str:
        return self._http.url.rstrip("/") + "/" + operation

    async def _call(
        self,
        operation: Operation,
        body: dict[str, Any],
        answer_type: type[A],
        *,
        headers: Mapping[str, str] | None = None,
    ) -> A:
        """POST ``body`` to the operation and the answer, checked against ``answer_type``."""
        if self._client is None:
            self._client = http_client(httpx.Timeout(self._timeout), self._transport)
        url = self._url(operation)
        # ASCII: a text the service cannot take arrives as escapes, and is refused there
        content = json.dumps({"version": CONTRACT_VERSION, **body}, ensure_ascii=True)
        sent = {
            "Accept": "application/json",
            "Content-Type": "application/json",
            **self._headers,
            **(headers or {}),
        }
        try:
            # the whole call, a slow trickle of an answer included, within the timeout
            with anyio.fail_after(self._timeout):
                response, raw = await send_checked(
                    self._client,
                    "POST",
                    url,
                    content=content.encode("ascii"),
                    headers=sent,
                    allow_private=self._http.allow_private,
                    resolver=self._resolver,
                    max_bytes=MAX_ANSWER_BYTES,
                )
        except TimeoutError:
            raise self._error(
                "memory_backend_timeout",
                f"{operation}: no answer within {self._timeout:g} s",
                retryable=True,
            ) from None
        except ToolError as exc:
            raise self._from_tool_error(operation, exc) from None
        if not response.is_success:
            raise self._status_error(operation, response, raw)
        try:
            data = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError):
            raise self._bad(operation, "the answer is not JSON") from None
        try:
            return answer_type.model_validate(data)
        except PydanticValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "the answer"
            if where == "version":
                reason = f"contract version {str(data.get('version'))[:20]!r}, not 1"
            else:
                reason = f"{where}: {first.get('msg', 'invalid')}"
            raise self._bad(operation, reason) from None

    def _entry(self, entry: _Entry, place: MemoryPlace) -> MemoryEntry:
        """An answered entry, passing the checks every entry passes."""
        try:
            key = check_key(entry.key)
            text = check_text(entry.text)
            metadata = check_metadata(dict(entry.metadata))
        except MemoryInputError as exc:
            raise self._bad("entry", exc.message) from None
        created, updated = float(entry.created_at), float(entry.updated_at)
        if not (math.isfinite(created) and math.isfinite(updated)):
            raise self._bad("entry", "a time that is not a finite number")
        return MemoryEntry(
            place.namespace,
            place.memory,
            place.scope_key,
            key,
            text,
            metadata,
            created_at=created,
            updated_at=updated,
        )

    # ------------------------------------------------------------------ failures

    def _said(self, text: str) -> str:
        """What the service said, short, printable (no terminal escapes) and without a
        secret."""
        printable = "".join(c for c in " ".join(text.split()) if c.isprintable())
        flat = printable[:_SAID_CHARS]
        return self._redactor.text(flat) if self._redactor else flat

    def _error(self, code: str, reason: str, *, retryable: bool = False) -> MemoryBackendError:
        message = self._said(f"memory {self.name!r} (backend http): {reason}")
        return MemoryBackendError(message, code=code, retryable=retryable)

    def _bad(self, operation: str, reason: str) -> MemoryBackendError:
        return self._error("memory_backend_bad_answer", f"{operation}: {reason}")

    def _from_tool_error(self, operation: str, exc: ToolError) -> MemoryBackendError:
        codes: dict[str, str] = {
            ToolErrorCode.BLOCKED_DESTINATION.value: "memory_backend_blocked",
            ToolErrorCode.TIMEOUT.value: "memory_backend_timeout",
            ToolErrorCode.UNAVAILABLE.value: "memory_backend_unavailable",
            ToolErrorCode.OUTPUT_TOO_LARGE.value: "memory_backend_bad_answer",
        }
        code = codes.get(str(exc.info.code), "memory_backend_unavailable")
        return self._error(code, f"{operation}: {exc.info.reason}", retryable=exc.info.retryable)

    def _status_error(
        self, operation: str, response: httpx.Response, raw: bytes
    ) -> MemoryBackendError | MemoryInputError:
        status = response.status_code
        said = ""
        code = ""
        try:
            error = _ErrorAnswer.model_validate(json.loads(raw.decode("utf-8"))).error
            said, code = error.message, error.code
        except (ValueError, RecursionError, PydanticValidationError):
            said = raw.decode("utf-8", errors="replace")
        if 300 <= status < 400:
            return self._bad(operation, f"HTTP {status}: a redirect, not followed")
        if status in (400, 422) and code == "invalid_input":
            # the service refuses what was asked of it: the caller's input, as a store would
            return MemoryInputError(self._said(f"memory {self.name!r}: {said or 'invalid input'}"))
        reason = f"{operation}: HTTP {status}" + (f": {said}" if said.strip() else "")
        if status >= 500 or status in _RETRYABLE_STATUS:
            return self._error("memory_backend_unavailable", reason, retryable=True)
        return self._error("memory_backend_refused", reason)


_MISSING = object()
