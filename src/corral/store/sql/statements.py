"""Statements several :class:`~corral.store.sql.SqlStore` operations share.

Each runs inside the caller's (write) transaction: fencing checks, re-queueing
runs whose approvals are all settled, insert-or-skip, session bookkeeping.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.agent_messages import MessageState
from corral.core.errors import ConfigurationError, ConflictError
from corral.core.messages import Message
from corral.core.runs import ApprovalState, Lease, RunState
from corral.core.sessions import SessionMessage
from corral.store.schema import (
    agent_messages,
    approvals,
    resources,
    run_events,
    runs,
    session_messages,
    sessions,
)
from corral.store.sql.rows import SESSION_MESSAGES
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
    token = (await conn.execute(fencing_token(lease.run_id).with_for_update())).scalar()
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
    token = (await conn.execute(fencing_token(run_id))).scalar()
    judge_token(run_id, token, lease)


#: A value of a statement: what it is compared with or set to, or an ``sa.bindparam`` in
#: its place. The builders below take either: the SQLAlchemy path passes values, the
#: SQLite fast path bind parameters once and compiles the statement it gets back.
Value = Any


def run_by_id(run_id: Value) -> sa.Select[Any]:
    """The whole row of one run."""
    return sa.select(runs).where(runs.c.id == run_id)


def fencing_token(run_id: Value) -> sa.Select[Any]:
    """The fencing token of one run (no row: no such run)."""
    return sa.select(runs.c.fencing_token).where(runs.c.id == run_id)


#: The unique key of an idempotent submit: an agent's runs have one per key.
IDEMPOTENCY_COLUMNS = ("namespace", "agent", "idempotency_key")


def run_by_key(namespace: Value, agent: Value, key: Value) -> sa.Select[Any]:
    """The run an agent's idempotent submit stored under ``key``."""
    return sa.select(runs).where(
        runs.c.namespace == namespace, runs.c.agent == agent, runs.c.idempotency_key == key
    )


def parent_of_new_child(parent_id: Value) -> sa.Select[Any]:
    """The state and cancel flag of the run a child run is submitted under (no row: gone),
    share-locked on PostgreSQL until the submit commits: a cancel's cascade (which locks
    the parent first) then either sees the new child or is seen by the submit."""
    return (
        sa.select(runs.c.state, runs.c.cancel_requested)
        .where(runs.c.id == parent_id)
        .with_for_update(read=True)
    )


def allowance_holders(parent_id: Value, group: Value) -> sa.Select[Any]:
    """What the children of ``parent_id`` whose idempotency keys begin with ``group`` hold of
    an allowance (see :class:`~corral.store.base.Holder`): key, state, caps, spend."""
    key = runs.c.idempotency_key
    return sa.select(
        key, runs.c.state, runs.c.max_cost_usd, runs.c.max_tokens, runs.c.cost_usd, runs.c.usage
    ).where(
        runs.c.parent_run_id == parent_id,
        sa.func.substr(key, 1, sa.func.length(group)) == group,
    )


def agent_max_attempts(namespace: Value, name: Value) -> sa.Select[Any]:
    """The ``max_attempts`` of an Agent's stored spec (no row: no such Agent)."""
    return sa.select(resources.c.spec["max_attempts"].as_integer()).where(
        resources.c.namespace == namespace, resources.c.kind == "Agent", resources.c.name == name
    )


#: An Agent's ``max_concurrent_runs``, where it has one.
AGENT_LIMIT = resources.c.spec["max_concurrent_runs"].as_integer()
#: Every Agent with ``max_concurrent_runs``: its namespace, name and limit.
LIMITED_AGENTS = sa.select(resources.c.namespace, resources.c.name, AGENT_LIMIT).where(
    resources.c.kind == "Agent", AGENT_LIMIT.is_not(None)
)


def due(now: Value) -> sa.ColumnElement[bool]:
    """A queued run whose time has come."""
    return sa.and_(runs.c.state == RunState.QUEUED.value, runs.c.not_before <= now)


def lease_expired(now: Value) -> sa.ColumnElement[bool]:
    """A running run whose holder's lease has run out."""
    return sa.and_(runs.c.state == RunState.RUNNING.value, runs.c.lease_expires_at < now)


#: Claim order: highest priority first, then oldest; ``ix_runs_claim`` serves it.
CLAIM_ORDER = (runs.c.priority.desc(), runs.c.created_at, runs.c.id)


