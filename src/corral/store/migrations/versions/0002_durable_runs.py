"""Durable runs: task and lease columns on runs; approvals, sessions, session messages.

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A migration is a frozen snapshot: it spells out its types instead of
# importing them from corral.store.schema, which keeps changing.
Json = sa.JSON().with_variant(JSONB(), "postgresql")


def _run_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("session_id", sa.String(64), nullable=True),
        sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
        sa.Column("not_before", sa.Double, nullable=False, server_default="0"),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("max_attempts", sa.Integer, nullable=False, server_default="3"),
        sa.Column("cancel_requested", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("lease_owner", sa.String(255), nullable=True),
        sa.Column("lease_expires_at", sa.Double, nullable=True),
        sa.Column("fencing_token", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("output_schema", Json, nullable=True),
    ]


def upgrade() -> None:
    # Plain ADD COLUMN with constant defaults: existing runs migrate in place on
    # SQLite and PostgreSQL alike, without a table rebuild.
    for column in _run_columns():
        op.add_column("runs", column)
    op.create_index(
        "uq_runs_namespace_agent_idempotency_key",
        "runs",
        ["namespace", "agent", "idempotency_key"],
        unique=True,
    )
    op.create_index(
        "ix_runs_claim", "runs", ["state", sa.desc(sa.column("priority")), "created_at", "id"]
    )

    op.create_table(
        "approvals",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("agent", sa.String(63), nullable=False),
        sa.Column("call_id", sa.String(255), nullable=False),
        sa.Column("tool", sa.String(255), nullable=False),
        sa.Column("arguments", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("requested_at", sa.Double, nullable=False),
        sa.Column("expires_at", sa.Double, nullable=True),
        sa.Column("decided_at", sa.Double, nullable=True),
        sa.Column("decided_by", sa.String(255), nullable=True),
        sa.Column("decision_reason", sa.Text, nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_approvals_run_id_runs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_approvals"),
    )
    op.create_index("ix_approvals_namespace_state", "approvals", ["namespace", "state"])
    op.create_index("ix_approvals_run_id", "approvals", ["run_id"])
    op.create_index("ix_approvals_state_expires_at", "approvals", ["state", "expires_at"])

    op.create_table(
        "sessions",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("agent", sa.String(63), nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_sessions"),
    )
    op.create_index("ix_sessions_namespace_updated_at", "sessions", ["namespace", "updated_at"])

    op.create_table(
        "session_messages",
        sa.Column("session_id", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("position", sa.Double, nullable=False),
        sa.Column("message", Json, nullable=False),
        sa.Column("run_id", sa.String(64), nullable=True),
        sa.Column("hidden", sa.Boolean, nullable=False),
        sa.Column("summary", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name="fk_session_messages_session_id_sessions",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", "seq", name="pk_session_messages"),
    )
    op.create_index(
        "ix_session_messages_session_id_position", "session_messages", ["session_id", "position"]
    )


def downgrade() -> None:
    op.drop_index("ix_session_messages_session_id_position", table_name="session_messages")
    op.drop_table("session_messages")
    op.drop_index("ix_sessions_namespace_updated_at", table_name="sessions")
    op.drop_table("sessions")
    op.drop_index("ix_approvals_state_expires_at", table_name="approvals")
    op.drop_index("ix_approvals_run_id", table_name="approvals")
    op.drop_index("ix_approvals_namespace_state", table_name="approvals")
    op.drop_table("approvals")
    op.drop_index("ix_runs_claim", table_name="runs")
    op.drop_index("uq_runs_namespace_agent_idempotency_key", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        for column in reversed(_run_columns()):
            batch.drop_column(column.name)
