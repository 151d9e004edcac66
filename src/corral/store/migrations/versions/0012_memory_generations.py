"""Memory generations: a counter per scope of a Memory, raised by every change.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27

``memory_generations`` holds one row per (namespace, memory, scope key) that was ever
written. Every write, delete and prune of the scope's entries raises its ``generation``
in the same transaction; a process that keeps the scope's vectors in memory reads the
counter before each search and reloads them when it moved (see
``corral.store.sql.vector_cache``). Existing scopes start without a row (generation 0).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "memory_generations",
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("memory", sa.String(63), nullable=False),
        sa.Column("scope_key", sa.String(255), nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("namespace", "memory", "scope_key", name="pk_memory_generations"),
    )


def downgrade() -> None:
    op.drop_table("memory_generations")