def claim_candidates(runnable: sa.ColumnElement[bool], limit: Value) -> sa.Select[Any]:
    """One walk of ``ix_runs_claim``: the first ``limit`` runs of ``runnable`` in claim
    order, with what choosing among them needs. On PostgreSQL each row is locked as it
    is picked (``FOR UPDATE SKIP LOCKED``): a row another claimer - or a fenced write of
    its holder - has locked is passed over, not waited for, and cannot be picked twice."""
    return (
        sa.select(
            runs.c.id,
            runs.c.priority,
            runs.c.created_at,
            runs.c.namespace,
            runs.c.agent,
            runs.c.state,
            EXHAUSTED.label("exhausted"),
        )
        .where(runnable)
        .order_by(*CLAIM_ORDER)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )


def outranks(priority: Value, ids: Value) -> sa.ColumnElement[bool]:
    """A run of a higher priority than ``priority`` that is not one of ``ids`` (a claim of
    given runs takes those before them: see ``Store.claim_runs``)."""
    return sa.and_(runs.c.priority > priority, runs.c.id.not_in(ids))


def claim(ids: Value, owner: Value, expires_at: Value, now: Value) -> sa.Update:
    """Lease the runs of ``ids`` that are still runnable at ``now``; every claimed row."""
    return (
        runs.update()
        # The guard repeats the runnable test: a row another claimer took between
        # the candidates' SELECT and here is left alone (SQLite).
        .where(runs.c.id.in_(ids), sa.or_(due(now), lease_expired(now)))
        .values(
            state=RunState.RUNNING.value,
            lease_owner=owner,
            lease_expires_at=expires_at,
            attempts=CLAIMED_ATTEMPTS,
            fencing_token=runs.c.fencing_token + 1,
            started_at=sa.func.coalesce(runs.c.started_at, now),
        )
        .returning(*runs.c)
    )


def _held(run_id: Value, token: Value) -> sa.ColumnElement[bool]:
    """The run, while the lease with fencing token ``token`` still holds it running."""
    return sa.and_(
        runs.c.id == run_id, runs.c.fencing_token == token, runs.c.state == RunState.RUNNING.value
    )


def renew(run_id: Value, token: Value, expires_at: Value) -> sa.Update:
    """Extend a held lease (fenced: the UPDATE checks the token on the row it locks);
    returns whether a cancel was requested."""
    return (
        runs.update()
        .where(_held(run_id, token))
        .values(lease_expires_at=expires_at)
        .returning(runs.c.cancel_requested)
    )


def release(run_id: Value, token: Value, not_before: Value, *, refund_attempt: bool) -> sa.Update:
    """Queue a held run again, leaseless, from ``not_before``; giving its attempt back
    (see ``REFUNDED_ATTEMPTS``) or not."""
    return (
        runs.update()
        .where(_held(run_id, token))
        .values(
            state=RunState.QUEUED.value,
            lease_owner=None,
            lease_expires_at=None,
            not_before=not_before,
            attempts=REFUNDED_ATTEMPTS if refund_attempt else runs.c.attempts,
        )
    )


# One statement object for every save, the values passed as parameters: SQLAlchemy finds a
# statement's compiled form by its cache key, which a statement built anew per call
# (``update().values(...)`` over the runs table's columns) costs to compute.
SAVE_RUN = runs.update().where(runs.c.id == sa.bindparam("b_id"))
SAVE_RUN_FENCED = SAVE_RUN.where(runs.c.fencing_token == sa.bindparam("b_token"))


def resource(namespace: Value, kind: Value, name: Value) -> sa.Select[Any]:
    """The whole row of one resource."""
    return sa.select(resources).where(
        resources.c.namespace == namespace, resources.c.kind == kind, resources.c.name == name
    )


def resources_fingerprint(namespace: Value) -> sa.Select[Any]:
    """What changes whenever a namespace's resources do: their count, the sum of their
    generations and the latest update."""
    return sa.select(
        sa.func.count(),
        sa.func.coalesce(sa.func.sum(resources.c.generation), 0),
        sa.func.coalesce(sa.func.max(resources.c.updated_at), 0.0),
    ).where(resources.c.namespace == namespace)


def events_after(run_id: Value, after_seq: Value) -> sa.Select[Any]:
    """A run's events after ``after_seq``, in order (the caller adds its limit)."""
    return (
        sa.select(run_events)
        .where(run_events.c.run_id == run_id, run_events.c.seq > after_seq)
        .order_by(run_events.c.seq)
    )


def approvals_due(now: Value) -> sa.ColumnElement[bool]:
    """A pending approval whose deadline has passed."""
    return sa.and_(
        approvals.c.state == ApprovalState.PENDING.value,
        approvals.c.expires_at.is_not(None),
        approvals.c.expires_at <= now,
    )


def expire_due_approvals(now: Value) -> sa.Update:
    """Expire every approval due at ``now``; the rows it expired."""
    return (
        approvals.update()
        .where(approvals_due(now))
        .values(state=ApprovalState.EXPIRED.value, decided_at=now)
        .returning(*approvals.c)
    )


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


