"""Who is calling: bearer tokens, their namespace and role, and the rate limits.

Every ``/v1`` operation declares the least role it needs with :func:`require`:
viewer reads, operator also submits, cancels, decides approvals, prompts and
deletes sessions, admin also applies resources and manages tokens. A missing,
malformed, unknown or revoked token is 401 (with ``WWW-Authenticate``); a role
below the operation's is 403. Objects of another namespace are answered 404 by
the routes, never 403: a token learns nothing about namespaces it is not in.

Verified tokens are cached for :data:`CACHE_SECONDS` so a request costs no store
read; revoking a token over the API drops it from this process's cache at once,
a revocation by ``corral token revoke`` (straight to the store) takes effect
within that time. ``last_used_at`` is written at most every
:data:`TOUCH_SECONDS` per token, so reads never turn into a write each.

Failed authentications are limited per client address
(``CORRAL_API_AUTH_FAILURE_RATE`` and ``_BURST``): past its bucket an address
gets 429 with ``Retry-After`` before its token is looked at, so guessing tokens
costs no store lookup. Successful requests are limited per token only.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from corral.core.tokens import ApiToken, Role, parse_token
from corral.server.limits import address_key, retry_after
from corral.server.problems import ProblemError
from corral.store.base import Store

if TYPE_CHECKING:
    from corral.server.context import ServerContext

CACHE_SECONDS = 5.0
TOUCH_SECONDS = 60.0

_bearer = HTTPBearer(
    auto_error=False,
    bearerFormat="corral_<id>_<secret>",
    description="An API token from `corral token create` (or POST /v1/tokens).",
)
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="corral"'}


@dataclass(frozen=True)
class Principal:
    """The caller of a request: its token, and so its namespace and role."""

    token: ApiToken

    @property
    def namespace(self) -> str:
        return self.token.namespace

    @property
    def role(self) -> Role:
        return self.token.role

    @property
    def label(self) -> str:
        """How decisions made with this token are recorded (``decided_by``)."""
        return f"token:{self.token.id}" + (f" ({self.token.name})" if self.token.name else "")


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
            raise _unauthenticated("the bearer token is not a Corral API token")
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
            raise _unauthenticated("the token is not valid")
        if token.revoked:
            raise _unauthenticated("the token was revoked")
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


def _unauthenticated(detail: str) -> ProblemError:
    return ProblemError(401, detail, code="unauthenticated", headers=_CHALLENGE)


def context_of(request: Request) -> ServerContext:
    """The server's shared state (store, bus, settings, ...)."""
    context: ServerContext = request.app.state.corral
    return context


def require(role: Role) -> Callable[..., Awaitable[Principal]]:
    """A dependency that authenticates the caller, rate-limits it and checks its role."""

    async def principal(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> Principal:
        context = context_of(request)
        address = address_key(request.client.host if request.client else None)
        wait = context.auth_failures.wait(address)
        if wait is not None:
            raise ProblemError(
                429,
                "too many failed authentications from this address; slow down",
                code="rate_limited",
                headers={"Retry-After": retry_after(wait)},
            )
        try:
            if credentials is None or credentials.scheme.lower() != "bearer":
                raise _unauthenticated("send Authorization: Bearer <token>")
            token = await context.verifier.verify(credentials.credentials)
        except ProblemError:  # only 401s: a store error is not the caller's failure
            context.auth_failures.acquire(address)
            raise
        wait = context.limiter.acquire(token.id)
        if wait is not None:
            raise ProblemError(
                429,
                "too many requests for this token; slow down",
                code="rate_limited",
                headers={"Retry-After": retry_after(wait)},
            )
        if not token.role.allows(role):
            raise ProblemError(
                403,
                f"this needs the {role.value} role; the token has {token.role.value}",
                code="forbidden",
            )
        return Principal(token)

    return principal


#: Route parameters: ``who: Viewer`` authenticates the caller and needs at least that role.
Viewer = Annotated[Principal, Depends(require(Role.VIEWER))]
Operator = Annotated[Principal, Depends(require(Role.OPERATOR))]
Admin = Annotated[Principal, Depends(require(Role.ADMIN))]
