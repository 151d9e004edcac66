"""Statements several :class:`~corral.store.sql.SqlStore` operations share.

Each runs inside the caller's (write) transaction: fencing checks, re-queueing
runs whose approvals are all settled, insert-or-skip, session bookkeeping.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.errors import ConfigurationError, ConflictError
from corral.core.messages import Message
from corral.core.runs import ApprovalState, Lease, RunState
from corral.core.sessions import SessionMessage
from corral.store.schema import approvals, runs, session_messages, sessions
from corral.store.sql.rows import session_message_values
from corral.store.sql.rules import check_session_agent, judge_token, numbered, session_not_found


def _insert(dialect: str, table: sa.Table) -> Any:
    """The dialect's own ``INSERT`` construct for ``table`` (it renders ``ON CONFLICT``)."""
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table)
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table)
    raise ConfigurationError(f"the SQL store does not support the {dialect!r} dialect")


def insert_or_skip(dialect: str, table: sa.Table, conflict_columns: Sequence[str]) -> sa.Insert:
    """``INSERT ... ON CONFLICT (conflict_columns) DO NOTHING`` for ``table``.

    The statement is the same on SQLite and PostgreSQL; only the construct that
    renders it lives in each dialect's module. Conflicts on any other unique
    index (the primary key) still raise.
    """
    insert: sa.Insert = _insert(dialect, table).on_conflict_do_nothing(
        index_elements=list(conflict_columns)
    )
    return insert


async def check_fence(conn: AsyncConnection, lease: Lease) -> None:
    """Raise unless ``lease`` still holds its run (the fencing token is unchanged).

    On PostgreSQL the run row stays locked (``FOR UPDATE``) until the
    transaction ends: a claim in flight makes this wait and then read the new
    token, a claim that comes later passes the row over (``SKIP LOCKED``), so
    the token cannot change between this check and the caller's writes. The
    lock also puts the fenced writes of one run in a single line. On SQLite
    ``BEGIN IMMEDIATE`` already excludes other writers.
    """
    token = (
        await conn.execute(
            sa.select(runs.c.fencing_token).where(runs.c.id == lease.run_id).with_for_update()
        )
    ).scalar()
    judge_token(lease.run_id, token, lease)


async def lock_runs(conn: AsyncConnection, run_ids: Sequence[str]) -> None:
    """Lock the rows of ``run_ids`` (PostgreSQL; SQLite's write lock covers it) until the
    transaction ends, in id order, so that unfenced appends to a run take turns too."""
    await conn.execute(
        sa.select(runs.c.id)
        .where(runs.c.id.in_(list(run_ids)))
        .order_by(runs.c.id)
        .with_for_update()
    )


async def refuse(conn: AsyncConnection, run_id: str, lease: Lease | None) -> None:
    """Explain why a write to ``run_id`` (fenced by ``lease``) matched no row.

    Raises ``NotFoundError`` or ``LeaseLostError``; returns when the run exists
    and the token still matches, leaving the verdict to the caller.
    """
    token = (
        await conn.execute(sa.select(runs.c.fencing_token).where(runs.c.id == run_id))
    ).scalar()
    judge_token(run_id, token, lease)


#: The ``attempts`` a claim stores: one more, but never past ``max_attempts``; a claim
#: of a run that has used them all (its workers kept dying) only ends it (``Lease.exhausted``).
CLAIMED_ATTEMPTS = sa.case(
    (runs.c.attempts < runs.c.max_attempts, runs.c.attempts + 1), else_=runs.c.attempts
)
#: Whether a claim of the row finds its attempts used up (read before the claim's UPDATE).
EXHAUSTED = runs.c.attempts >= runs.c.max_attempts
#: The ``attempts`` a release that gives its attempt back stores (a worker's shutdown
#: did not fail the run): one less, never below 0.
REFUNDED_ATTEMPTS = sa.case((runs.c.attempts > 0, runs.c.attempts - 1), else_=0)


def sqlite_text(expression: sa.ClauseElement) -> str:
    """``expression`` (or a whole statement) as SQLite SQL text with its constants
    inlined (the SQLite fast path writes its statements as text but shares these rules)."""
    from sqlalchemy.dialects import sqlite

    compiled = expression.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True})
    return str(compiled)