def requeue_settled(run_ids: Sequence[str], now: float) -> sa.Update:
    """Queue each ``waiting_approval`` run of ``run_ids`` that has no pending approval left
    (the SQLite fast path runs this statement too)."""
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


def _unfinished(table: Any) -> sa.ColumnElement[bool]:
    """A run of ``table`` (the runs table or an alias of it) that has not finished.

    Spelled as equalities, not ``IN``: the fast path compiles it once with its
    constants bound, which an expanding ``IN`` list does not allow."""
    return sa.or_(*(table.c.state == state.value for state in RunState if not state.finished))


def parent_of_child(parent_id: Value) -> sa.Select[Any]:
    """Lock the parent row of a finishing child (PostgreSQL; SQLite's write lock covers it).

    Siblings that finish at once take turns on it, so the last of them sees every other
    one finished and queues the parent: without the lock each could see the other still
    running and neither would."""
    return sa.select(runs.c.id).where(runs.c.id == parent_id).with_for_update()


def requeue_parent(parent_id: Value, now: Value) -> sa.Update:
    """Queue the run ``parent_id`` when it is ``waiting_children`` and none of its child
    runs is unfinished any more (a child's final save runs this, and so does the parent's
    own save into ``waiting_children``: its children may all have finished meanwhile).

    A system run (``system`` set, no ``branch_id``) is queued as soon as *one* of its node
    runs has finished whose message it has not taken yet (still ``delivered``): its
    coordinator moves each branch on as its node ends, not when its slowest sibling does."""
    child = runs.alias("child")
    running_child = sa.exists().where(child.c.parent_run_id == runs.c.id, _unfinished(child))
    ended = runs.alias("ended")
    untaken = sa.exists().where(
        agent_messages.c.system_run_id == runs.c.id,
        agent_messages.c.state == MessageState.DELIVERED.value,
        ended.c.id == agent_messages.c.child_run_id,
        sa.not_(_unfinished(ended)),
    )
    system_run = sa.and_(runs.c.system.is_not(None), runs.c.branch_id.is_(None))
    return (
        runs.update()
        .where(
            runs.c.id == parent_id,
            runs.c.state == RunState.WAITING_CHILDREN.value,
            sa.or_(~running_child, sa.and_(system_run, untaken)),
        )
        .values(state=RunState.QUEUED.value, not_before=now)
    )


def overdue(now: Value) -> sa.ColumnElement[bool]:
    """A run parked in ``waiting_children`` past its ``deadline_at``."""
    return sa.and_(runs.c.deadline_at <= now, runs.c.state == RunState.WAITING_CHILDREN.value)


def queue_overdue(now: Value) -> sa.Update:
    """Queue the runs parked in ``waiting_children`` past their ``deadline_at``."""
    return (
        runs.update()
        .where(overdue(now))
        .values(state=RunState.QUEUED.value, not_before=now)
        .returning(runs.c.id, runs.c.fencing_token)
    )


async def wake_parent(
    conn: AsyncConnection, run_id: str, parent_id: str | None, state: RunState, now: float
) -> str | None:
    """After a save of run ``run_id`` in ``state`` (in the caller's transaction): a finished
    child queues its waiting parent when it was the last one running, and a run parked in
    ``waiting_children`` whose children all finished meanwhile is queued at once. The id
    of the run it queued, if any."""
    if state.finished and parent_id is not None:
        await conn.execute(parent_of_child(parent_id))
        woken = parent_id
    elif state is RunState.WAITING_CHILDREN:
        woken = run_id
    else:
        return None
    return woken if (await conn.execute(requeue_parent(woken, now))).rowcount else None


def children_of(parent_ids: Value) -> sa.Select[Any]:
    """The child runs of the runs ``parent_ids``, oldest first."""
    return (
        sa.select(runs)
        .where(runs.c.parent_run_id.in_(parent_ids))
        .order_by(runs.c.created_at, runs.c.id)
    )


def session_key(namespace: str, session_id: str) -> sa.ColumnElement[bool]:
    """The ``sessions`` row of one session (sessions are keyed by namespace and id)."""
    return sa.and_(sessions.c.namespace == namespace, sessions.c.id == session_id)


def in_session(namespace: str, session_id: str) -> sa.ColumnElement[bool]:
    """The ``session_messages`` rows of one session."""
    return sa.and_(
        session_messages.c.namespace == namespace, session_messages.c.session_id == session_id
    )


def session_touch(namespace: Value, session_id: Value, now: Value) -> sa.Update:
    """Mark a session updated (which also write-locks its row)."""
    return sessions.update().where(session_key(namespace, session_id)).values(updated_at=now)


