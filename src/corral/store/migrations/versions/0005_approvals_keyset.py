"""Approvals are listed in keyset pages of (requested_at, id) per namespace: an index for them.

Revision ID: 0005
Revises: 0004
Create Date: 2025-01-05
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEX = "ix_approvals_namespace_requested_at_id"


def upgrade() -> None:
    op.create_index(_INDEX, "approvals", ["namespace", "requested_at", "id"])


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="approvals")
