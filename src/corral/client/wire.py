"""What both clients share around the calls: configuration, sending, errors, the SSE format.

httpx and problem+json stop here: an answer that is an error becomes the
matching :class:`~corral.core.errors.CorralError` (a caller catches
``NotFoundError`` whether it talks to the store or to a server), and every
transport failure becomes :class:`~corral.core.errors.ApiConnectionError`
naming the URL.

    404                  NotFoundError
    409                  ConflictError
    401, 403             AuthError (``status``)
    422 with field paths ResourceError (``problems``: field, line, reason)
    other 4xx            UserError
    429                  RateLimitedError (``retry_after`` from Retry-After)
    5xx, anything else   ApiError (``status``, ``code``)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict, TypeVar

import httpx

from corral.api import EventOut
from corral.client.calls import Call, Follow
from corral.core.errors import (
    ApiConnectionError,
    ApiError,
    AuthError,
    ConflictError,
    CorralError,
    Location,
    NotFoundError,
    RateLimitedError,
    ResourceError,
    UserError,
)

T = TypeVar("T")

URL_ENV = "CORRAL_URL"
TOKEN_ENV = "CORRAL_TOKEN"
DEFAULT_TIMEOUT = 30.0
#: an event stream sends a keep-alive every 15 s by default: a read this long means it died
STREAM_READ_TIMEOUT = 60.0
STREAM_TIMEOUT = httpx.Timeout(DEFAULT_TIMEOUT, read=STREAM_READ_TIMEOUT)


def resolve(base_url: str | None, token: str | None) -> tuple[str, str | None]:
    """The base URL and token from the arguments, else from ``CORRAL_URL``/``CORRAL_TOKEN``."""
    url = base_url or os.environ.get(URL_ENV)
    if not url:
        raise UserError(f"no Corral API URL: pass base_url or set {URL_ENV}")
    return url.rstrip("/"), token if token is not None else (os.environ.get(TOKEN_ENV) or None)


def headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


class HttpOptions(TypedDict):
    """What a client's httpx client (sync or async) is opened with, but its transport."""

    base_url: str
    headers: dict[str, str]
    timeout: float


def request(http: httpx.Client | httpx.AsyncClient, call: Call[Any]) -> httpx.Request:
    """The request of ``call`` on ``http`` (sent with ``http.send``, as ``http.request`` would)."""
    return http.build_request(
        call.method,
        call.path,
        params=call.params,
        json=call.json,
        content=call.content,
        headers=call.headers,
        timeout=call.timeout if call.timeout is not None else httpx.USE_CLIENT_DEFAULT,
    )


def answer(call: Call[T], response: httpx.Response) -> T:
    """What ``response`` (read) answers to ``call``; an error answer raises."""
    if response.status_code >= 400 and response.status_code not in call.accept:
        raise error_from(response)
    return call.parse(response)


def connection_error(url: str, exc: httpx.TransportError) -> ApiConnectionError:
    """A transport failure as one clear error naming the URL."""
    kind = "timed out talking to" if isinstance(exc, httpx.TimeoutException) else "cannot reach"
    reason = str(exc) or type(exc).__name__
    return ApiConnectionError(f"{kind} the Corral API at {url}: {reason}", url=url)


def error_from(response: httpx.Response) -> CorralError:
    """The error an answer of status >= 400 stands for (its body must have been read)."""
    status = response.status_code
    problem = _problem(response)
    code = problem.get("code") if isinstance(problem.get("code"), str) else None
    detail = str(problem.get("detail") or response.text[:500] or response.reason_phrase)
    found: CorralError
    if status == 404:
        found = NotFoundError(detail)
    elif status == 409:
        found = ConflictError(detail)
    elif status in (401, 403):
        found = AuthError(detail, status=status)
    elif status == 429:
        found = RateLimitedError(detail, retry_after=_seconds(response.headers.get("retry-after")))
    elif 400 <= status < 500:
        fields = _field_problems(problem)
        found = ResourceError(fields) if status == 422 and fields else UserError(detail)
    else:
        return ApiError(f"{detail} (HTTP {status})", status=status, code=code)
    if code is not None:
        found.code = code
    return found


