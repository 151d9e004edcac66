"""The SQL store's fast path on a SQLite file: the hot operations as raw ``sqlite3`` calls.

:class:`SqliteStore` is a :class:`~corral.store.sql.SqlStore` whose operations on
the hot path of durable runs - submit, claim, lease renewal and release, event
appends, saving a run, and the reads a worker makes - each run whole as one
synchronous function in a thread that owns its connection
(:mod:`corral.store._sqlite_lanes`). Writes go through one writer thread that
group-commits: the operations queued while a commit was in flight share the next
transaction and its fsync, and each caller returns only once that commit is
durable (``synchronous=FULL``). Fencing is checked inside the same transaction,
exactly as in the SQLAlchemy path.

The statements are the SQLAlchemy path's own (:mod:`corral.store.sql.statements`),
compiled once for SQLite with bind parameters in place of their values
(:class:`Compiled`); rows are built and read by the same
:class:`~corral.store.sql.rows.RecordRows` as there, with JSON as text.

Every other operation (applying resources, approvals decisions, sessions
upkeep, pruning) stays on SQLAlchemy; both take SQLite's write lock with
``BEGIN IMMEDIATE`` and wait for each other within the busy timeout.
"""

from __future__ import annotations

import functools
import sqlite3
import time
from collections.abc import Callable, Coroutine, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import sqlalchemy as sa
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.sql.compiler import SQLCompiler

from corral.core.errors import ConfigurationError, ConflictError
from corral.core.events import Event
from corral.core.messages import Message, Usage, load
from corral.core.runs import Approval, Lease, RunRecord, RunState
from corral.core.sessions import SessionMessage
from corral.store._sqlite_lanes import Lane, connect
from corral.store.base import Allowance, StoredResource, StoreError, Submitted, WokenRun
from corral.store.schema import resources, runs
from corral.store.sql import SqlStore, statements
from corral.store.sql.approvals import select_approvals
from corral.store.sql.database import cause, sqlite_file
from corral.store.sql.rows import (
    APPROVALS,
    EVENTS,
    RUNS,
    SESSION_MESSAGES,
    EventRows,
    RecordRows,
    loads,
    row_to_stored,
)
from corral.store.sql.rules import (
    LEASE_COLUMNS,
    agent_not_found,
    check_events_saved_with,
    check_events_under,
    check_parent_open,
    check_session_agent,
    check_session_of_tree,
    judge_token,
    no_longer_running,
    numbered,
    saved_run_columns,
    session_not_found,
)

T = TypeVar("T")
R = TypeVar("R")

_SQLITE = sqlite_dialect.dialect(paramstyle="qmark")


class DecodedRow(SimpleNamespace):
    """A row of the fast path: the table's columns as attributes, JSON columns decoded."""

    if TYPE_CHECKING:  # any column, as SQLAlchemy types a Row's attributes

        def __getattr__(self, name: str) -> Any: ...


#: Types of parameter the fast path binds as given (see Compiled).
_BOUND_AS_GIVEN = (sa.JSON, sa.Boolean, sa.Float)


class Compiled:
    """A statement of the SQL store compiled once for SQLite: its text, and the values of
    its parameters in order - those passed to :meth:`params` by name, and the
    statement's own constants (bound as SQLAlchemy would bind them).

    Values passed are bound as they are: JSON columns take the text a row's
    ``params`` made (:class:`~corral.store.sql.rows.RecordRows`), booleans and
    numbers go in as Python gives them (a REAL column stores an integer as real);
    a parameter of any other type SQLAlchemy would convert is refused here, when
    the statement is compiled.
    """

    def __init__(self, statement: sa.ClauseElement, *, columns: Sequence[str] = ()) -> None:
        compiled = statement.compile(dialect=_SQLITE, column_keys=list(columns) or None)
        assert isinstance(compiled, SQLCompiler)
        self.sql = str(compiled)
        self.names = tuple(compiled.positiontup or ())
        slots: list[tuple[str, bool, Any]] = []
        for name in self.names:
            bind = compiled.binds[name]
            process = bind.type.dialect_impl(_SQLITE).bind_processor(_SQLITE)
            if bind.required:
                if process is not None and not isinstance(bind.type, _BOUND_AS_GIVEN):
                    raise TypeError(f"{name} of {bind.type!r} needs converting: {self.sql}")
                slots.append((name, True, None))
            else:
                value = bind.effective_value
                slots.append((name, False, value if process is None else process(value)))
        self._slots = tuple(slots)

    def params(self, **values: Any) -> list[Any]:
        """The statement's parameters in order, ``values`` by name."""
        return [values[name] if given else value for name, given, value in self._slots]


