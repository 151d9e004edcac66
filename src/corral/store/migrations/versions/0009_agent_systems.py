"""Agent systems: a run's system and branch, and the agent messages between a system's nodes.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A migration is a frozen snapshot: it spells out its types.
Json = sa.JSON().with_variant(JSONB(), "postgresql")

_INDEX = "ix_agent_messages_system_run_id_created_at_id"


def upgrade() -> None:
    # Plain ADD COLUMN without defaults: existing runs belong to no system.
    op.add_column("runs", sa.Column("system", sa.String(63), nullable=True))
    op.add_column("runs", sa.Column("branch_id", sa.String(255), nullable=True))
    op.add_column("runs", sa.Column("parent_branch_id", sa.String(255), nullable=True))
    op.create_table(
        "agent_messages",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("system_run_id", sa.String(64), nullable=False),
        sa.Column("from_agent", sa.String(63), nullable=True),
        sa.Column("to_agent", sa.String(63), nullable=False),
        sa.Column("branch_id", sa.String(255), nullable=False),
        sa.Column("parent_branch_id", sa.String(255), nullable=True),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("payload", Json, nullable=True),
        sa.Column("idempotency_key", sa.String(255), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("hop", sa.Integer, nullable=False),
        sa.Column("child_run_id", sa.String(64), nullable=True),
        sa.Column("trace_id", sa.String(64), nullable=True),
        sa.Column("error", Json, nullable=True),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("delivered_at", sa.Double, nullable=True),
        sa.Column("finished_at", sa.Double, nullable=True),
        sa.ForeignKeyConstraint(
            ["system_run_id"],
            ["runs.id"],
            name="fk_agent_messages_system_run_id_runs",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_agent_messages"),
    )
    op.create_index(_INDEX, "agent_messages", ["system_run_id", "created_at", "id"])


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="agent_messages")
    op.drop_table("agent_messages")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("parent_branch_id")
        batch.drop_column("branch_id")
        batch.drop_column("system")
