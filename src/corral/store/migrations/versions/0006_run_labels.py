"""Runs carry labels (``corral submit -l key=value``), selected by JSON path.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A migration is a frozen snapshot: it spells out its types instead of
# importing them from corral.store.schema, which keeps changing.
Json = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    # A constant default: existing runs get no labels in place, without a table rebuild.
    op.add_column("runs", sa.Column("labels", Json, nullable=False, server_default="{}"))


def downgrade() -> None:
    op.drop_column("runs", "labels")
