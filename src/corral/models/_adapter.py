"""Plumbing the SDK-backed provider adapters share.

:mod:`corral.models.openai` and :mod:`corral.models.anthropic` differ in their
wire format and in which exceptions their SDKs raise; how a call is guarded is
the same and is written once here:

- :class:`CallDeadline`, the whole-call time budget, spent only while waiting on
  the server;
- :class:`SDKModel`, the base of the adapters: it holds the client and runs
  every SDK call under that budget, converting every exception through the
  provider's :class:`SDKErrors`; a stream is read item by item, closed at the
  end, and must have been complete;
- :class:`SDKErrors` converts what an SDK and its transport raise, the same way
  for every SDK; :func:`http_error` is an HTTP error answer as a ``ModelError``
  (retryable or not, with the server's ``Retry-After`` hint read by
  :func:`retry_after_seconds`).

The HTTP clients the SDKs are given are made in :mod:`corral.models._http`.
"""

from __future__ import annotations

import email.utils
import json
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar, Generic, Protocol, TypeVar

import anyio
import httpx2

from corral.core.errors import ModelConnectionError, ModelError, ModelTimeoutError
from corral.core.messages import ModelResponse, StreamItem, TextDelta
from corral.models.base import Model

R = TypeVar("R")
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
T_contra = TypeVar("T_contra", contravariant=True)


# --------------------------------------------------------------------------- server hints


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """The server's retry hint in seconds, or ``None`` when it gave none.

    Reads ``retry-after-ms`` (sent by OpenAI) and ``retry-after`` as either a
    number of seconds or an HTTP date. ``headers`` must look names up without
    regard to case, as ``httpx`` headers do.
    """
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            value = float(millis) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        value = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())
    return value if math.isfinite(value) and value >= 0 else None


# --------------------------------------------------------------------------- deadline


class CallDeadline:
    """The time budget of one model call, spent only while waiting on the server.

    SDK timeouts bound each read; a server that trickles a byte every few seconds
    never trips them. Adapters wrap every wait (the request, each stream chunk)
    in :meth:`waiting`, which raises ``TimeoutError`` once the budget is spent.
    Time the caller spends between stream items is not charged.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.remaining = seconds

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Charge the time spent inside the block; raise ``TimeoutError`` past the budget."""
        start = anyio.current_time()
        try:
            # anyio.fail_after, spelled out: a generator-based context manager less per wait
            with anyio.CancelScope(deadline=start + max(self.remaining, 0.0)) as scope:
                yield
            if scope.cancelled_caught:  # nothing else cancels this scope: the budget is spent
                raise TimeoutError
        finally:
            self.remaining -= anyio.current_time() - start

    def expired(self, endpoint: str) -> ModelTimeoutError:
        """The error for a call that ran out of its budget."""
        return ModelTimeoutError(
            f"model endpoint {endpoint!r}: no complete answer within {self.seconds}s",
            endpoint=endpoint,
        )


# --------------------------------------------------------------------------- guarded calls


@dataclass(frozen=True)
class SDKErrors:
    """How one vendor SDK's exceptions become :class:`ModelError`.

    The openai and anthropic SDKs are built alike: every exception derives from
    ``root``, a ``timeout`` is a kind of ``connection`` error, and the rest are
    API errors (an HTTP error answer, an error event inside a stream), which
    ``api_error`` converts; it returns ``None`` for anything else.
    """

    root: type[Exception]
    timeout: type[Exception]
    connection: type[Exception]
    api_error: Callable[[Exception, str], ModelError | None]

    @property
    def raised(self) -> tuple[type[Exception], ...]:
        """Everything the SDK and its transport raise."""
        return (self.root, httpx2.HTTPError, json.JSONDecodeError)

    def convert(self, exc: Exception, endpoint: str) -> ModelError:
        """Convert an SDK or transport exception into Corral's model error."""
        where = f"model endpoint {endpoint!r}"
        if isinstance(exc, (self.timeout, httpx2.TimeoutException)):
            return ModelTimeoutError(f"{where}: request timed out", endpoint=endpoint)
        if isinstance(exc, (self.connection, httpx2.TransportError)):
            return ModelConnectionError(f"{where}: cannot connect: {exc}", endpoint=endpoint)
        converted = self.api_error(exc, endpoint)
        if converted is not None:
            return converted
        if isinstance(exc, json.JSONDecodeError):
            # a body cut short, typically a dropped connection: worth another try
            return ModelError(
                f"{where}: malformed answer: {exc}", retryable=True, endpoint=endpoint
            )
        return ModelError(f"{where}: {exc}", endpoint=endpoint)


