"""API tokens over the API: an admin manages the tokens of its own namespace.

Tokens of other namespaces (and the first admin token) are made with
``corral token create`` on a machine that reaches the store.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from corral.api import ID_PATTERN, CreateToken, TokenCreated, TokenOut, TokenPage
from corral.core.errors import NotFoundError
from corral.core.tokens import ApiToken, mint_token
from corral.server import pagination
from corral.server.auth import Admin, Principal, Viewer
from corral.server.context import ServerContext, context_of
from corral.server.problems import ProblemError, responses

router = APIRouter(prefix="/v1", tags=["tokens"])

TokenId = Annotated[str, Path(max_length=64, pattern=ID_PATTERN, description="The token's id.")]


async def _own(context: ServerContext, token_id: str, who: Principal) -> ApiToken:
    token = await context.store.get_token(token_id)
    if token is None or token.namespace != who.namespace:
        raise NotFoundError(f"token {token_id!r} not found")
    return token


@router.get("/tokens", response_model=TokenPage, summary="List tokens", responses=responses())
async def list_tokens(
    who: Admin,
    request: Request,
    limit: pagination.Limit = 100,
    cursor: pagination.Cursor = None,
) -> TokenPage:
    """The namespace's tokens (revoked ones too), oldest first; never their secrets."""
    found = await context_of(request).store.list_tokens(
        who.namespace, limit=limit + 1, after=pagination.position(cursor, (float, str))
    )
    page, next_cursor = pagination.keyset_page(found, limit, lambda t: (t.created_at, t.id))
    return TokenPage(items=[TokenOut.from_token(t) for t in page], next_cursor=next_cursor)


@router.post(
    "/tokens",
    status_code=201,
    response_model=TokenCreated,
    summary="Create a token",
    responses=responses(),
)
async def create_token(
    body: CreateToken, who: Admin, request: Request, response: Response
) -> TokenCreated:
    """A new token of the caller's namespace. The `token` field is the only time the
    secret is shown."""
    token, plain = mint_token(
        who.namespace, body.role, name=body.name, description=body.description
    )
    await context_of(request).store.create_token(token)
    response.headers["Location"] = f"/v1/tokens/{token.id}"
    return TokenCreated.from_created(token, plain)


@router.get("/whoami", response_model=TokenOut, summary="Who am I", responses=responses())
async def whoami(who: Viewer) -> TokenOut:
    """The token of this request: its namespace and role (any role may ask; never the
    secret). The CLI checks a namespace asked for with `-n` against it."""
    return TokenOut.from_token(who.token)


@router.get(
    "/tokens/{token_id}",
    response_model=TokenOut,
    summary="Get a token",
    responses=responses(404),
)
async def get_token(token_id: TokenId, who: Admin, request: Request) -> TokenOut:
    return TokenOut.from_token(await _own(context_of(request), token_id, who))


@router.post(
    "/tokens/{token_id}/revoke",
    response_model=TokenOut,
    summary="Revoke a token",
    responses=responses(404, 409),
)
async def revoke_token(token_id: TokenId, who: Admin, request: Request) -> TokenOut:
    """The token stops working at once on this server (within seconds on others).

    A token never revokes itself (409 `own_token`): it may be the namespace's last admin
    token, and then only `corral token create` on a machine that reaches the store could
    make another (a client exploring the API, a fuzzer, would lock itself out). Revoke it
    with another admin token of the namespace, or `corral token revoke` on such a machine."""
    context = context_of(request)
    await _own(context, token_id, who)
    if token_id == who.token.id:
        raise ProblemError(
            409,
            "a token cannot revoke itself: revoke it with another admin token of this "
            "namespace, or with `corral token revoke` on a machine that reaches the store",
            code="own_token",
        )
    revoked = await context.store.revoke_token(token_id)
    context.verifier.forget(token_id)
    return TokenOut.from_token(revoked)
