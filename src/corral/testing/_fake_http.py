"""The protocol-neutral half of the fake model servers, for tests and benchmarks.

:class:`FakeModelServer` is a programmable model server over real HTTP: a
Starlette app run by uvicorn on ``127.0.0.1`` and a free port, in a thread of
its own, so it works the same from sync and async tests. Subclasses speak one
wire protocol (:class:`~corral.testing.fake_openai.FakeOpenAIServer`,
:class:`~corral.testing.fake_anthropic.FakeAnthropicServer`), which re-export
the public names of this module.

What a server answers, for each request in turn:

1. the next queued *fault* (:meth:`FakeModelServer.fail`, :meth:`FakeModelServer.delay`,
   :meth:`FakeModelServer.truncate`);
2. else the next queued :class:`FakeReply`;
3. else the :class:`ToolLoop` when one is set (an agent loop of any length);
4. else the ``default_reply``, or a 400 error saying the script ran out.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

# --------------------------------------------------------------------------- script


@dataclass(frozen=True)
class FakeToolCall:
    """A tool call the fake model makes; ``arguments`` may be an object or raw JSON text."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict[str, Any])
    id: str | None = None

    def arguments_json(self) -> str:
        """The arguments as the JSON text a model would send."""
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@dataclass(frozen=True)
class FakeReply:
    """One scripted model turn: text and/or tool calls, with the usage to report."""

    text: str = ""
    tool_calls: tuple[FakeToolCall, ...] | list[FakeToolCall] = ()
    input_tokens: int = 10
    output_tokens: int = 5
    model: str | None = None


@dataclass(frozen=True)
class ToolLoop:
    """Answer like an agent that calls a tool ``calls`` times, one call per turn, then stops.

    The turn is chosen from the number of tool results already in the
    conversation, so any number of concurrent conversations can share one server.
    """

    tool_name: str = "lookup"
    calls: int = 1
    arguments: dict[str, Any] = field(default_factory=lambda: {"query": "x"})
    final_text: str = "done after {n} tool results"

    def reply(self, tool_results: int) -> FakeReply:
        if tool_results < self.calls:
            call_id = f"call_{tool_results + 1}"
            return FakeReply(tool_calls=(FakeToolCall(self.tool_name, self.arguments, call_id),))
        return FakeReply(text=self.final_text.format(n=tool_results))


@dataclass
class Fault:
    """An injected failure: an error status, or a delay before (or while) answering.

    ``times`` is how many requests it applies to; ``None`` means every request.
    """

    status: int | None = None
    retry_after: str | None = None
    message: str = "injected failure"
    delay: float = 0.0
    chunk_delay: float = 0.0
    cut_after: int | None = None
    times: int | None = 1


@dataclass(frozen=True)
class RecordedRequest:
    """A request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    query: dict[str, str]
    body: Any

    @property
    def json(self) -> dict[str, Any]:
        """The body as a JSON object (an empty one when it was not)."""
        return self.body if isinstance(self.body, dict) else {}


@dataclass(frozen=True)
class Plan:
    """What the server decided to answer to one request."""

    reply: FakeReply | None = None
    error: Fault | None = None
    delay: float = 0.0
    chunk_delay: float = 0.0
    cut_after: int | None = None

    def body(self, pieces: list[str]) -> AsyncIterator[bytes]:
        """The answer's pieces as this plan delivers them (trickled, cut short)."""
        return trickle(pieces[: self.cut_after], self.chunk_delay)

    def event_stream(self, events: list[str]) -> Response:
        """A server-sent-events answer, delivered as this plan says."""
        return StreamingResponse(self.body(events), media_type="text/event-stream")

    def json_response(self, body: Mapping[str, Any]) -> Response:
        """A JSON answer; trickled or cut short when this plan says so."""
        if self.chunk_delay or self.cut_after is not None:
            return StreamingResponse(self.body(pieces_of_json(body)), media_type="application/json")
        return JSONResponse(body)


# --------------------------------------------------------------------------- server


