"""Runs are listed by session (A2A ``ListTasks`` by ``contextId``): an index for them.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27

Without it a listing of one session reads every run of its agent, newest first, until it
has found a page; with it, the session's runs only.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEX = "ix_runs_namespace_session_id_created_at"


def upgrade() -> None:
    op.create_index(_INDEX, "runs", ["namespace", "session_id", "created_at"])


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="runs")