def _for_once(statement: sa.Select[Any] | sa.Update) -> tuple[str, list[Any]]:
    """A statement built for one call, its values in it (lists of strings and numbers),
    as SQLite text and its parameters."""
    compiled = statement.compile(dialect=_SQLITE, compile_kwargs={"render_postcompile": True})
    assert isinstance(compiled, SQLCompiler)
    values = compiled.construct_params()
    return str(compiled), [values[name] for name in compiled.positiontup or ()]


def _ids(prefix: str, count: int) -> list[sa.BindParameter[Any]]:
    """``count`` parameters for an ``IN`` list (a statement is compiled per length)."""
    return [sa.bindparam(f"{prefix}{i}") for i in range(count)]


def _named(prefix: str, ids: Sequence[str]) -> dict[str, str]:
    return {f"{prefix}{i}": run_id for i, run_id in enumerate(ids)}


def _reading(
    rows: RecordRows[Any] | EventRows, statement: sa.Select[Any] | sa.UpdateBase
) -> Compiled:
    """``statement`` compiled, checked to return ``rows``' columns in table order."""
    returned = tuple(c.key for c in statement.exported_columns)
    if returned != rows.columns:
        raise TypeError(f"{returned} are not the columns of {rows.table.name}")
    return Compiled(statement)


def _inserting(rows: RecordRows[Any] | EventRows, statement: sa.Insert) -> Compiled:
    """``statement`` compiled, checked to take ``rows``' parameters (in table order)."""
    compiled = Compiled(statement)
    if compiled.names != rows.columns:
        raise TypeError(f"{compiled.names} are not the columns of {rows.table.name}")
    return compiled


_p = sa.bindparam

# The statements of the store's SQLAlchemy path (corral.store.sql.statements), compiled.
_RUN_BY_ID = _reading(RUNS, statements.run_by_id(_p("id")))
_FENCING_TOKEN = Compiled(statements.fencing_token(_p("id")))
_RUN_BY_KEY = _reading(RUNS, statements.run_by_key(_p("namespace"), _p("agent"), _p("key")))
_INSERT_RUN = _inserting(RUNS, runs.insert())
_INSERT_RUN_OR_SKIP = _inserting(
    RUNS,
    statements.insert_or_skip("sqlite", runs, statements.IDEMPOTENCY_COLUMNS).returning(runs.c.id),
)
_AGENT_MAX_ATTEMPTS = Compiled(statements.agent_max_attempts(_p("namespace"), _p("name")))
_PARENT_OF_NEW_CHILD = Compiled(statements.parent_of_new_child(_p("id")))
_ALLOWANCE_HOLDERS = Compiled(statements.allowance_holders(_p("id"), _p("group")))
_ANY_AGENT_LIMIT = Compiled(statements.LIMITED_AGENTS.limit(1))
_RENEW = Compiled(statements.renew(_p("id"), _p("token"), _p("expires_at")))
_RELEASE = {
    refund: Compiled(
        statements.release(_p("id"), _p("token"), _p("not_before"), refund_attempt=refund)
    )
    for refund in (False, True)
}
_OPEN_SESSION = Compiled(
    statements.session_upsert("sqlite", _p("namespace"), _p("id"), _p("agent"), _p("now"))
)
_SESSION_OF_TREE = Compiled(
    statements.session_of_tree(_p("parent"), _p("namespace"), _p("session"))
)
_TOUCH_SESSION = Compiled(statements.session_touch(_p("namespace"), _p("id"), _p("now")))
_TOP_SEQ = Compiled(statements.session_top_seq(_p("namespace"), _p("id")))
_INSERT_MESSAGE = _inserting(SESSION_MESSAGES, SESSION_MESSAGES.table.insert())
_SESSION_MESSAGES = {
    hidden: _reading(
        SESSION_MESSAGES,
        statements.messages_of_session(_p("namespace"), _p("id"), include_hidden=hidden),
    )
    for hidden in (False, True)
}
_INSERT_APPROVAL = _inserting(APPROVALS, APPROVALS.table.insert())
_INSERT_EVENT = _inserting(EVENTS, EVENTS.table.insert())
_EVENTS_AFTER = _reading(
    EVENTS, statements.events_after(_p("run_id"), _p("after")).limit(_p("limit"))
)
_RESOURCE = Compiled(statements.resource(_p("namespace"), _p("kind"), _p("name")))
_FINGERPRINT = Compiled(statements.resources_fingerprint(_p("namespace")))
_ANY_APPROVAL_DUE = Compiled(
    sa.select(sa.literal(1)).where(statements.approvals_due(_p("now"))).limit(1)
)
_EXPIRE_APPROVALS = _reading(APPROVALS, statements.expire_due_approvals(_p("now")))
_REQUEUE_PARENT = Compiled(statements.requeue_parent(_p("id"), _p("now")))
_QUEUE_OVERDUE = Compiled(statements.queue_overdue(_p("now")))
_ANY_OVERDUE = Compiled(sa.select(sa.literal(1)).where(statements.overdue(_p("now"))).limit(1))


