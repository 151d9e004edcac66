"""Namespaced sessions: a session's key is (namespace, id), and its messages carry the namespace.

Revision ID: 0004
Revises: 0003
Create Date: 2025-01-04

Every stored session already names its namespace (the one of the run that opened
it); its messages take it over from their session. The two tables are rebuilt
the same way on SQLite and PostgreSQL: their rows are copied aside, the tables
dropped (messages first, so no ``ON DELETE CASCADE`` fires) and created anew with
the new keys, and the rows copied back.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A migration is a frozen snapshot: it spells out its types instead of
# importing them from corral.store.schema, which keeps changing.
Json = sa.JSON().with_variant(JSONB(), "postgresql")

_SESSION_COLUMNS = "namespace, id, agent, created_at, updated_at"
_MESSAGE_COLUMNS = "session_id, seq, position, message, run_id, hidden, summary, created_at"


def _copy_aside() -> None:
    op.execute(f"CREATE TABLE sessions_0003 AS SELECT {_SESSION_COLUMNS} FROM sessions")
    op.execute(
        "CREATE TABLE session_messages_0003 AS SELECT s.namespace AS namespace, "
        + ", ".join(f"m.{c.strip()} AS {c.strip()}" for c in _MESSAGE_COLUMNS.split(","))
        + " FROM session_messages m JOIN sessions s ON s.id = m.session_id"
    )
    op.drop_table("session_messages")
    op.drop_table("sessions")


def _copy_back(message_columns: str) -> None:
    op.execute(
        f"INSERT INTO sessions ({_SESSION_COLUMNS}) SELECT {_SESSION_COLUMNS} FROM sessions_0003"
    )
    op.execute(
        f"INSERT INTO session_messages ({message_columns})"
        f" SELECT {message_columns} FROM session_messages_0003"
    )
    op.drop_table("session_messages_0003")
    op.drop_table("sessions_0003")


def _message_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("session_id", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("position", sa.Double, nullable=False),
        sa.Column("message", Json, nullable=False),
        sa.Column("run_id", sa.String(64), nullable=True),
        sa.Column("hidden", sa.Boolean, nullable=False),
        sa.Column("summary", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
    ]


def upgrade() -> None:
    _copy_aside()
    op.create_table(
        "sessions",
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("agent", sa.String(63), nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("namespace", "id", name="pk_sessions"),
    )
    op.create_index("ix_sessions_namespace_updated_at", "sessions", ["namespace", "updated_at"])
    op.create_table(
        "session_messages",
        sa.Column("namespace", sa.String(63), nullable=False),
        *_message_columns(),
        sa.ForeignKeyConstraint(
            ["namespace", "session_id"],
            ["sessions.namespace", "sessions.id"],
            name="fk_session_messages_namespace_sessions",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("namespace", "session_id", "seq", name="pk_session_messages"),
    )
    op.create_index(
        "ix_session_messages_namespace_session_id_position",
        "session_messages",
        ["namespace", "session_id", "position"],
    )
    _copy_back(f"namespace, {_MESSAGE_COLUMNS}")


def downgrade() -> None:
    """Back to global session ids: fails (nothing changed) when two namespaces share one."""
    _copy_aside()
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
        *_message_columns(),
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
    _copy_back(_MESSAGE_COLUMNS)