def requeue_settled(run_ids: Sequence[str], now: float) -> sa.Update:
    """Queue each ``waiting_approval`` run of ``run_ids`` that has no pending approval left
    (the SQLite fast path runs this statement too, compiled by :func:`sqlite_text`)."""
    pending = sa.exists().where(
        approvals.c.run_id == runs.c.id, approvals.c.state == ApprovalState.PENDING.value
    )
    return (
        runs.update()
        .where(
            runs.c.id.in_(list(run_ids)),
            runs.c.state == RunState.WAITING_APPROVAL.value,
            ~pending,
        )
        .values(state=RunState.QUEUED.value, not_before=now)
    )


async def requeue_settled_runs(conn: AsyncConnection, run_ids: Sequence[str], now: float) -> None:
    """Run :func:`requeue_settled` in the caller's transaction."""
    await conn.execute(requeue_settled(run_ids, now))


def session_key(namespace: str, session_id: str) -> sa.ColumnElement[bool]:
    """The ``sessions`` row of one session (sessions are keyed by namespace and id)."""
    return sa.and_(sessions.c.namespace == namespace, sessions.c.id == session_id)


def in_session(namespace: str, session_id: str) -> sa.ColumnElement[bool]:
    """The ``session_messages`` rows of one session."""
    return sa.and_(
        session_messages.c.namespace == namespace, session_messages.c.session_id == session_id
    )


async def touch_session(conn: AsyncConnection, namespace: str, session_id: str, now: float) -> None:
    """Mark a session updated (which also write-locks its row); ``NotFoundError`` if absent."""
    result = await conn.execute(
        sessions.update().where(session_key(namespace, session_id)).values(updated_at=now)
    )
    if result.rowcount == 0:
        raise session_not_found(session_id)


async def last_seq(conn: AsyncConnection, namespace: str, session_id: str) -> int:
    """The highest message seq of a session, 0 when it has none."""
    top = (
        await conn.execute(
            sa.select(sa.func.max(session_messages.c.seq)).where(in_session(namespace, session_id))
        )
    ).scalar()
    return int(top or 0)


async def open_session(
    conn: AsyncConnection, dialect: str, namespace: str, session_id: str, agent: str, now: float
) -> sa.Row[Any]:
    """The session's row, created when absent and locked (PostgreSQL) until the transaction
    ends, so that a delete cannot slip in before the caller's writes; ``ConflictError``
    when the session belongs to another agent."""
    # An upsert, not insert-or-skip then select: it locks the row it finds in the same
    # step, so a delete cannot remove it in between (on PostgreSQL a racing delete makes
    # it wait, then insert the session anew).
    insert = _insert(dialect, sessions).values(
        namespace=namespace, id=session_id, agent=agent, created_at=now, updated_at=now
    )
    upsert = insert.on_conflict_do_update(
        # (a no-op update: it only takes the row's lock; opening a session is not using it)
        index_elements=["namespace", "id"],
        set_={"updated_at": sessions.c.updated_at},
    ).returning(*sessions.c)
    row: sa.Row[Any] = (await conn.execute(upsert)).one()
    check_session_agent(session_id, row.agent, agent)
    return row


#: The states of a run that still needs its session (a session cannot be deleted under it).
UNFINISHED = tuple(s.value for s in RunState if not s.finished)


def unfinished_run_of_session(namespace: str, session_id: str) -> sa.Select[tuple[str, str]]:
    """The oldest run of a session that is not finished (its id and state), if any."""
    return (
        sa.select(runs.c.id, runs.c.state)
        .where(
            runs.c.state.in_(UNFINISHED),
            runs.c.namespace == namespace,
            runs.c.session_id == session_id,
        )
        .order_by(runs.c.created_at, runs.c.id)
        .limit(1)
    )


def session_in_use(session_id: str, run_id: str, state: str) -> ConflictError:
    """The error of deleting a session that a run still needs."""
    return ConflictError(
        f"cannot delete session {session_id!r}: its run {run_id} is {state}; "
        "wait for it to finish or cancel it first"
    )


async def append_to_session(
    conn: AsyncConnection,
    namespace: str,
    session_id: str,
    messages: Sequence[Message],
    run_id: str | None,
    now: float,
) -> list[SessionMessage]:
    """Append ``messages`` to a session after its last seq; ``NotFoundError`` if absent."""
    # Touching the session first also locks it (PostgreSQL) for the seq below.
    await touch_session(conn, namespace, session_id, now)
    top = await last_seq(conn, namespace, session_id)
    stored = numbered(messages, top, run_id, now)
    await conn.execute(
        session_messages.insert(),
        [session_message_values(namespace, session_id, m, float(m.seq)) for m in stored],
    )
    return stored
