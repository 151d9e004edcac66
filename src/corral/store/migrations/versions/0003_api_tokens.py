"""API tokens of the HTTP server: namespace, role, the hash of the secret, revocation.

Revision ID: 0003
Revises: 0002
Create Date: 2025-01-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain types only (strings, text, double precision): the same DDL on SQLite and PostgreSQL.
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("name", sa.String(255), nullable=False, server_default=""),
        sa.Column("description", sa.Text, nullable=False, server_default=""),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("last_used_at", sa.Double, nullable=True),
        sa.Column("revoked_at", sa.Double, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
    )
    op.create_index("ix_api_tokens_namespace_created_at", "api_tokens", ["namespace", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_api_tokens_namespace_created_at", table_name="api_tokens")
    op.drop_table("api_tokens")
