"""Request limits: the largest body accepted, and a rate limit per token.

The body limit is an ASGI middleware: a declared ``Content-Length`` above the
limit is refused before a byte is read, and a chunked body is counted as it
arrives and refused once it passes the limit (413 either way). The rate limit
is a token bucket per API token, in the memory of this process: with several
``corral serve`` processes behind a balancer each enforces it on its own share.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.server.problems import problem_response


class _TooLarge(Exception):
    """The request body passed the size limit while it was being read."""


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
                    raise _TooLarge
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
            413,
            "payload_too_large",
            f"the request body is larger than the limit of {self.max_bytes} bytes",
            headers={"Connection": "close"},
        )
        await response(scope, receive, send)


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
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
        bucket.updated = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return None
        return (1 - bucket.tokens) / self.rate

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
