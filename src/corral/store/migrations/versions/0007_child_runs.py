"""Child runs: a run started by another run's ``agents_exec`` call names its parent.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEX = "ix_runs_parent_run_id"


def upgrade() -> None:
    # Plain ADD COLUMN with constant defaults: existing runs are top-level runs of depth 0.
    op.add_column("runs", sa.Column("parent_run_id", sa.String(64), nullable=True))
    op.add_column("runs", sa.Column("depth", sa.Integer, nullable=False, server_default="0"))
    # A finishing child looks for its unfinished siblings; a parent lists its children.
    op.create_index(_INDEX, "runs", ["parent_run_id"])


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("depth")
        batch.drop_column("parent_run_id")
