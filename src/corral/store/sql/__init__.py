"""The SQL store: SQLAlchemy Core over an async driver (``sqlite+aiosqlite``, ``postgresql+asyncpg``).

The statements are dialect neutral. On SQLite every connection runs in WAL
mode with ``synchronous=FULL``, foreign keys on and a busy timeout;
SQLAlchemy (not the sqlite3 module) emits ``BEGIN``, and write transactions
use ``BEGIN IMMEDIATE`` so that a read-check-write (apply, delete, claim, a
fenced write) cannot interleave with another writer. On PostgreSQL
(``READ COMMITTED``) the statements lock the rows they decide on instead:
claims take ``FOR UPDATE SKIP LOCKED``, fenced writes lock the run row while
they check its token, idempotent submits let the unique index decide with
``ON CONFLICT DO NOTHING``. Every operation is one transaction, run by
``_read`` or ``_write`` (:mod:`corral.store.sql.engine`), which retry it when
the connection drops (:mod:`corral.store.sql.transaction`).

The schema is created and upgraded by alembic when the store opens; a store
already at :data:`~corral.store.schema.LATEST_REVISION` opens without
importing alembic at all.

:class:`SqlStore` is composed of one part per table group, each a module of
this package over the shared :class:`~corral.store.sql.engine.SqlEngine`:
resources, runs, claims (runs as tasks), approvals, sessions, events and
tokens, memory entries, agent messages. :mod:`~corral.store.sql.statements` holds the statements several
parts share, :mod:`~corral.store.sql.rows` the rows <-> records mapping.
"""

from __future__ import annotations

from corral.store.sql.agent_messages import SqlAgentMessages
from corral.store.sql.approvals import SqlApprovals
from corral.store.sql.claims import SqlClaims
from corral.store.sql.database import BUSY_TIMEOUT_SECONDS, MIGRATIONS_DIR, async_url
from corral.store.sql.events_tokens import SqlEventsTokens
from corral.store.sql.memory import SqlMemory
from corral.store.sql.resources import SqlResources
from corral.store.sql.runs import SqlRuns
from corral.store.sql.sessions import SqlSessions

__all__ = ["BUSY_TIMEOUT_SECONDS", "MIGRATIONS_DIR", "SqlStore", "async_url"]


class SqlStore(
    SqlResources,
    SqlRuns,
    SqlClaims,
    SqlApprovals,
    SqlSessions,
    SqlEventsTokens,
    SqlMemory,
    SqlAgentMessages,
):
    """A :class:`~corral.store.base.Store` on a SQL database. Create it with :meth:`open`
    (or :func:`corral.store.open_store`, which also picks the SQLite fast path)."""