def http_error(endpoint: str, status: int, message: str, headers: Mapping[str, str]) -> ModelError:
    """An HTTP error answer: 408, 429 and 5xx are retryable; the ``Retry-After`` hint is kept."""
    return ModelError(
        f"model endpoint {endpoint!r}: HTTP {status}: {message}",
        retryable=status in (408, 429) or status >= 500,
        status_code=status,
        retry_after=retry_after_seconds(headers),
        endpoint=endpoint,
    )


class SDKStream(Protocol[T_co]):
    """An SDK's answer stream: read with ``anext``, released with ``close``."""

    def __anext__(self) -> Awaitable[T_co]: ...

    async def close(self) -> None: ...


class StreamFold(Protocol[T_contra]):
    """What the items of one streamed answer add up to, as a provider folds them."""

    @property
    def complete(self) -> bool:
        """Whether the stream's final item arrived (else the answer was cut short)."""
        ...

    def add(self, item: T_contra) -> str:
        """Fold one item in; return its new text."""
        ...

    def response(self, endpoint: str) -> ModelResponse:
        """The whole answer."""
        ...

    def cut_short(self, endpoint: str) -> ModelError:
        """The error for a stream that ended before it was complete (see :func:`cut_short`)."""
        ...


def cut_short(endpoint: str) -> ModelConnectionError:
    """A stream that ended before its final item: the connection most likely dropped."""
    return ModelConnectionError(
        f"model endpoint {endpoint!r}: the stream ended before the answer was complete",
        endpoint=endpoint,
    )


@contextmanager
def _converted(endpoint: str, deadline: CallDeadline, errors: SDKErrors) -> Iterator[None]:
    try:
        yield
    except TimeoutError:
        raise deadline.expired(endpoint) from None
    except errors.raised as exc:
        raise errors.convert(exc, endpoint) from exc


class SDKClient(Protocol):
    """A vendor SDK's async client, as far as :class:`SDKModel` needs it."""

    async def close(self) -> None: ...


ClientT = TypeVar("ClientT", bound=SDKClient)


class SDKModel(Model, Generic[ClientT]):
    """A model reached through a vendor SDK's async client.

    Subclasses translate to and from the wire format and set :attr:`errors`;
    they run every SDK call through :meth:`_call` or :meth:`_stream`, which wait
    under one :class:`CallDeadline` of ``timeout_seconds`` and convert whatever
    the SDK and its transport raise.
    """

    #: how the subclass's SDK exceptions become :class:`ModelError`
    errors: ClassVar[SDKErrors]
    #: keys that are no secret (a placeholder sent to servers that want none)
    public_keys: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, name: str, client: ClientT, model: str, *, timeout_seconds: float) -> None:
        self.name = name
        self.client = client
        self.model = model
        self.timeout_seconds = timeout_seconds

    async def _call(self, call: Callable[[], Awaitable[R]]) -> R:
        """Await ``call()``: one request, one complete answer.

        (What ``_converted`` and ``CallDeadline.waiting`` do, inline: a model call is on
        every step's path, and this spares it three generator-based context managers.)
        """
        try:
            with anyio.CancelScope(deadline=anyio.current_time() + self.timeout_seconds):
                return await call()
        except TimeoutError:  # the call's own
            raise CallDeadline(self.timeout_seconds).expired(self.name) from None
        except self.errors.raised as exc:
            raise self.errors.convert(exc, self.name) from exc
        # reached only when the deadline cancelled the call
        raise CallDeadline(self.timeout_seconds).expired(self.name)

    async def _stream(
        self, open_stream: Callable[[], Awaitable[SDKStream[T]]], fold: StreamFold[T]
    ) -> AsyncIterator[StreamItem]:
        """Yield the text of a streamed answer as it comes, then the whole answer.

        Opening the stream and each read count against the deadline; the stream
        is closed however this ends. A stream that ends before ``fold`` is
        complete is a :class:`ModelConnectionError`, never a silently shortened answer.
        """
        deadline = CallDeadline(self.timeout_seconds)
        with _converted(self.name, deadline, self.errors):
            with deadline.waiting():
                items = await open_stream()
            try:
                while True:
                    try:
                        with deadline.waiting():
                            item = await anext(items)
                    except StopAsyncIteration:
                        break
                    text = fold.add(item)
                    if text:
                        yield TextDelta(text)
            finally:
                await items.close()
        if not fold.complete:
            raise fold.cut_short(self.name)
        yield fold.response(self.name)

    def credentials(self) -> list[str]:
        # both SDKs keep the key they send as `api_key` (anthropic: or `auth_token`)
        found = (getattr(self.client, "api_key", None), getattr(self.client, "auth_token", None))
        return [v for v in found if isinstance(v, str) and v and v not in self.public_keys]

    async def aclose(self) -> None:
        """Close the SDK client and its connections."""
        await self.client.close()
