"""TokenVerifier: bearer tokens checked against the store, with a short cache.

Verified tokens are cached for :data:`CACHE_SECONDS` so a request costs no store
read; revoking a token over the API drops it from this process's cache at once,
a revocation by ``corral token revoke`` (straight to the store) takes effect
within that time. ``last_used_at`` is written at most every
:data:`TOUCH_SECONDS` per token, so reads never turn into a write each.
"""

from __future__ import annotations

import time

from corral.core.tokens import ApiToken, parse_token
from corral.server.problems import ProblemError
from corral.store.base import Store

CACHE_SECONDS = 5.0
TOUCH_SECONDS = 60.0

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="corral"'}


class TokenVerifier:
    """Checks bearer tokens against the store, with a short cache."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._cache: dict[str, tuple[ApiToken, float]] = {}
        self._touched: dict[str, float] = {}

    async def verify(self, text: str) -> ApiToken:
        """The live token ``text`` names; ``ProblemError`` 401 otherwise."""
        parsed = parse_token(text)
        if parsed is None:
            raise unauthenticated("the bearer token is not a Corral API token")
        token_id, secret = parsed
        now = time.monotonic()
        cached = self._cache.get(token_id)
        if cached is not None and now - cached[1] < CACHE_SECONDS:
            token: ApiToken | None = cached[0]
        else:
            token = await self.store.get_token(token_id)
            if token is None:
                self._cache.pop(token_id, None)
            else:
                self._cache[token_id] = (token, now)
        # The same answer whether the id is unknown or the secret wrong.
        if token is None or not token.matches(secret):
            raise unauthenticated("the token is not valid")
        if token.revoked:
            raise unauthenticated("the token was revoked")
        await self._touch(token, now)
        return token

    def forget(self, token_id: str) -> None:
        """Drop a token from the cache (it was just revoked)."""
        self._cache.pop(token_id, None)

    async def _touch(self, token: ApiToken, now: float) -> None:
        if now - self._touched.get(token.id, -TOUCH_SECONDS) < TOUCH_SECONDS:
            return
        self._touched[token.id] = now
        await self.store.touch_token(token.id, time.time())


def unauthenticated(detail: str) -> ProblemError:
    """A 401 with the bearer challenge."""
    return ProblemError(401, detail, code="unauthenticated", headers=_CHALLENGE)