@functools.lru_cache(maxsize=16)
def _save_run(columns: tuple[str, ...], *, fenced: bool) -> tuple[str, tuple[int, ...]]:
    """The statement of ``save_run`` for these columns (four combinations: see
    ``saved_run_columns``), and where each of its parameters is in the run's
    ``RUNS.params`` followed by ``NULL`` (a lease cleared), the run's id and the lease's
    token."""
    save = Compiled(statements.SAVE_RUN_FENCED if fenced else statements.SAVE_RUN, columns=columns)
    end = len(RUNS.columns)
    at = {c: i for i, c in enumerate(RUNS.columns)} | {"b_id": end + 1, "b_token": end + 2}
    for cleared in set(columns).intersection(LEASE_COLUMNS):
        at[cleared] = end
    return save.sql, tuple(at[name] for name in save.names)


_MAX_ATTEMPTS = RUNS.columns.index("max_attempts")
_MAX_COST_USD = RUNS.columns.index("max_cost_usd")
_MAX_TOKENS = RUNS.columns.index("max_tokens")
# The columns of a claim's candidates (statements.claim_candidates).
_ID, _PRIORITY, _CREATED_AT, _EXHAUSTED = 0, 1, 2, 6


def _claim_key(candidate: Sequence[Any]) -> tuple[int, float, str]:
    return (-candidate[_PRIORITY], candidate[_CREATED_AT], candidate[_ID])


@functools.lru_cache(maxsize=64)
def _claim(count: int) -> Compiled:
    """Claim ``count`` given runs (the UPDATE of a claim)."""
    claim = statements.claim(_ids("id", count), _p("owner"), _p("expires_at"), _p("now"))
    return _reading(RUNS, claim)


@functools.lru_cache(maxsize=64)
def _candidates(expired: bool, given: int, above: bool) -> Compiled:
    """One walk of a claim: due (or lease-expired) runs, of ``given`` ids when not 0, or
    (``above``) runs outranking them."""
    runnable = statements.lease_expired(_p("now")) if expired else statements.due(_p("now"))
    if given and above:
        runnable = sa.and_(runnable, statements.outranks(_p("priority"), _ids("id", given)))
    elif given:
        runnable = sa.and_(runnable, runs.c.id.in_(_ids("id", given)))
    return Compiled(statements.claim_candidates(runnable, _p("limit")))


def _records(rows: RecordRows[R], cursor: sqlite3.Cursor) -> list[R]:
    return [rows.record(row, text=True) for row in cursor.fetchall()]


def _insert_run(conn: sqlite3.Connection, record: RunRecord, params: list[Any]) -> RunRecord | None:
    """Insert a new run; the stored run with the same idempotency key instead, if any."""
    if record.idempotency_key is None:
        conn.execute(_INSERT_RUN.sql, params)
        return None
    # The unique index decides between racing submits, not a prior read;
    # a clash on the run id alone still raises (ConflictError).
    if conn.execute(_INSERT_RUN_OR_SKIP.sql, params).fetchall():
        return None
    found = _RUN_BY_KEY.params(
        namespace=record.namespace, agent=record.agent, key=record.idempotency_key
    )
    return _records(RUNS, conn.execute(_RUN_BY_KEY.sql, found))[0]


