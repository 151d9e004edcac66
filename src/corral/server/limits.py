"""Request limits: the largest body accepted, a rate limit per token, and one on
failed authentication per client address.

The body limit is an ASGI middleware: a declared ``Content-Length`` above the
limit is refused before a byte is read, and a chunked body is counted as it
arrives and refused once it passes the limit (413 either way). The rate limits
are token buckets in the memory of this process: with several ``corral serve``
processes behind a balancer each enforces them on its own share. Requests with a
valid token are limited per token; failed authentications (401) are limited per
client address (:func:`address_key`), so guessing tokens costs at most a few
store lookups per address.
"""

from __future__ import annotations

import ipaddress
import math
import time
from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.server.problems import ProblemError, problem_response


class _TooLarge(HTTPException):
    """The request body passed the size limit while it was being read.

    An ``HTTPException`` because FastAPI turns any other error raised while it reads
    a body into a 400, and passes this one on to the app's handler (a 413 problem).
    """

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, _too_large(max_bytes), headers={"Connection": "close"})


class BodyLimitMiddleware:
    """Refuses request bodies larger than ``max_bytes`` with 413."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except _TooLarge:
            if started:  # a handler that answered before reading all of its body
                raise
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem_response(
            413, "payload_too_large", _too_large(self.max_bytes), headers={"Connection": "close"}
        )
        await response(scope, receive, send)


def _too_large(max_bytes: int) -> str:
    return f"the request body is larger than the limit of {max_bytes} bytes"


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """A token bucket per key: ``rate`` requests per second sustained, ``burst`` at once.

    ``rate <= 0`` turns it off. Buckets of keys idle long enough to be full again
    are dropped, so memory follows the number of active tokens.
    """

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self._buckets: dict[str, _Bucket] = {}
        self._next_sweep = 0.0

    def acquire(self, key: str, now: float | None = None) -> float | None:
        """Take one request from ``key``'s bucket: ``None`` when allowed, else the seconds
        until one is available (for ``Retry-After``)."""
        if self.rate <= 0:
            return None
        now = time.monotonic() if now is None else now
        self._sweep(now)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(float(self.burst), now)
        self._refill(bucket, now)
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return None
        return (1 - bucket.tokens) / self.rate

    def wait(self, key: str, now: float | None = None) -> float | None:
        """Like :meth:`acquire` without taking anything: ``None`` when ``key`` may go on."""
        bucket = self._buckets.get(key)
        if self.rate <= 0 or bucket is None:
            return None
        self._refill(bucket, time.monotonic() if now is None else now)
        return None if bucket.tokens >= 1 else (1 - bucket.tokens) / self.rate

    def _refill(self, bucket: _Bucket, now: float) -> None:
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
        bucket.updated = now

    def _sweep(self, now: float) -> None:
        if now < self._next_sweep:
            return
        refill = self.burst / self.rate
        self._next_sweep = now + max(refill, 60.0)
        for key, bucket in list(self._buckets.items()):
            if now - bucket.updated >= refill:
                del self._buckets[key]


def retry_after(seconds: float) -> str:
    """``Retry-After`` in whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))


def refuse_while_waiting(wait: float | None, what: str) -> None:
    """A 429 ``rate_limited`` (``too many WHAT; slow down``, with ``Retry-After``) while a
    bucket or the failed-authentication counter says to wait."""
    if wait is not None:
        raise ProblemError(
            429,
            f"too many {what}; slow down",
            code="rate_limited",
            headers={"Retry-After": retry_after(wait)},
        )


def address_key(host: str | None) -> str:
    """The rate-limit key of a client address: the address, or its /64 for IPv6.

    One IPv6 host usually holds a whole /64, so keying by address would give it
    billions of buckets.
    """
    if host is None:
        return "unknown"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)