class FakeModelServer(ABC):
    """A programmable model server on ``127.0.0.1``; subclasses speak a wire protocol.

    Thread-safe: tests script it from their thread while uvicorn serves from its own.
    """

    def __init__(
        self,
        *,
        model: str = "fake-model",
        default_reply: FakeReply | None = None,
        tool_loop: ToolLoop | None = None,
    ) -> None:
        self.model = model
        self.default_reply = default_reply
        self.tool_loop = tool_loop
        self._initial = (default_reply, tool_loop)
        self.requests: list[RecordedRequest] = []
        self._replies: deque[FakeReply] = deque()
        self._faults: deque[Fault] = deque()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._port = 0

    # -- scripting

    def add_reply(self, *replies: FakeReply) -> Self:
        """Queue replies, answered in order."""
        with self._lock:
            self._replies.extend(replies)
        return self

    def fail(
        self,
        status: int,
        *,
        times: int | None = 1,
        retry_after: str | None = None,
        message: str = "injected failure",
    ) -> Self:
        """Answer the next ``times`` requests (``None``: all of them) with ``status``."""
        with self._lock:
            self._faults.append(Fault(status, retry_after, message, times=times))
        return self

    def delay(self, seconds: float, *, times: int | None = 1, chunk_delay: float = 0.0) -> Self:
        """Wait ``seconds`` before answering, and ``chunk_delay`` between body pieces.

        A ``chunk_delay`` makes the server trickle: every read is quick, the whole
        answer is slow.
        """
        with self._lock:
            self._faults.append(Fault(delay=seconds, chunk_delay=chunk_delay, times=times))
        return self

    def truncate(self, after: int, *, times: int | None = 1) -> Self:
        """End the answer after ``after`` pieces (stream events), as a dropped connection would."""
        with self._lock:
            self._faults.append(Fault(cut_after=after, times=times))
        return self

    def reset(self) -> None:
        """Forget the script, the faults and the recorded requests.

        ``default_reply`` and ``tool_loop`` go back to what the constructor was given,
        so one server can be shared by many tests.
        """
        with self._lock:
            self._replies.clear()
            self._faults.clear()
            self.requests.clear()
            self.default_reply, self.tool_loop = self._initial

    @property
    def calls(self) -> int:
        """How many requests the server received."""
        with self._lock:
            return len(self.requests)

    def next_id(self, prefix: str) -> str:
        """A fresh id (``prefix`` + a counter) for completions, messages and tool calls."""
        return f"{prefix}{next(self._ids)}"

    def plan(self, recorded: RecordedRequest, tool_results: int) -> Plan:
        """Record a request and decide what to answer."""
        with self._lock:
            self.requests.append(recorded)
            fault = self._take_fault()
            if fault is not None and fault.status is not None:
                return Plan(error=fault)
            if fault is not None:
                delay, chunk_delay, cut_after = fault.delay, fault.chunk_delay, fault.cut_after
            else:
                delay, chunk_delay, cut_after = 0.0, 0.0, None
            if self._replies:
                reply: FakeReply | None = self._replies.popleft()
            elif self.tool_loop is not None:
                reply = self.tool_loop.reply(tool_results)
            else:
                reply = self.default_reply
        return Plan(reply=reply, delay=delay, chunk_delay=chunk_delay, cut_after=cut_after)

    def plan_without_reply(self, recorded: RecordedRequest) -> Plan:
        """Record a request that needs no scripted reply (embeddings): only the next
        fault applies, and the queued replies stay for the chat requests."""
        with self._lock:
            self.requests.append(recorded)
            fault = self._take_fault()
        if fault is None:
            return Plan()
        if fault.status is not None:
            return Plan(error=fault)
        return Plan(delay=fault.delay, chunk_delay=fault.chunk_delay, cut_after=fault.cut_after)

    def _take_fault(self) -> Fault | None:
        """The fault for this request, counted (call with the lock held)."""
        if not self._faults:
            return None
        fault = self._faults[0]
        if fault.times is not None:
            fault.times -= 1
            if fault.times <= 0:
                self._faults.popleft()
        return fault

    async def fault_response(self, plan: Plan) -> Response | None:
        """Wait the plan's delay; the injected error answer, or ``None`` to answer normally."""
        if plan.delay:
            await asyncio.sleep(plan.delay)
        if plan.error is None:
            return None
        fault = plan.error
        status = fault.status or 500
        return JSONResponse(
            self.error_body(status, fault.message),
            status_code=status,
            headers=error_headers(fault),
        )

    # -- answering

    async def handle(self, request: Request) -> Response:
        """Answer one request: an injected fault, a script error, or the planned reply."""
        recorded = await record(request)
        body = recorded.json
        plan = self.plan(recorded, self.tool_results(body))
        failed = await self.fault_response(plan)
        if failed is not None:
            return failed
        if plan.reply is None:
            message = f"fake server: no scripted reply left for request {self.calls}"
            return JSONResponse(self.error_body(400, message), status_code=400)
        reply = plan.reply
        return self.answer(body, reply, reply.model or str(body.get("model") or self.model), plan)

    # -- protocol hooks

    @abstractmethod
    def routes(self) -> list[Route]:
        """The Starlette routes of the protocol; they answer with :meth:`handle`."""

    @abstractmethod
    def tool_results(self, body: dict[str, Any]) -> int:
        """How many tool results the conversation of a request body holds."""

    @abstractmethod
    def error_body(self, status: int, message: str) -> dict[str, Any]:
        """The protocol's error answer for an HTTP ``status``."""

    @abstractmethod
    def answer(self, body: dict[str, Any], reply: FakeReply, model: str, plan: Plan) -> Response:
        """The protocol's answer with ``reply`` (streamed when ``body`` asks for it)."""

    @property
    @abstractmethod
    def base_url(self) -> str:
        """The URL to give the protocol's SDK client as its ``base_url``."""

    @property
    def root_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        if not self._port:
            raise RuntimeError("the fake server is not running")
        return f"http://127.0.0.1:{self._port}"

    # -- lifecycle

    def start(self) -> None:
        """Start serving in a background thread; returns once the server accepts requests."""
        if self._thread is not None:
            raise RuntimeError("the fake server is already running")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            Starlette(routes=self.routes()),
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="fake-model-server", daemon=True
        )
        thread.start()
        self._server, self._thread = server, thread
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the fake server failed to start")
            thread.join(0.005)

    def stop(self) -> None:
        """Stop serving, dropping requests still in flight."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.should_exit = True
        server.force_exit = True
        thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        await anyio.to_thread.run_sync(self.start)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await anyio.to_thread.run_sync(self.stop)


async def record(request: Request) -> RecordedRequest:
    """Read a request into a :class:`RecordedRequest`."""
    raw = await request.body()
    try:
        body: Any = json.loads(raw) if raw else None
    except ValueError:
        body = raw.decode(errors="replace")
    return RecordedRequest(
        method=request.method,
        path=request.url.path,
        headers=dict(request.headers),
        query=dict(request.query_params),
        body=body,
    )


def error_headers(fault: Fault) -> dict[str, str]:
    """The response headers of an injected error (its ``Retry-After``)."""
    return {"retry-after": fault.retry_after} if fault.retry_after is not None else {}


async def trickle(pieces: list[str], chunk_delay: float) -> AsyncIterator[bytes]:
    """Send ``pieces`` one by one, ``chunk_delay`` apart."""
    for n, piece in enumerate(pieces):
        if n and chunk_delay:
            await asyncio.sleep(chunk_delay)
        yield piece.encode()


def split_text(text: str, parts: int = 3) -> list[str]:
    """``text`` cut into up to ``parts`` non-empty pieces, so streams have several deltas."""
    if not text:
        return []
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


def pieces_of_json(body: Mapping[str, Any], parts: int = 4) -> list[str]:
    """A JSON body as text cut into pieces, for trickled non-streaming answers."""
    return split_text(json.dumps(body), parts)
