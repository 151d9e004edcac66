"""Run token caps of 64 bits: ``runs.max_tokens`` holds what ``limits.max_tokens`` does.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27

``limits.max_tokens`` is any positive 64-bit integer, and a child run's cap (0017) is
what its parent had left of it: on PostgreSQL an ``INTEGER`` (32 bits) refused a cap past
2,147,483,647, so an agent allowed more could start no child run. SQLite's integers are
64 bits already: nothing changes there.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column("runs", "max_tokens", type_=sa.BigInteger, existing_nullable=True)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column("runs", "max_tokens", type_=sa.Integer, existing_nullable=True)
