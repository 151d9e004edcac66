"""Run cost caps: a run's own limit on its cost, given when it is created.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27

``runs.max_cost_usd``: a system run's ``limits.max_cost_usd`` (set by its coordinator),
and on each of its node runs what the system run had left of it when the node run was
created; a node run's agent loop stops at the lower of that and its agent's own
``limits.max_cost_usd``. NULL: no cap of the run's own (every run before this).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("max_cost_usd", sa.Double, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("max_cost_usd")
