"""Alembic environment of the Corral store.

Corral runs migrations itself (see ``corral.store.sql``): it hands alembic an
open connection through ``config.attributes["connection"]``. Offline (SQL
script) mode is not supported.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from corral.store.schema import metadata


def run_migrations_online() -> None:
    """Run the migrations on the connection Corral passed in."""
    connection = context.config.attributes.get("connection")
    if not isinstance(connection, Connection):
        raise RuntimeError("Corral migrations run through corral.store, with a connection")
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("Corral migrations do not support offline mode")
run_migrations_online()
