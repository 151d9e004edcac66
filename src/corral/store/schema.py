"""The tables of the SQL store, as SQLAlchemy Core metadata.

Types are chosen to be dialect neutral: ``JSON`` becomes ``JSONB`` on
PostgreSQL, times are epoch seconds as double precision. Changing a table here
needs a new migration in ``migrations/versions`` (and ``LATEST_REVISION``
bumped): the schema of a database is only ever changed by migrations.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

LATEST_REVISION = "0001"
"""The head of ``migrations/versions``; a store at this revision opens without alembic."""

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

Json = sa.JSON().with_variant(JSONB(), "postgresql")

resources = sa.Table(
    "resources",
    metadata,
    sa.Column("namespace", sa.String(63), primary_key=True),
    sa.Column("kind", sa.String(63), primary_key=True),
    sa.Column("name", sa.String(63), primary_key=True),
    sa.Column("spec", Json, nullable=False),
    sa.Column("labels", Json, nullable=False),
    sa.Column("generation", sa.Integer, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
)

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
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
    sa.Index("ix_runs_namespace_agent_created_at", "namespace", "agent", "created_at"),
)

run_events = sa.Table(
    "run_events",
    metadata,
    sa.Column(
        "run_id",
        sa.String(64),
        sa.ForeignKey("runs.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("type", sa.String(64), nullable=False),
    sa.Column("ts", sa.Double, nullable=False),
    sa.Column("data", Json, nullable=False),
)