def session_top_seq(namespace: Value, session_id: Value) -> sa.Select[Any]:
    """The highest message seq of a session (``None`` when it has none)."""
    return sa.select(sa.func.max(session_messages.c.seq)).where(in_session(namespace, session_id))


async def touch_session(conn: AsyncConnection, namespace: str, session_id: str, now: float) -> None:
    """Mark a session updated (which also write-locks its row); ``NotFoundError`` if absent."""
    if (await conn.execute(session_touch(namespace, session_id, now))).rowcount == 0:
        raise session_not_found(session_id)


async def last_seq(conn: AsyncConnection, namespace: str, session_id: str) -> int:
    """The highest message seq of a session, 0 when it has none."""
    return int((await conn.execute(session_top_seq(namespace, session_id))).scalar() or 0)


def messages_of_session(
    namespace: Value, session_id: Value, *, include_hidden: bool
) -> sa.Select[Any]:
    """A session's messages (``hidden`` ones too, or not) in order: by position (a summary
    sits before the messages it leaves visible), then seq."""
    query = sa.select(session_messages).where(in_session(namespace, session_id))
    if not include_hidden:
        query = query.where(session_messages.c.hidden == sa.false())
    return query.order_by(session_messages.c.position, session_messages.c.seq)


def session_upsert(
    dialect: str, namespace: Value, session_id: Value, agent: Value, now: Value
) -> sa.Insert:
    """Create a session unless it exists, and lock its row either way; its whole row."""
    insert = _insert(dialect, sessions).values(
        namespace=namespace, id=session_id, agent=agent, created_at=now, updated_at=now
    )
    upsert: sa.Insert = insert.on_conflict_do_update(
        # (a no-op update: it only takes the row's lock; opening a session is not using it)
        index_elements=["namespace", "id"],
        set_={"updated_at": sessions.c.updated_at},
    ).returning(*sessions.c)
    return upsert


async def open_session(
    conn: AsyncConnection, dialect: str, namespace: str, session_id: str, agent: str, now: float
) -> sa.Row[Any]:
    """The session's row, created when absent and locked (PostgreSQL) until the transaction
    ends, so that a delete cannot slip in before the caller's writes; ``ConflictError``
    when the session belongs to another agent."""
    # An upsert, not insert-or-skip then select: it locks the row it finds in the same
    # step, so a delete cannot remove it in between (on PostgreSQL a racing delete makes
    # it wait, then insert the session anew).
    upsert = session_upsert(dialect, namespace, session_id, agent, now)
    row: sa.Row[Any] = (await conn.execute(upsert)).one()
    check_session_agent(session_id, row.agent, agent)
    return row


def _ancestry(name: str, start: Value) -> Any:
    """The run ``start`` and its ancestors (a recursive CTE: ``id``, ``parent_run_id``,
    ``session_id``, and ``level``, how far up from ``start``)."""
    first = sa.select(
        runs.c.id, runs.c.parent_run_id, runs.c.session_id, sa.literal_column("0").label("level")
    ).where(runs.c.id == start)
    tree = first.cte(name, recursive=True)
    parent = runs.alias(f"{name}_parent")
    return tree.union_all(
        sa.select(parent.c.id, parent.c.parent_run_id, parent.c.session_id, tree.c.level + 1).where(
            parent.c.id == tree.c.parent_run_id
        )
    )


def session_of_tree(parent_id: Value, namespace: Value, session_id: Value) -> sa.Select[Any]:
    """Whether a child of run ``parent_id`` may continue the existing session ``session_id``:
    one row, true when it is the session of ``parent_id`` or of one of its ancestors (named
    for them by whoever started them), or when the session's first run is of the same run
    tree as ``parent_id`` (the two have one root run): a run of the tree opened it. False or
    null otherwise (another tree's session, or one whose first run is gone)."""
    chain = _ancestry("chain", parent_id)
    first_run = (
        sa.select(runs.c.id)
        .where(runs.c.namespace == namespace, runs.c.session_id == session_id)
        .order_by(runs.c.created_at, runs.c.id)
        .limit(1)
        .scalar_subquery()
    )
    opener = _ancestry("opener", first_run)

    def root(tree: Any) -> Any:
        return sa.select(tree.c.id).order_by(tree.c.level.desc()).limit(1).scalar_subquery()

    named = sa.exists().where(chain.c.session_id == session_id)
    return sa.select(sa.or_(named, root(chain) == root(opener)))


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
    stored = numbered(messages, await last_seq(conn, namespace, session_id), run_id, now)
    await conn.execute(
        session_messages.insert(),
        [
            SESSION_MESSAGES.values(
                m, namespace=namespace, session_id=session_id, position=float(m.seq)
            )
            for m in stored
        ],
    )
    return stored