def _claim_ids(
    conn: sqlite3.Connection, ids: Sequence[str], owner: str, expires_at: float, now: float
) -> list[RunRecord]:
    """Claim the runs of ``ids`` that are runnable at ``now``; the claimed runs."""
    claim = _claim(len(ids))
    params = claim.params(owner=owner, expires_at=expires_at, now=now, **_named("id", ids))
    return _records(RUNS, conn.execute(claim.sql, params))


def _refuse(conn: sqlite3.Connection, run_id: str, lease: Lease | None) -> None:
    """Raise unless run ``run_id`` exists and ``lease`` (when given) still holds it: the
    fencing check before a write, and why a fenced write matched no row (see ``refuse``)."""
    found = conn.execute(_FENCING_TOKEN.sql, _FENCING_TOKEN.params(id=run_id)).fetchone()
    judge_token(run_id, None if found is None else found[0], lease)


def _open_session(conn: sqlite3.Connection, record: RunRecord, session_id: str, now: float) -> None:
    """The run's session, created when absent (see ``open_session``, which this mirrors);
    a child run's, only a session of its run tree (see ``SqlClaims._check_session_of_tree``)."""
    params = _OPEN_SESSION.params(
        namespace=record.namespace, id=session_id, agent=record.agent, now=now
    )
    found = conn.execute(_OPEN_SESSION.sql, params).fetchone()
    check_session_agent(session_id, found[2], record.agent)
    opened_now = found[3] == now
    if record.parent_run_id is not None and not opened_now:
        of_tree = _SESSION_OF_TREE.params(
            parent=record.parent_run_id, namespace=record.namespace, session=session_id
        )
        check_session_of_tree(
            record, opened_now, conn.execute(_SESSION_OF_TREE.sql, of_tree).fetchone()[0]
        )


def _append_to_session(
    conn: sqlite3.Connection,
    namespace: str,
    session_id: str,
    messages: Sequence[Message],
    run_id: str | None,
    now: float,
) -> list[SessionMessage]:
    """See ``append_to_session``, which this mirrors."""
    session = {"namespace": namespace, "id": session_id}
    if conn.execute(_TOUCH_SESSION.sql, _TOUCH_SESSION.params(now=now, **session)).rowcount == 0:
        raise session_not_found(session_id)
    top = conn.execute(_TOP_SEQ.sql, _TOP_SEQ.params(**session)).fetchone()[0]
    stored = numbered(messages, int(top or 0), run_id, now)
    conn.executemany(
        _INSERT_MESSAGE.sql,
        [
            SESSION_MESSAGES.params(
                m, namespace=namespace, session_id=session_id, position=float(m.seq)
            )
            for m in stored
        ],
    )
    return stored


