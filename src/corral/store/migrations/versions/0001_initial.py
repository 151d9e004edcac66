"""Initial schema: resources, runs, run events.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A migration is a frozen snapshot: it spells out its types instead of
# importing them from corral.store.schema, which keeps changing.
Json = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "resources",
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("kind", sa.String(63), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("spec", Json, nullable=False),
        sa.Column("labels", Json, nullable=False),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("namespace", "kind", "name", name="pk_resources"),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("agent", sa.String(63), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("input", sa.Text, nullable=False),
        sa.Column("output", Json, nullable=True),
        sa.Column("error", Json, nullable=True),
        sa.Column("usage", Json, nullable=False),
        sa.Column("cost_usd", sa.Double, nullable=False),
        sa.Column("steps", sa.Integer, nullable=False),
        sa.Column("messages", Json, nullable=False),
        sa.Column("pending", Json, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("started_at", sa.Double, nullable=True),
        sa.Column("finished_at", sa.Double, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
    )
    op.create_index(
        "ix_runs_namespace_agent_created_at", "runs", ["namespace", "agent", "created_at"]
    )
    op.create_table(
        "run_events",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("ts", sa.Double, nullable=False),
        sa.Column("data", Json, nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_run_events_run_id_runs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "seq", name="pk_run_events"),
    )


def downgrade() -> None:
    op.drop_table("run_events")
    op.drop_index("ix_runs_namespace_agent_created_at", table_name="runs")
    op.drop_table("runs")
    op.drop_table("resources")
