"""A real remote memory service for the ``http`` memory backend: the contract of
docs/memory-http.md (version 1) served by uvicorn on 127.0.0.1, in a thread.

Its entries live in a Corral SQLite store of its own (opened on the server's event
loop), so it answers every operation as the store backend would: it is the contract's
reference implementation, run for real. ``misbehave`` makes it hang, lie or refuse in
one of the ways :data:`MISBEHAVIOURS` names, for the hostile tests; ``requests``
records every request's path, headers and body; ``token`` (when set) is the bearer
token it requires.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from corral.core.memory import MemoryEntry, MemoryInputError, MemoryPlace
from corral.store import Store, open_store

#: what the service can be told to do instead of answering right
MISBEHAVIOURS = (
    "hang",  # never answers
    "trickle",  # sends its answer a byte a second
    "not_json",  # 200 with an HTML page
    "deep",  # 200 with JSON nested 100,000 deep
    "wrong_shape",  # 200 with {"version": 1, "entries": "many"}
    "wrong_version",  # 200 with version 2
    "huge",  # 200 with 20 MB of JSON
    "redirect",  # 307 to a metadata address
    "fail",  # 500 with a message echoing the request's Authorization header
    "refuse",  # 403
    "too_many",  # more hits or entries than asked, out of order
    "foreign_key",  # read answers another key's entry
    "invalid_input",  # 400 invalid_input: "too sad"
)


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class MemoryService:
    db: Path
    token: str | None = None
    misbehave: str | None = None
    requests: list[Seen] = field(default_factory=list)
    port: int = 0
    store: Store | None = None
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/memory/v1"

    # ---------------------------------------------------------------- the contract

    async def _write(self, body: dict[str, Any], request: Request) -> dict[str, Any]:
        assert self.store is not None
        place = _place(body["place"])
        given = body["entry"]
        retention = body.get("retention") or {}
        entry = MemoryEntry(
            place.namespace,
            place.memory,
            place.scope_key,
            given["key"],
            given["text"],
            given.get("metadata") or {},
            idempotency_key=request.headers.get("idempotency-key"),
        )
        stored, written = await self.store.write_memory(
            entry,
            max_entries=retention.get("max_entries"),
            max_age_days=retention.get("max_age_days"),
        )
        return {"entry": _entry(stored), "written": written}

    async def _read(self, body: dict[str, Any], request: Request) -> dict[str, Any]:
        assert self.store is not None
        found = await self.store.read_memory(_place(body["place"]), body["key"])
        if self.misbehave == "foreign_key" and found is not None:
            return {"entry": {**_entry(found), "key": found.key + "-other"}}
        return {"entry": _entry(found) if found is not None else None}

    async def _list(self, body: dict[str, Any], request: Request) -> dict[str, Any]:
        assert self.store is not None
        found = await self.store.list_memory(
            _place(body["place"]),
            prefix=body.get("prefix", ""),
            limit=body["limit"],
            after=body.get("after"),
        )
        entries = [_entry(e) for e in found]
        if self.misbehave == "too_many":
            entries = list(reversed(entries * 2))
        return {"entries": entries}

    async def _delete(self, body: dict[str, Any], request: Request) -> dict[str, Any]:
        assert self.store is not None
        return {"deleted": await self.store.delete_memory_entry(_place(body["place"]), body["key"])}

    async def _search(self, body: dict[str, Any], request: Request) -> dict[str, Any]:
        assert self.store is not None
        hits = await self.store.search_memory(
            _place(body["place"]),
            body["query"],
            top_k=body.get("top_k", 5),
            filters=body.get("filters") or None,
        )
        answered = [{"entry": _entry(h.entry), "score": h.score} for h in hits]
        if self.misbehave == "too_many":
            answered = answered * (body.get("top_k", 5) + 1)
        return {"hits": answered}

    async def _stats(self, body: dict[str, Any], request: Request) -> dict[str, Any]:
        assert self.store is not None
        stats = await self.store.memory_stats(body["namespace"], body["memory"])
        return {
            "entries": stats.entries,
            "text_chars": stats.text_chars,
            "scopes": stats.scopes,
            "index": f"reference service ({stats.index})",
        }

    async def _prune(self, body: dict[str, Any], request: Request) -> dict[str, Any]:
        assert self.store is not None
        retention = body.get("retention") or {}
        pruned = await self.store.prune_memory(
            _place(body["place"]),
            max_entries=retention.get("max_entries"),
            max_age_days=retention.get("max_age_days"),
            now=body.get("now"),
        )
        return {"pruned": pruned}

    # ---------------------------------------------------------------- the server

    async def _answer(self, request: Request) -> Response:
        operation = request.path_params["operation"]
        raw = await request.body()
        body = json.loads(raw)
        self.requests.append(Seen(operation, dict(request.headers), body))
        if self.token is not None and request.headers.get("authorization") != (
            f"Bearer {self.token}"
        ):
            return _error(401, "unauthenticated", "a bearer token is required")
        if body.get("version") != 1:
            return _error(400, "unsupported_version", "this service speaks version 1")
        misbehaving = await self._misbehaving(request)
        if misbehaving is not None:
            return misbehaving
        handler = getattr(self, f"_{operation}", None)
        if handler is None:
            return _error(404, "not_found", f"no operation {operation!r}")
        try:
            answer = await handler(body, request)
        except MemoryInputError as exc:
            return _error(400, "invalid_input", exc.message)
        return JSONResponse({"version": 1, **answer})

    async def _misbehaving(self, request: Request) -> Response | None:
        how = self.misbehave
        if how == "hang":
            await asyncio.sleep(3600)
        if how == "trickle":

            async def drip() -> AsyncIterator[bytes]:
                for byte in b'{"version": 1, "entry": null}':
                    yield bytes([byte])
                    await asyncio.sleep(1)

            return StreamingResponse(drip(), media_type="application/json")
        if how == "not_json":
            return Response("<html>Bad gateway</html>", 200, media_type="text/html")
        if how == "deep":
            return Response("[" * 100_000 + "]" * 100_000, 200, media_type="application/json")
        if how == "wrong_shape":
            return JSONResponse({"version": 1, "entry": "many", "entries": "many", "hits": 3})
        if how == "wrong_version":
            return JSONResponse({"version": 2, "entry": None})
        if how == "huge":
            filler = "x" * (20 * 1024 * 1024)
            return JSONResponse({"version": 1, "entry": None, "filler": filler})
        if how == "redirect":
            return Response(
                status_code=307, headers={"Location": "http://169.254.169.254/latest/meta-data"}
            )
        if how == "fail":
            echoed = request.headers.get("authorization", "")
            return _error(500, "boom", f"database on fire; you sent {echoed}")
        if how == "invalid_input":
            return _error(400, "invalid_input", "too sad")
        if how == "refuse":
            return _error(403, "forbidden", "not for you")
        return None

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.store = await open_store(f"sqlite:///{self.db}")
        try:
            yield
        finally:
            await self.store.close()

    def _main(self) -> None:
        app = Starlette(
            routes=[Route("/memory/v1/{operation}", self._answer, methods=["POST"])],
            lifespan=self._lifespan,
        )
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", lifespan="on")
        self._server = uvicorn.Server(config)
        asyncio.run(self._server.serve())

    def start(self) -> MemoryService:
        self._thread = threading.Thread(target=self._main, name="memory-service", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while self._server is None or not self._server.started:
            assert self._thread.is_alive(), "the memory service failed to start"
            assert time.monotonic() < deadline, "the memory service did not start in 30 s"
            time.sleep(0.02)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            # a hanging request does not hold the stop
            self._server.force_exit = self.misbehave in ("hang", "trickle")
        if self._thread is not None:
            self._thread.join(30)
            assert not self._thread.is_alive(), "the memory service did not stop in 30 s"


def _place(data: dict[str, Any]) -> MemoryPlace:
    return MemoryPlace(data["namespace"], data["memory"], data.get("scope_key", ""))


def _entry(entry: MemoryEntry) -> dict[str, Any]:
    return {
        "key": entry.key,
        "text": entry.text,
        "metadata": entry.metadata,
        "created_at": entry.created_at,
        "updated_at": entry.updated_at,
    }


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"version": 1, "error": {"code": code, "message": message}}, status)


@contextmanager
def memory_service(db: Path, *, token: str | None = None) -> Iterator[MemoryService]:
    """A running memory service keeping its entries in the SQLite file ``db``."""
    service = MemoryService(db, token=token).start()
    try:
        yield service
    finally:
        service.stop()