class SqliteStore(SqlStore):
    """A :class:`SqlStore` on a SQLite file with the hot path on raw connections.

    Create it with :meth:`open`, or :func:`corral.store.open_store`, which picks it
    for ``sqlite:///`` files unless the settings turn the fast path off.
    """

    _writer_lane: Lane
    _reader_lane: Lane
    _any_agent_limit: _AgentLimits

    async def _start(self, url: sa.URL, busy_timeout_seconds: float) -> None:
        path = sqlite_file(url)
        if path is None:
            raise ConfigurationError(f"the SQLite fast path needs a database file, not {url}")

        def open_lanes() -> tuple[Lane, Lane]:
            writer = connect(path, busy_timeout_seconds)
            reader = connect(path, busy_timeout_seconds)
            return (
                Lane(writer, "corral-sqlite-writer", transactional=True),
                Lane(reader, "corral-sqlite-reader", transactional=False),
            )

        self._any_agent_limit = _AgentLimits()  # (asked in the writer's thread only)
        try:
            self._writer_lane, self._reader_lane = await anyio.to_thread.run_sync(open_lanes)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the store: {cause(exc)}") from exc

    async def close(self) -> None:
        for lane in (self._writer_lane, self._reader_lane):
            await anyio.to_thread.run_sync(lane.close)
        await super().close()

    # (Plain functions handing back _on's coroutine: a coroutine less per operation.)
    def _lane_write(
        self, action: str, operation: Callable[[sqlite3.Connection], T]
    ) -> Coroutine[Any, Any, T]:
        return self._on(self._writer_lane, action, operation)

    def _lane_read(
        self, action: str, operation: Callable[[sqlite3.Connection], T]
    ) -> Coroutine[Any, Any, T]:
        return self._on(self._reader_lane, action, operation)

    @staticmethod
    async def _on(lane: Lane, action: str, operation: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await lane.run(operation)
        except sqlite3.IntegrityError as exc:
            raise ConflictError(
                f"cannot {action}: it conflicts with stored state ({cause(exc)})"
            ) from exc
        except sqlite3.Error as exc:
            raise StoreError(f"cannot {action}: {cause(exc)}") from exc

    # ----------------------------------------------------------------- resources

    async def get_resource(self, namespace: str, kind: str, name: str) -> StoredResource | None:
        params = _RESOURCE.params(namespace=namespace, kind=kind, name=name)

        def read(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return conn.execute(_RESOURCE.sql, params).fetchall()

        found = await self._lane_read("read a resource", read)
        return row_to_stored(_resource_row(found[0])) if found else None

    async def resources_fingerprint(self, namespace: str) -> tuple[int, int, float]:
        params = _FINGERPRINT.params(namespace=namespace)

        def read(conn: sqlite3.Connection) -> tuple[int, int, float]:
            count, generations, latest = conn.execute(_FINGERPRINT.sql, params).fetchone()
            return int(count), int(generations), float(latest)

        return await self._lane_read("read the resources' fingerprint", read)

    # ----------------------------------------------------------------- runs

    async def save_run(
        self,
        record: RunRecord,
        lease: Lease | None = None,
        approvals: Sequence[Approval] = (),
        session_messages: Sequence[Message] = (),
        events: Sequence[Event] = (),
        claim_woken: tuple[str, float] | None = None,
    ) -> WokenRun | None:
        columns = saved_run_columns(record, lease)
        sql, positions = _save_run(columns, fenced=lease is not None)
        row = RUNS.params(record)
        row += (None, record.id, None if lease is None else lease.token)
        params = [row[i] for i in positions]
        approval_rows = [APPROVALS.params(a) for a in approvals]
        check_events_saved_with(events, record.id)
        event_rows = [EVENTS.params(e) for e in events]
        now = time.time()
        waking = _woken_by(record)
        claimed: list[RunRecord] = []

        def write(conn: sqlite3.Connection) -> bool:
            if conn.execute(sql, params).rowcount == 0:
                _refuse(conn, record.id, lease)
            queued = 0
            if waking is not None:  # see statements.wake_parent (the writer's lock is the lock)
                requeue = _REQUEUE_PARENT.params(id=waking, now=now)
                queued = conn.execute(_REQUEUE_PARENT.sql, requeue).rowcount
                # (agents with max_concurrent_runs: left to a claim, which counts their runs)
                if queued and claim_woken is not None and not self._any_agent_limit(conn):
                    owner, lease_seconds = claim_woken
                    claimed.extend(_claim_ids(conn, [waking], owner, now + lease_seconds, now))
            if approval_rows:
                conn.executemany(_INSERT_APPROVAL.sql, approval_rows)
            if session_messages and record.session_id is not None:
                _append_to_session(
                    conn, record.namespace, record.session_id, session_messages, record.id, now
                )
            if event_rows:
                conn.executemany(_INSERT_EVENT.sql, event_rows)
            return bool(queued)

        if not await self._lane_write(f"save run {record.id}", write):
            return None
        assert waking is not None
        if not claimed:
            return WokenRun(waking)
        run = claimed[0]
        assert run.lease_owner is not None and run.lease_expires_at is not None
        return WokenRun(
            waking, run, Lease(run.id, run.lease_owner, run.fencing_token, run.lease_expires_at)
        )

    async def get_run(self, run_id: str) -> RunRecord | None:
        params = _RUN_BY_ID.params(id=run_id)

        def read(conn: sqlite3.Connection) -> list[RunRecord]:
            return _records(RUNS, conn.execute(_RUN_BY_ID.sql, params))

        found = await self._lane_read(f"read run {run_id}", read)
        return found[0] if found else None

    # ----------------------------------------------------------------- tasks and leases

    async def submit_run(self, record: RunRecord) -> tuple[RunRecord, bool]:
        params = RUNS.params(record)
        existing = await self._lane_write(
            f"submit run {record.id}", lambda conn: _insert_run(conn, record, params)
        )
        return (record, True) if existing is None else (existing, False)

    async def submit_agent_run(
        self,
        record: RunRecord,
        *,
        claim_for: tuple[str, float] | None = None,
        allowance: Allowance | None = None,
    ) -> Submitted:
        """See :meth:`Store.submit_agent_run`: the Agent's read, a child's parent checked,
        opening the session, the insert and the claim are one operation of the writer
        (one commit)."""
        params = RUNS.params(record)
        agent = _AGENT_MAX_ATTEMPTS.params(namespace=record.namespace, name=record.agent)
        now = time.time()
        claimed: list[RunRecord] = []

        def write(conn: sqlite3.Connection) -> RunRecord | None:
            found = conn.execute(_AGENT_MAX_ATTEMPTS.sql, agent).fetchone()
            if found is None:
                raise agent_not_found(record)
            if found[0] is not None:
                record.max_attempts = params[_MAX_ATTEMPTS] = int(found[0])
            if record.parent_run_id is not None:
                parent = _PARENT_OF_NEW_CHILD.params(id=record.parent_run_id)
                check_parent_open(record, conn.execute(_PARENT_OF_NEW_CHILD.sql, parent).fetchone())
                if allowance is not None:  # (the writer's transactions take turns)
                    held = _ALLOWANCE_HOLDERS.params(id=record.parent_run_id, group=allowance.group)
                    others = [
                        (
                            row[0],
                            RunState(row[1]),
                            row[2],
                            row[3],
                            row[4],
                            load(Usage, loads(row[5])),
                        )
                        for row in conn.execute(_ALLOWANCE_HOLDERS.sql, held)
                    ]
                    key = record.idempotency_key or ""
                    record.max_cost_usd, record.max_tokens = allowance.caps(key, others)
                    params[_MAX_COST_USD] = record.max_cost_usd
                    params[_MAX_TOKENS] = record.max_tokens
            if record.session_id is not None:
                _open_session(conn, record, record.session_id, now)
            existing = _insert_run(conn, record, params)
            if existing is None and claim_for is not None:
                owner, lease_seconds = claim_for
                if not self._any_agent_limit(conn):  # else: see below
                    claimed.extend(_claim_ids(conn, [record.id], owner, now + lease_seconds, now))
            return existing

        existing = await self._lane_write(f"submit run {record.id}", write)
        if existing is not None:
            return Submitted(existing, False)
        if claimed:
            run = claimed[0]
            assert run.lease_owner is not None and run.lease_expires_at is not None
            lease = Lease(run.id, run.lease_owner, run.fencing_token, run.lease_expires_at)
            return Submitted(run, True, lease)
        if claim_for is not None and record.not_before <= now:
            # Agents with max_concurrent_runs: the SQLAlchemy claim counts their runs.
            claims = await self.claim_runs(*claim_for, 1, run_ids=[record.id])
            if claims:
                return Submitted(claims[0][0], True, claims[0][1])
        return Submitted(record, True)

    async def claim_runs(
        self,
        owner: str,
        lease_seconds: float,
        limit: int = 1,
        *,
        now: float | None = None,
        run_ids: Sequence[str] | None = None,
        or_higher_priority: bool = False,
        expired_only: bool = False,
    ) -> list[tuple[RunRecord, Lease]]:
        if limit <= 0 or (run_ids is not None and not run_ids):
            return []
        now = time.time() if now is None else now
        expires_at = now + lease_seconds
        given = _named("id", run_ids or ())

        def walk(conn: sqlite3.Connection, above: bool, **values: Any) -> list[tuple[Any, ...]]:
            # Two index walks (ix_runs_claim), each stopping at ``limit``.
            found: list[tuple[Any, ...]] = []
            for expired in (True,) if expired_only else (False, True):
                query = _candidates(expired, len(given), above)
                params = query.params(now=now, limit=limit, **given, **values)
                found += conn.execute(query.sql, params).fetchall()
            return found

        def write(conn: sqlite3.Connection) -> list[RunRecord] | None:
            if self._any_agent_limit(conn):
                return None  # limited agents: the SQLAlchemy claim counts their runs
            candidates = walk(conn, False)
            if candidates and run_ids is not None and or_higher_priority:  # see Store.claim_runs
                lowest = min(c[_PRIORITY] for c in candidates)
                candidates += walk(conn, True, priority=lowest)
            if not candidates:
                return []
            candidates.sort(key=_claim_key)
            chosen = candidates[:limit]
            # BEGIN IMMEDIATE: the attempts read above are those the UPDATE sees.
            exhausted.update(c[_ID] for c in chosen if c[_EXHAUSTED])
            return _claim_ids(conn, [c[_ID] for c in chosen], owner, expires_at, now)

        exhausted: set[str] = set()
        claimed = await self._lane_write("claim runs", write)
        if claimed is None:
            return await super().claim_runs(
                owner,
                lease_seconds,
                limit,
                now=now,
                run_ids=run_ids,
                or_higher_priority=or_higher_priority,
                expired_only=expired_only,
            )
        claimed.sort(key=lambda run: (-run.priority, run.created_at, run.id))
        return [
            (run, Lease(run.id, owner, run.fencing_token, expires_at, run.id in exhausted))
            for run in claimed
        ]

    async def renew_lease(self, lease: Lease, lease_seconds: float) -> tuple[Lease, bool]:
        expires_at = time.time() + lease_seconds
        params = _RENEW.params(id=lease.run_id, token=lease.token, expires_at=expires_at)

        def write(conn: sqlite3.Connection) -> bool:
            found = conn.execute(_RENEW.sql, params).fetchone()
            if found is None:
                _refuse(conn, lease.run_id, lease)
                raise no_longer_running(lease)
            return bool(found[0])

        cancel = await self._lane_write(f"renew the lease on run {lease.run_id}", write)
        return Lease(lease.run_id, lease.owner, lease.token, expires_at), cancel

    async def release_run(
        self, lease: Lease, *, not_before: float = 0.0, refund_attempt: bool = False
    ) -> None:
        release = _RELEASE[refund_attempt]
        params = release.params(id=lease.run_id, token=lease.token, not_before=not_before)

        def write(conn: sqlite3.Connection) -> None:
            if conn.execute(release.sql, params).rowcount == 0:
                # Same token but no longer running: nothing to give back.
                _refuse(conn, lease.run_id, lease)

        await self._lane_write(f"release run {lease.run_id}", write)

    async def queue_overdue_runs(self, now: float | None = None) -> list[tuple[str, int]]:
        now = time.time() if now is None else now

        def any_due(conn: sqlite3.Connection) -> bool:
            params = _ANY_OVERDUE.params(now=now)
            return conn.execute(_ANY_OVERDUE.sql, params).fetchone() is not None

        # Every worker looks once per poll interval and nearly always finds nothing: a
        # read first keeps the writer free then (what falls due meanwhile goes next time).
        if not await self._lane_read("queue overdue runs", any_due):
            return []

        def write(conn: sqlite3.Connection) -> list[tuple[str, int]]:
            params = _QUEUE_OVERDUE.params(now=now)
            return [(run_id, token) for run_id, token in conn.execute(_QUEUE_OVERDUE.sql, params)]

        return await self._lane_write("queue overdue runs", write)

    # ----------------------------------------------------------------- approvals

    async def list_approvals(
        self,
        namespace: str | None = None,
        *,
        run_id: str | None = None,
        states: Sequence[str] | None = None,
        limit: int | None = None,
        after: tuple[float, str] | None = None,
    ) -> list[Approval]:
        # Its shape varies with the filters given: compiled per call.
        sql, params = _for_once(select_approvals(namespace, run_id, states, limit, after))

        def read(conn: sqlite3.Connection) -> list[Approval]:
            return _records(APPROVALS, conn.execute(sql, params))

        return await self._lane_read("list approvals", read)

    async def expire_approvals(self, now: float | None = None) -> list[Approval]:
        now = time.time() if now is None else now

        def any_due(conn: sqlite3.Connection) -> bool:
            return (
                conn.execute(_ANY_APPROVAL_DUE.sql, _ANY_APPROVAL_DUE.params(now=now)).fetchone()
                is not None
            )

        # Every worker sweeps once per poll interval and nearly always finds nothing due:
        # a read first keeps the writer free then (what falls due meanwhile goes next sweep).
        if not await self._lane_read("expire approvals", any_due):
            return []

        def write(conn: sqlite3.Connection) -> list[Approval]:
            params = _EXPIRE_APPROVALS.params(now=now)
            expired = _records(APPROVALS, conn.execute(_EXPIRE_APPROVALS.sql, params))
            run_ids = sorted({a.run_id for a in expired})
            if run_ids:  # rare: compiled when it happens
                conn.execute(*_for_once(statements.requeue_settled(run_ids, now)))
            return expired

        expired = await self._lane_write("expire approvals", write)
        expired.sort(key=lambda a: (a.requested_at, a.id))
        return expired

    # ----------------------------------------------------------------- sessions

    async def session_messages(
        self, namespace: str, session_id: str, *, include_hidden: bool = False
    ) -> list[SessionMessage]:
        query = _SESSION_MESSAGES[include_hidden]
        params = query.params(namespace=namespace, id=session_id)

        def read(conn: sqlite3.Connection) -> list[SessionMessage]:
            return _records(SESSION_MESSAGES, conn.execute(query.sql, params))

        return await self._lane_read(f"read session {session_id}", read)

    # ----------------------------------------------------------------- events

    async def append_events(self, events: Sequence[Event], lease: Lease | None = None) -> None:
        if not events:
            return
        check_events_under(events, lease)
        rows = [EVENTS.params(e) for e in events]

        def write(conn: sqlite3.Connection) -> None:
            if lease is not None:
                _refuse(conn, lease.run_id, lease)
            conn.executemany(_INSERT_EVENT.sql, rows)

        await self._lane_write("append run events", write)

    async def list_events(
        self, run_id: str, after_seq: int = 0, limit: int | None = None
    ) -> list[Event]:
        params = _EVENTS_AFTER.params(
            run_id=run_id, after=after_seq, limit=-1 if limit is None else limit
        )

        def read(conn: sqlite3.Connection) -> list[Event]:
            rows = conn.execute(_EVENTS_AFTER.sql, params).fetchall()
            return [EVENTS.record(row, text=True) for row in rows]

        return await self._lane_read("list run events", read)


def _woken_by(record: RunRecord) -> str | None:
    """The run a save of ``record`` may queue (see ``statements.wake_parent``): a finished
    child's parent, or the run itself when it parks waiting for its children."""
    if record.state.finished:
        return record.parent_run_id
    return record.id if record.state is RunState.WAITING_CHILDREN else None


class _AgentLimits:
    """Whether any stored agent has ``max_concurrent_runs`` (then claims take the SQLAlchemy
    path, which counts running runs per agent: store/sql/agent_limits.py), as the writer's
    connection last read it. Resources are written by the SQLAlchemy path only, never by
    the writer's connection: the answer holds until another connection commits (SQLite's
    ``data_version`` says so), and the writer asks at every submit, claim and save."""

    def __init__(self) -> None:
        self._known: tuple[int, bool] | None = None  # (data_version, answer)

    def __call__(self, conn: sqlite3.Connection) -> bool:
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if self._known is not None and self._known[0] == version:
            return self._known[1]
        found = conn.execute(_ANY_AGENT_LIMIT.sql, _ANY_AGENT_LIMIT.params()).fetchone()
        self._known = (version, found is not None)
        return found is not None


_RESOURCE_COLUMNS = tuple(c.name for c in resources.columns)
_RESOURCE_JSON = frozenset(c.name for c in resources.columns if isinstance(c.type, sa.JSON))


def _resource_row(values: Sequence[Any]) -> DecodedRow:
    """A ``resources`` row of the fast path as :func:`row_to_stored` reads it."""
    row = dict(zip(_RESOURCE_COLUMNS, values, strict=True))
    for name in _RESOURCE_JSON:
        row[name] = loads(row[name])
    return DecodedRow(**row)
