"""Coordinator positions: what a system run's last pass knew, so the next reads only changes.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27

``runs.position`` (JSON) is saved with each pass of a system run's coordinator: the
claim (fencing token) it ran under, the seq of its last event, how many messages the
run has, and its unfinished messages with what the journal says of each. The next pass,
under the very next claim, reads only the run's unfinished messages (the new index on
``agent_messages (system_run_id, state)``), their node runs and two events; after any
other claim (a crash, a release) it rebuilds from everything, as before. Existing runs
get NULL: their next pass rebuilds.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Json = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column("runs", sa.Column("position", Json, nullable=True))
    op.create_index(
        "ix_agent_messages_system_run_id_state", "agent_messages", ["system_run_id", "state"]
    )


def downgrade() -> None:
    op.drop_index("ix_agent_messages_system_run_id_state", table_name="agent_messages")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("position")
