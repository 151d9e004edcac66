"""``corral token create|list|revoke``: API tokens, straight in the store.

Whoever reaches the store (``CORRAL_HOME``, ``CORRAL_DB_URL``) operates the
deployment, so these commands need no token themselves and may make tokens of
any namespace - the first admin of a new namespace comes from here.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import typer

from corral.cli.common import EXIT_BAD_INPUT, fail, run_async
from corral.cli.output import output_option

if TYPE_CHECKING:
    from corral.core.tokens import ApiToken

token_app = typer.Typer(help="API tokens of the HTTP server.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(token_app, name="token")


@token_app.callback()
def _store_only() -> None:
    # These commands work on the store; over the API, tokens are /v1/tokens (corral.client).
    from corral.cli.connect import require_local

    require_local("token")


@token_app.command("create")
def create(
    namespace: str = typer.Option(..., "-n", "--namespace", help="The token's namespace."),
    role: str = typer.Option(..., "--role", help="admin, operator or viewer."),
    name: str = typer.Option("", "--name", help="A label, shown in listings and audit."),
    description: str = typer.Option("", "--description"),
) -> None:
    """Create a token and print it once (stdout); only its hash is stored."""
    from corral.core.tokens import Role, mint_token
    from corral.resources.kinds import NAME_PATTERN

    try:
        chosen = Role(role)
    except ValueError:
        fail(f"unknown role {role!r}; roles are admin, operator, viewer", EXIT_BAD_INPUT)
    if not re.match(NAME_PATTERN, namespace):
        fail(f"{namespace!r} is not a valid namespace name", EXIT_BAD_INPUT)
    token, plain = mint_token(namespace, chosen, name=name, description=description)

    async def go() -> None:
        from corral.cli.connect import open_cli_store

        async with open_cli_store() as (store, _):
            await store.create_token(token)

    run_async(go())
    typer.echo(
        f"token {token.id} ({chosen.value} in namespace {namespace!r}); shown once:", err=True
    )
    typer.echo(plain)


@token_app.command("list")
def list_tokens(
    namespace: str | None = typer.Option(None, "-n", "--namespace", help="Only this namespace."),
    output: str = output_option(),
) -> None:
    """Tokens (never their secrets), revoked ones included."""
    from corral.api import TokenOut
    from corral.cli.output import print_list
    from corral.cli.views import TOKEN

    async def go() -> list[ApiToken]:
        from corral.cli.connect import open_cli_store

        async with open_cli_store() as (store, _):
            return await store.list_tokens(namespace)

    tokens = [TokenOut.from_token(t) for t in run_async(go())]
    print_list(TOKEN, tokens, output, namespace=namespace)


@token_app.command("revoke")
def revoke(token_id: str = typer.Argument(..., help="The token's id (tok_...).")) -> None:
    """Revoke a token; servers refuse it within seconds."""

    async def go() -> ApiToken:
        from corral.cli.connect import open_cli_store

        async with open_cli_store() as (store, _):
            return await store.revoke_token(token_id)

    token = run_async(go())
    typer.echo(f"token {token.id} revoked")
