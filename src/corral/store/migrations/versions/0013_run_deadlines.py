"""Run deadlines: when a run's time limit passes, for a worker's upkeep to act on.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27

``runs.deadline_at`` is set by a system run's coordinator at its first pass (its start
plus ``limits.timeout_seconds``). A system run parked in ``waiting_children`` past it is
queued by any worker's upkeep (``Store.queue_overdue_runs``), and its coordinator fails
it: a node that hangs no longer keeps its system run waiting past the system's timeout.
Existing runs get NULL (no deadline): a system run parked before the upgrade gets one
at its next pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("deadline_at", sa.Double, nullable=True))
    op.create_index("ix_runs_deadline_at", "runs", ["deadline_at"])


def downgrade() -> None:
    op.drop_index("ix_runs_deadline_at", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("deadline_at")
