"""The tables of the SQL store, as SQLAlchemy Core metadata.

Types are chosen to be dialect neutral: ``JSON`` becomes ``JSONB`` on
PostgreSQL, times are epoch seconds as double precision. Changing a table here
needs a new migration in ``migrations/versions`` (and ``LATEST_REVISION``
bumped): the schema of a database is only ever changed by migrations.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

LATEST_REVISION = "0020_memory_fulltext"
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
    # Durable task columns (0002).
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
    # A run's labels (0006), selected by JSON path (``tasks list -l``).
    sa.Column("labels", Json, nullable=False, server_default="{}"),
    # Child runs (0007): the run whose agents_exec call started this one, and its depth.
    sa.Column("parent_run_id", sa.String(64), nullable=True),
    sa.Column("depth", sa.Integer, nullable=False, server_default="0"),
    # Agent systems (0009): the system of a system run and of its node runs, their branch.
    sa.Column("system", sa.String(63), nullable=True),
    sa.Column("branch_id", sa.String(255), nullable=True),
    sa.Column("parent_branch_id", sa.String(255), nullable=True),
    # Handoffs (0011): the agent the run went on under (NULL: the submitted one).
    sa.Column("active_agent", sa.String(63), nullable=True),
    # Run deadlines (0013): when a system run's limits.timeout_seconds passes (upkeep's sweep).
    sa.Column("deadline_at", sa.Double, nullable=True),
    # Coordinator positions (0014): what a system run's last pass knew (runtime/systems.py).
    sa.Column("position", Json, nullable=True),
    # Run cost caps (0015): what a node run may spend (its system run's budget left).
    sa.Column("max_cost_usd", sa.Double, nullable=True),
    # Run token caps (0017; 64 bits on PostgreSQL since 0019, as limits.max_tokens).
    sa.Column("max_tokens", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
    sa.Index("ix_runs_parent_run_id", "parent_run_id"),
    sa.Index("ix_runs_deadline_at", "deadline_at"),
    sa.Index("ix_runs_namespace_agent_created_at", "namespace", "agent", "created_at"),
    # A session's runs, newest first (A2A ListTasks by contextId, 0018).
    sa.Index("ix_runs_namespace_session_id_created_at", "namespace", "session_id", "created_at"),
    # NULL keys never collide (SQLite and PostgreSQL alike): only keyed submits are deduplicated.
    sa.Index(
        "uq_runs_namespace_agent_idempotency_key",
        "namespace",
        "agent",
        "idempotency_key",
        unique=True,
    ),
    # Claiming walks one state in claim order (priority DESC, created_at, id) and stops at LIMIT.
    sa.Index("ix_runs_claim", "state", sa.desc("priority"), "created_at", "id"),
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

approvals = sa.Table(
    "approvals",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column(
        "run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    ),
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
    sa.Index("ix_approvals_namespace_state", "namespace", "state"),
    # A namespace's approvals are listed in keyset pages of (requested_at, id) (0005).
    sa.Index("ix_approvals_namespace_requested_at_id", "namespace", "requested_at", "id"),
    sa.Index("ix_approvals_run_id", "run_id"),
    # The expiry sweep looks only at pending approvals with a deadline.
    sa.Index("ix_approvals_state_expires_at", "state", "expires_at"),
)

# Sessions are namespaced (0004): the same id in two namespaces is two sessions.
sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("namespace", sa.String(63), primary_key=True),
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("agent", sa.String(63), nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.Index("ix_sessions_namespace_updated_at", "namespace", "updated_at"),
)

session_messages = sa.Table(
    "session_messages",
    metadata,
    sa.Column("namespace", sa.String(63), primary_key=True),
    sa.Column("session_id", sa.String(64), primary_key=True),
    # ``seq`` numbers messages as appended; ``position`` orders them. An ordinary
    # message has position == seq; a compaction summary gets a position between
    # the last message it hides and the first one it leaves visible.
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("position", sa.Double, nullable=False),
    sa.Column("message", Json, nullable=False),
    sa.Column("run_id", sa.String(64), nullable=True),
    sa.Column("hidden", sa.Boolean, nullable=False),
    sa.Column("summary", sa.Boolean, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.ForeignKeyConstraint(
        ["namespace", "session_id"],
        ["sessions.namespace", "sessions.id"],
        name="fk_session_messages_namespace_sessions",
        ondelete="CASCADE",
    ),
    sa.Index(
        "ix_session_messages_namespace_session_id_position", "namespace", "session_id", "position"
    ),
)

api_tokens = sa.Table(
    "api_tokens",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("namespace", sa.String(63), nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("name", sa.String(255), nullable=False, server_default=""),
    sa.Column("description", sa.Text, nullable=False, server_default=""),
    # SHA-256 of the secret, hex; the secret itself is never stored (core/tokens.py).
    sa.Column("secret_hash", sa.String(64), nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("last_used_at", sa.Double, nullable=True),
    sa.Column("revoked_at", sa.Double, nullable=True),
    sa.Index("ix_api_tokens_namespace_created_at", "namespace", "created_at"),
)

# Memory entries (0008). Their full-text index lives in the searching process, not in
# the database (corral.store.sql.fulltext; the database's own went in 0020).
memory_entries = sa.Table(
    "memory_entries",
    metadata,
    # The rowid on SQLite (an INTEGER PRIMARY KEY is the rowid there).
    sa.Column(
        "id",
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    sa.Column("namespace", sa.String(63), nullable=False),
    sa.Column("memory", sa.String(63), nullable=False),
    sa.Column("scope_key", sa.String(255), nullable=False),
    sa.Column("key", sa.String(255), nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("metadata", Json, nullable=False),
    sa.Column("idempotency_key", sa.String(255), nullable=True),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.Index("uq_memory_entries_place_key", "namespace", "memory", "scope_key", "key", unique=True),
    # A tool call writes once: its idempotency key is unique within the Memory.
    sa.Index(
        "uq_memory_entries_idempotency_key",
        "namespace",
        "memory",
        "idempotency_key",
        unique=True,
    ),
    # Retention drops a scope's oldest entries first.
    sa.Index(
        "ix_memory_entries_place_updated_at", "namespace", "memory", "scope_key", "updated_at"
    ),
)

# Memory generations (0012): a counter per scope of a Memory, raised in the transaction of
# every write, delete and prune of its entries, so a process caching the scope's vectors
# (corral.store.sql.vector_cache) sees with one small read whether they changed. A row is
# never deleted (deleting the Memory raises its scopes' counters): a counter never repeats.
memory_generations = sa.Table(
    "memory_generations",
    metadata,
    sa.Column("namespace", sa.String(63), primary_key=True),
    sa.Column("memory", sa.String(63), primary_key=True),
    sa.Column("scope_key", sa.String(255), primary_key=True),
    sa.Column("generation", sa.BigInteger, nullable=False),
)

# Memory changes (0016): the entries each raise of a scope's generation wrote or deleted
# (entry id 0: none), so a process caching the scope's vectors reloads only those. Each
# write keeps the scope's last generations (KEPT_GENERATIONS in corral.store.sql.memory).
memory_changes = sa.Table(
    "memory_changes",
    metadata,
    sa.Column("namespace", sa.String(63), primary_key=True),
    sa.Column("memory", sa.String(63), primary_key=True),
    sa.Column("scope_key", sa.String(255), primary_key=True),
    sa.Column("generation", sa.BigInteger, primary_key=True),
    sa.Column("entry_id", sa.BigInteger, primary_key=True),
)

# Agent messages (0009): the hops of a system run between its nodes (core/agent_messages.py).
agent_messages = sa.Table(
    "agent_messages",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("namespace", sa.String(63), nullable=False),
    sa.Column(
        "system_run_id",
        sa.String(64),
        sa.ForeignKey("runs.id", ondelete="CASCADE"),
        nullable=False,
    ),
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
    # A system run's messages are listed in keyset pages of (created_at, id).
    sa.Index("ix_agent_messages_system_run_id_created_at_id", "system_run_id", "created_at", "id"),
    # A coordinator's pass reads only a system run's unfinished messages (0014).
    sa.Index("ix_agent_messages_system_run_id_state", "system_run_id", "state"),
)

#: name prefixes of what the migrated schema has beyond ``metadata`` (see memory_entries)
DIALECT_OBJECTS = ("memory_vectors",)