def _problem(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _field_problems(problem: dict[str, Any]) -> list[tuple[Location, str]]:
    found: list[tuple[Location, str]] = []
    for item in problem.get("errors") or []:
        if not isinstance(item, dict):
            continue
        document = item.get("document")
        found.append(
            (
                Location(
                    file=f"document {document}" if isinstance(document, int) else None,
                    line=item.get("line") if isinstance(item.get("line"), int) else None,
                    field=item.get("field") if isinstance(item.get("field"), str) else None,
                ),
                str(item.get("reason", "invalid")),
            )
        )
    return found


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


# --------------------------------------------------------------------------- SSE


@dataclass
class SseMessage:
    """One message of an event stream."""

    event: str = "message"
    data: str = ""
    id: str | None = None


@dataclass
class SseParser:
    """Turns the lines of an event stream into messages; remembers ``retry:``."""

    retry_seconds: float | None = None
    _lines: list[str] = field(default_factory=list[str])
    _event: str | None = None
    _id: str | None = None

    def reset(self) -> None:
        """Forget a message cut off by a dropped connection (``retry`` stays)."""
        self._lines, self._event, self._id = [], None, None

    def feed(self, line: str) -> SseMessage | None:
        """Take one line (without its newline); a message when a blank line ends one."""
        if not line:
            if not self._lines and self._event is None:
                self._id = None
                return None
            message = SseMessage(self._event or "message", "\n".join(self._lines), self._id)
            self._lines, self._event, self._id = [], None, None
            return message
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._lines.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        elif name == "retry" and value.isdigit():
            self.retry_seconds = int(value) / 1000
        return None


@dataclass
class StreamPosition:
    """Where a followed stream is: the last seq delivered, and whether it ended.

    Both clients' ``follow`` keep one: a reconnect resumes after ``last_seq`` (as
    ``Last-Event-ID``), and an event at or before it (a server that resent) is dropped,
    so the caller sees each event exactly once, in order.
    """

    last_seq: int = 0
    ended: bool = False
    final_state: str | None = None

    def request_headers(self) -> dict[str, str]:
        return {"Accept": "text/event-stream", "Last-Event-ID": str(self.last_seq)}

    def take(self, message: SseMessage) -> EventOut | None:
        """The event to deliver for ``message``, if any; notes the end of the stream."""
        if message.event == "end":
            self.ended = True
            try:
                state = json.loads(message.data).get("state")
            except (ValueError, AttributeError):
                state = None
            self.final_state = state if isinstance(state, str) else None
            return None
        if message.id is None or not message.data:
            return None
        event = EventOut.model_validate_json(message.data)
        if event.seq <= self.last_seq:
            return None
        self.last_seq = event.seq
        return event


def reconnect_delay(configured: float | None, parser: SseParser) -> float:
    """How long to wait before reconnecting: as configured, else the server's ``retry:``."""
    if configured is not None:
        return configured
    return parser.retry_seconds if parser.retry_seconds is not None else 1.0


@dataclass
class Reconnects:
    """When a follower opens its stream again, and when it gives up.

    A stream that ends without ``end`` (a dropped connection, a server shutting
    down, a 5xx, a 429) is reopened after the server's ``retry:`` (or
    ``Retry-After``); after ``limit`` attempts in a row that brought no new event
    the last error is raised. Errors of the caller's own (404, 401, ...) are never
    retried: they are not ``ApiError`` and pass straight through.
    """

    url: str
    limit: int
    configured_seconds: float | None = None
    failures: int = 0

    def progressed(self) -> None:
        self.failures = 0

    def wait_after(self, error: httpx.TransportError | ApiError | None, parser: SseParser) -> float:
        """Seconds to wait before reconnecting; raises once the attempts are used up."""
        self.failures += 1
        if self.failures > self.limit:
            if isinstance(error, httpx.TransportError):
                raise connection_error(self.url, error) from None
            if error is not None:
                raise error
            raise ApiConnectionError(
                f"the event stream at {self.url} keeps ending before the run does", url=self.url
            )
        if isinstance(error, RateLimitedError) and error.retry_after is not None:
            return error.retry_after
        return reconnect_delay(self.configured_seconds, parser)


@dataclass
class EventStream:
    """A run's event stream as a follower reads it, across its connections.

    What both clients' ``follow`` share: the request to (re)open the stream at
    ``path``, its lines turned into events (each once, in order: ``position``),
    and when to reconnect or give up (``reconnects``). A client only opens the
    connections, hands their lines to :meth:`feed` and sleeps ``pause`` between
    them.
    """

    path: str
    position: StreamPosition
    reconnects: Reconnects
    parser: SseParser = field(default_factory=SseParser)
    #: seconds to wait before the next connection (set when one ends early)
    pause: float = 0.0
    #: a stream is read for as long as the run goes: only a silent one times out
    timeout: ClassVar[httpx.Timeout] = STREAM_TIMEOUT

    @classmethod
    def of(cls, follow: Follow, url: str) -> EventStream:
        """The stream ``follow`` asks for, from the server at ``url``."""
        reconnects = Reconnects(url, follow.max_reconnects, follow.reconnect_seconds)
        return cls(follow.path, StreamPosition(last_seq=follow.after), reconnects)

    @property
    def ended(self) -> bool:
        return self.position.ended

    @property
    def headers(self) -> dict[str, str]:
        return self.position.request_headers()

    def opened(self, response: httpx.Response) -> None:
        """Check a new connection's answer (an error's body must have been read)."""
        if response.status_code >= 400:
            raise error_from(response)
        self.parser.reset()

    def feed(self, line: str) -> EventOut | None:
        """The event a line completes, if any."""
        message = self.parser.feed(line)
        event = self.position.take(message) if message is not None else None
        if event is not None:
            self.reconnects.progressed()
        return event

    @contextmanager
    def attempt(self) -> Iterator[None]:
        """Around one connection: one that ends before the run does sets ``pause``, or
        raises once the attempts are used up."""
        try:
            yield
        except (httpx.TransportError, ApiError) as exc:
            self.pause = self.reconnects.wait_after(exc, self.parser)
        else:
            if not self.ended:
                self.pause = self.reconnects.wait_after(None, self.parser)
