"""Run token caps: a run's own limit on its tokens, given when it is created.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27

``runs.max_tokens``: on a child run (``agents_exec``) what its parent had left of its
``limits.max_tokens`` when the child was created; the child's agent loop stops at the
lower of that and its agent's own ``limits.max_tokens`` (as ``runs.max_cost_usd`` does
for cost, 0015). NULL: no cap of the run's own (every run before this).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("max_tokens", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("max_tokens")
