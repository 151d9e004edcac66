"""Who is calling: bearer tokens, their namespace and role, and the rate limits.

Every ``/v1`` operation declares the least role it needs with :func:`require`:
viewer reads, operator also submits, cancels, decides approvals, prompts and
deletes sessions, admin also applies resources and manages tokens. A missing,
malformed, unknown or revoked token is 401 (with ``WWW-Authenticate``); a role
below the operation's is 403, and so is an agent token (a JWT, see
:mod:`corral.server.routes_links`, the only routes that take one). Objects of another namespace are answered 404 by
the routes, never 403: a token learns nothing about namespaces it is not in.

Tokens are checked by the :class:`~corral.server.verifier.TokenVerifier` of the
server's context (cached).

Failed authentications are limited per client address
(``CORRAL_API_AUTH_FAILURE_RATE`` and ``_BURST``): past its bucket an address
gets 429 with ``Retry-After`` before its token is looked at, so guessing tokens
costs no store lookup. A request without a bearer token guesses nothing: it is 401,
never counted nor held back. Successful requests are limited per token only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from corral.core.tokens import ApiToken, Role
from corral.runtime.agent_tokens import looks_like_agent_token
from corral.server.context import context_of
from corral.server.limits import address_key, refuse_while_waiting
from corral.server.problems import ProblemError
from corral.server.verifier import unauthenticated

_bearer = HTTPBearer(
    auto_error=False,
    bearerFormat="corral_<id>_<secret>",
    description="An API token from `corral token create` (or POST /v1/tokens).",
)


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


def require(role: Role) -> Callable[..., Awaitable[Principal]]:
    """A dependency that authenticates the caller, rate-limits it and checks its role."""

    async def principal(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> Principal:
        context = context_of(request)
        if credentials is None or credentials.scheme.lower() != "bearer":
            # no bearer token at all guesses nothing: 401, neither counted nor held back
            raise unauthenticated("send Authorization: Bearer <token>")
        address = address_key(request.client.host if request.client else None)
        refuse_while_waiting(
            context.auth_failures.wait(address), "failed authentications from this address"
        )
        if looks_like_agent_token(credentials.credentials):
            raise ProblemError(
                403, "an agent token is accepted only on /v1/links", code="agent_token_not_allowed"
            )
        try:
            token = await context.verifier.verify(credentials.credentials)
        except ProblemError:  # only 401s: a store error is not the caller's failure
            context.auth_failures.acquire(address)
            raise
        refuse_while_waiting(context.limiter.acquire(token.id), "requests for this token")
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
