"""The SQL store's fast path on a SQLite file: the hot operations as raw ``sqlite3`` calls.

:class:`SqliteStore` is a :class:`~corral.store.sql.SqlStore` whose operations on
the hot path of durable runs - submit, claim, lease renewal and release, event
appends, saving a run, and the reads a worker makes - each run whole as one
synchronous function in a thread that owns its connection
(:mod:`corral.store._sqlite_lanes`). Writes go through one writer thread that
group-commits: the operations queued while a commit was in flight share the next
transaction and its fsync, and each caller returns only once that commit is
durable (``synchronous=FULL``). Fencing is checked inside the same transaction,
exactly as in the SQLAlchemy path, whose statements these mirror.

Every other operation (applying resources, approvals decisions, sessions
upkeep, pruning) stays on SQLAlchemy; both take SQLite's write lock with
``BEGIN IMMEDIATE`` and wait for each other within the busy timeout.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import sqlalchemy as sa
from sqlalchemy.dialects import sqlite as sqlite_dialect

from corral.core.errors import ConfigurationError, ConflictError
from corral.core.events import Event, EventType
from corral.core.messages import Message
from corral.core.runs import Approval, ApprovalState, Lease, RunRecord, RunState
from corral.core.sessions import SessionMessage
from corral.store._sqlite_lanes import Lane, connect
from corral.store.base import StoredResource, StoreError, Submitted
from corral.store.schema import approvals as approvals_table
from corral.store.schema import resources, run_events, runs
from corral.store.schema import session_messages as messages_table
from corral.store.sql import SqlStore
from corral.store.sql.approvals import select_approvals
from corral.store.sql.database import cause, sqlite_file
from corral.store.sql.rows import (
    approval_values,
    row_to_approval,
    row_to_run,
    row_to_session_message,
    row_to_stored,
    run_values,
    session_message_values,
)
from corral.store.sql.rules import (
    agent_not_found,
    check_events_saved_with,
    check_events_under,
    check_session_agent,
    judge_token,
    no_longer_running,
    numbered,
    saved_run_values,
    session_not_found,
)
from corral.store.sql.statements import (
    CLAIMED_ATTEMPTS,
    EXHAUSTED,
    REFUNDED_ATTEMPTS,
    requeue_settled,
    sqlite_text,
)

T = TypeVar("T")


class DecodedRow(SimpleNamespace):
    """A row of the fast path: the table's columns as attributes, JSON columns decoded."""

    if TYPE_CHECKING:  # any column, as SQLAlchemy types a Row's attributes

        def __getattr__(self, name: str) -> Any: ...


#: Whether any stored agent has ``max_concurrent_runs`` (then claims take the SQLAlchemy
#: path, which counts running runs per agent: store/sql/agent_limits.py).
_ANY_AGENT_LIMIT = (
    "SELECT 1 FROM resources WHERE kind = 'Agent'"
    " AND json_extract(spec, '$.max_concurrent_runs') IS NOT NULL LIMIT 1"
)
_QUEUED = RunState.QUEUED.value
_RUNNING = RunState.RUNNING.value
_PENDING = ApprovalState.PENDING.value
_SQLITE = sqlite_dialect.dialect(paramstyle="qmark")


def _json_encoder() -> Callable[[Any], str]:
    """``json.dumps`` with its default options, built once.

    ``json.dumps`` builds its C encoder anew on every call, which costs as much
    as encoding the small values stored here (a run stores a dozen). The one
    difference: no check for circular references, which values made of JSON
    data (as everything stored here is) cannot have.
    """
    plain = json.JSONEncoder(check_circular=False)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # an interpreter without the C accelerator
        return plain.encode
    encode = make(
        None,  # markers: no circular check
        plain.default,
        json.encoder.encode_basestring_ascii,
        None,  # indent
        ": ",
        ", ",
        False,  # sort_keys
        False,  # skipkeys
        True,  # allow_nan
    )

    def dumps(value: Any) -> str:
        return "".join(encode(value, 0))

    return dumps


_dumps = _json_encoder()


def _kinds(table: sa.Table) -> tuple[frozenset[str], frozenset[str]]:
    json_columns = frozenset(c.name for c in table.columns if isinstance(c.type, sa.JSON))
    bool_columns = frozenset(c.name for c in table.columns if isinstance(c.type, sa.Boolean))
    return json_columns, bool_columns


_TYPES = {t.name: _kinds(t) for t in (runs, run_events, approvals_table, resources, messages_table)}


def _encode(table: sa.Table, values: dict[str, Any]) -> dict[str, Any]:
    """Python values as SQLAlchemy would bind them: JSON as text (``None`` as ``null``)."""
    json_columns, bool_columns = _TYPES[table.name]
    out = dict(values)
    for name in json_columns.intersection(out):
        out[name] = _dumps(out[name])
    for name in bool_columns.intersection(out):
        out[name] = int(bool(out[name]))
    return out


def _load(text: str) -> Any:
    """``json.loads``, with the two texts most JSON columns hold (an empty run's) spared it."""
    if text == "null":
        return None
    if text == "[]":
        return []
    return json.loads(text)


def _rows(cursor: sqlite3.Cursor, table: sa.Table) -> list[DecodedRow]:
    names = [d[0] for d in cursor.description]
    json_columns = [n for n in names if n in _TYPES[table.name][0]]
    rows = []
    for values in cursor.fetchall():
        row = dict(zip(names, values, strict=True))
        for name in json_columns:
            if row[name] is not None:
                row[name] = _load(row[name])
        rows.append(DecodedRow(**row))
    return rows


def _compiled(statement: sa.Select[Any]) -> tuple[str, list[Any]]:
    """``statement`` as SQLite text with its values as positional parameters."""
    compiled = statement.compile(dialect=_SQLITE, compile_kwargs={"render_postcompile": True})
    values = compiled.construct_params()
    return str(compiled), [values[name] for name in compiled.positiontup or ()]


def _insert(table: sa.Table, columns: Iterable[str]) -> str:
    names = list(columns)
    return f"INSERT INTO {table.name} ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})"


_RUN_COLUMNS = [c.name for c in runs.columns]
_INSERT_RUN = _insert(runs, _RUN_COLUMNS)
_INSERT_EVENT = _insert(run_events, ["run_id", "seq", "type", "ts", "data"])
_APPROVAL_COLUMNS = [c.name for c in approvals_table.columns]
_INSERT_APPROVAL = _insert(approvals_table, _APPROVAL_COLUMNS)
_MESSAGE_COLUMNS = [c.name for c in messages_table.columns]
_INSERT_MESSAGE = _insert(messages_table, _MESSAGE_COLUMNS)
# Claim order: highest priority first, then oldest (ix_runs_claim serves it).
_CLAIM_ORDER = "ORDER BY priority DESC, created_at, id"


@functools.cache
def _update_run(columns: tuple[str, ...], *, fenced: bool) -> str:
    """The statement of ``save_run`` for these columns (a handful of combinations)."""
    sql = f"UPDATE runs SET {', '.join(f'{c} = ?' for c in columns)} WHERE id = ?"
    return sql + " AND fencing_token = ?" if fenced else sql


_AGENT_MAX_ATTEMPTS = (
    "SELECT json_extract(spec, '$.max_attempts') FROM resources"
    " WHERE namespace = ? AND kind = 'Agent' AND name = ?"
)
# Runnable at a time given twice: queued and due, or running under an expired lease.
_DUE = f"state = '{_QUEUED}' AND not_before <= ?"
_EXPIRED = f"state = '{_RUNNING}' AND lease_expires_at < ?"
_RUNNABLE = f"({_DUE}) OR ({_EXPIRED})"


def _run_params(record: RunRecord) -> list[Any]:
    values = _encode(runs, run_values(record))
    return [values[c] for c in _RUN_COLUMNS]


def _insert_run(
    conn: sqlite3.Connection, record: RunRecord, params: list[Any]
) -> DecodedRow | None:
    """Insert a new run; the stored run with the same idempotency key instead, if any."""
    if record.idempotency_key is None:
        conn.execute(_INSERT_RUN, params)
        return None
    # The unique index decides between racing submits, not a prior read;
    # a clash on the run id alone still raises (ConflictError).
    inserted = conn.execute(
        f"{_INSERT_RUN} ON CONFLICT (namespace, agent, idempotency_key) DO NOTHING RETURNING id",
        params,
    ).fetchall()
    if inserted:
        return None
    cursor = conn.execute(
        "SELECT * FROM runs WHERE namespace = ? AND agent = ? AND idempotency_key = ?",
        (record.namespace, record.agent, record.idempotency_key),
    )
    return _rows(cursor, runs)[0]


_CLAIMED_ATTEMPTS = sqlite_text(CLAIMED_ATTEMPTS)
_EXHAUSTED = sqlite_text(EXHAUSTED)
_REFUNDED_ATTEMPTS = sqlite_text(REFUNDED_ATTEMPTS)


def _claim_ids(
    conn: sqlite3.Connection, ids: Sequence[str], owner: str, expires_at: float, now: float
) -> list[DecodedRow]:
    """Claim the runs of ``ids`` that are runnable at ``now``; the claimed rows."""
    cursor = conn.execute(
        f"UPDATE runs SET state = '{_RUNNING}', lease_owner = ?, lease_expires_at = ?,"
        f" attempts = {_CLAIMED_ATTEMPTS}, fencing_token = fencing_token + 1,"
        " started_at = coalesce(started_at, ?)"
        f" WHERE id IN ({', '.join('?' for _ in ids)}) AND ({_RUNNABLE}) RETURNING *",
        (owner, expires_at, now, *ids, now, now),
    )
    return _rows(cursor, runs)


def _refuse(conn: sqlite3.Connection, run_id: str, lease: Lease | None) -> None:
    """Raise unless run ``run_id`` exists and ``lease`` (when given) still holds it: the
    fencing check before a write, and why a fenced write matched no row (see ``refuse``)."""
    found = conn.execute("SELECT fencing_token FROM runs WHERE id = ?", (run_id,)).fetchone()
    judge_token(run_id, None if found is None else found[0], lease)


def _open_session(conn: sqlite3.Connection, record: RunRecord, session_id: str, now: float) -> None:
    """The run's session, created when absent (see ``open_session``, which this mirrors)."""
    found = conn.execute(
        "INSERT INTO sessions (namespace, id, agent, created_at, updated_at)"
        " VALUES (?, ?, ?, ?, ?) ON CONFLICT (namespace, id)"
        " DO UPDATE SET updated_at = sessions.updated_at RETURNING agent",
        (record.namespace, session_id, record.agent, now, now),
    ).fetchone()
    check_session_agent(session_id, found[0], record.agent)


def _append_to_session(
    conn: sqlite3.Connection,
    namespace: str,
    session_id: str,
    messages: Sequence[Message],
    run_id: str | None,
    now: float,
) -> list[SessionMessage]:
    touched = conn.execute(
        "UPDATE sessions SET updated_at = ? WHERE namespace = ? AND id = ?",
        (now, namespace, session_id),
    )
    if touched.rowcount == 0:
        raise session_not_found(session_id)
    top = conn.execute(
        "SELECT max(seq) FROM session_messages WHERE namespace = ? AND session_id = ?",
        (namespace, session_id),
    ).fetchone()[0]
    top = int(top or 0)
    stored = numbered(messages, top, run_id, now)
    rows = [
        _encode(messages_table, session_message_values(namespace, session_id, m, float(m.seq)))
        for m in stored
    ]
    conn.executemany(_INSERT_MESSAGE, [[r[c] for c in _MESSAGE_COLUMNS] for r in rows])
    return stored


class SqliteStore(SqlStore):
    """A :class:`SqlStore` on a SQLite file with the hot path on raw connections.

    Create it with :meth:`open`, or :func:`corral.store.open_store`, which picks it
    for ``sqlite:///`` files unless the settings turn the fast path off.
    """

    _writer_lane: Lane
    _reader_lane: Lane

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
        def read(conn: sqlite3.Connection) -> list[DecodedRow]:
            cursor = conn.execute(
                "SELECT * FROM resources WHERE namespace = ? AND kind = ? AND name = ?",
                (namespace, kind, name),
            )
            return _rows(cursor, resources)

        found = await self._lane_read("read a resource", read)
        return row_to_stored(found[0]) if found else None

    async def resources_fingerprint(self, namespace: str) -> tuple[int, int, float]:
        def read(conn: sqlite3.Connection) -> tuple[int, int, float]:
            count, generations, latest = conn.execute(
                "SELECT count(*), coalesce(sum(generation), 0), coalesce(max(updated_at), 0)"
                " FROM resources WHERE namespace = ?",
                (namespace,),
            ).fetchone()
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
    ) -> None:
        encoded = _encode(runs, saved_run_values(record, lease))
        sql = _update_run(tuple(encoded), fenced=lease is not None)
        params: list[Any] = [*encoded.values(), record.id]
        if lease is not None:
            params.append(lease.token)
        approval_rows = [_encode(approvals_table, approval_values(a)) for a in approvals]
        check_events_saved_with(events, record.id)
        event_rows = _event_rows(events)
        now = time.time()

        def write(conn: sqlite3.Connection) -> None:
            if conn.execute(sql, params).rowcount == 0:
                _refuse(conn, record.id, lease)
            if approval_rows:
                conn.executemany(
                    _INSERT_APPROVAL, [[r[c] for c in _APPROVAL_COLUMNS] for r in approval_rows]
                )
            if session_messages and record.session_id is not None:
                _append_to_session(
                    conn, record.namespace, record.session_id, session_messages, record.id, now
                )
            if event_rows:
                conn.executemany(_INSERT_EVENT, event_rows)

        await self._lane_write(f"save run {record.id}", write)

    async def get_run(self, run_id: str) -> RunRecord | None:
        def read(conn: sqlite3.Connection) -> list[DecodedRow]:
            return _rows(conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)), runs)

        found = await self._lane_read(f"read run {run_id}", read)
        return row_to_run(found[0]) if found else None

    # ----------------------------------------------------------------- tasks and leases

    async def submit_run(self, record: RunRecord) -> tuple[RunRecord, bool]:
        params = _run_params(record)
        existing = await self._lane_write(
            f"submit run {record.id}", lambda conn: _insert_run(conn, record, params)
        )
        if existing is None:
            return record, True
        return row_to_run(existing), False

    async def submit_agent_run(
        self, record: RunRecord, *, claim_for: tuple[str, float] | None = None
    ) -> Submitted:
        """See :meth:`Store.submit_agent_run`: the Agent's read, opening the session, the
        insert and the claim are one operation of the writer (one commit)."""
        params = _run_params(record)
        at = _RUN_COLUMNS.index("max_attempts")
        now = time.time()
        claimed: list[DecodedRow] = []

        def write(conn: sqlite3.Connection) -> DecodedRow | None:
            found = conn.execute(_AGENT_MAX_ATTEMPTS, (record.namespace, record.agent)).fetchone()
            if found is None:
                raise agent_not_found(record)
            if found[0] is not None:
                record.max_attempts = params[at] = int(found[0])
            if record.session_id is not None:
                _open_session(conn, record, record.session_id, now)
            existing = _insert_run(conn, record, params)
            if existing is None and claim_for is not None:
                owner, lease_seconds = claim_for
                if conn.execute(_ANY_AGENT_LIMIT).fetchone() is None:  # else: see below
                    claimed.extend(_claim_ids(conn, [record.id], owner, now + lease_seconds, now))
            return existing

        existing = await self._lane_write(f"submit run {record.id}", write)
        if existing is not None:
            return Submitted(row_to_run(existing), False)
        if claimed:
            row = claimed[0]
            lease = Lease(row.id, row.lease_owner, row.fencing_token, row.lease_expires_at)
            return Submitted(row_to_run(row), True, lease)
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
    ) -> list[tuple[RunRecord, Lease]]:
        if limit <= 0 or (run_ids is not None and not run_ids):
            return []
        now = time.time() if now is None else now
        expires_at = now + lease_seconds
        marks = ", ".join("?" for _ in run_ids or ())

        def walk(
            conn: sqlite3.Connection, where: str, params: tuple[Any, ...]
        ) -> list[tuple[Any, ...]]:
            # Two index walks (ix_runs_claim), each stopping at ``limit``.
            found: list[tuple[Any, ...]] = []
            for runnable in (_DUE, _EXPIRED):
                found += conn.execute(
                    f"SELECT -priority, created_at, id, {_EXHAUSTED} FROM runs"
                    f" WHERE {runnable}{where} "
                    f"{_CLAIM_ORDER} LIMIT ?",
                    (now, *params, limit),
                ).fetchall()
            return found

        def write(conn: sqlite3.Connection) -> list[DecodedRow] | None:
            if conn.execute(_ANY_AGENT_LIMIT).fetchone() is not None:
                return None  # limited agents: the SQLAlchemy claim counts their runs
            if run_ids is None:
                candidates = walk(conn, "", ())
            else:
                candidates = walk(conn, f" AND id IN ({marks})", tuple(run_ids))
                if candidates and or_higher_priority:  # see Store.claim_runs
                    lowest = -max(c[0] for c in candidates)
                    candidates += walk(
                        conn, f" AND priority > ? AND id NOT IN ({marks})", (lowest, *run_ids)
                    )
            if not candidates:
                return []
            candidates.sort()
            chosen = candidates[:limit]
            # BEGIN IMMEDIATE: the attempts read above are those the UPDATE sees.
            exhausted.update(c[2] for c in chosen if c[3])
            return _claim_ids(conn, [c[2] for c in chosen], owner, expires_at, now)

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
            )
        claimed.sort(key=lambda row: (-row.priority, row.created_at, row.id))
        return [
            (
                row_to_run(row),
                Lease(row.id, owner, row.fencing_token, expires_at, row.id in exhausted),
            )
            for row in claimed
        ]

    async def renew_lease(self, lease: Lease, lease_seconds: float) -> tuple[Lease, bool]:
        expires_at = time.time() + lease_seconds

        def write(conn: sqlite3.Connection) -> bool:
            found = conn.execute(
                "UPDATE runs SET lease_expires_at = ?"
                f" WHERE id = ? AND fencing_token = ? AND state = '{_RUNNING}'"
                " RETURNING cancel_requested",
                (expires_at, lease.run_id, lease.token),
            ).fetchone()
            if found is None:
                _refuse(conn, lease.run_id, lease)
                raise no_longer_running(lease)
            return bool(found[0])

        cancel = await self._lane_write(f"renew the lease on run {lease.run_id}", write)
        return Lease(lease.run_id, lease.owner, lease.token, expires_at), cancel

    async def release_run(
        self, lease: Lease, *, not_before: float = 0.0, refund_attempt: bool = False
    ) -> None:
        attempts = _REFUNDED_ATTEMPTS if refund_attempt else "attempts"

        def write(conn: sqlite3.Connection) -> None:
            cursor = conn.execute(
                f"UPDATE runs SET state = '{_QUEUED}', lease_owner = NULL,"
                f" lease_expires_at = NULL, not_before = ?, attempts = {attempts}"
                f" WHERE id = ? AND fencing_token = ? AND state = '{_RUNNING}'",
                (not_before, lease.run_id, lease.token),
            )
            if cursor.rowcount == 0:
                # Same token but no longer running: nothing to give back.
                _refuse(conn, lease.run_id, lease)

        await self._lane_write(f"release run {lease.run_id}", write)

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
        sql, params = _compiled(select_approvals(namespace, run_id, states, limit, after))

        def read(conn: sqlite3.Connection) -> list[DecodedRow]:
            return _rows(conn.execute(sql, params), approvals_table)

        return [row_to_approval(row) for row in await self._lane_read("list approvals", read)]

    async def expire_approvals(self, now: float | None = None) -> list[Approval]:
        now = time.time() if now is None else now
        due = (
            f"state = '{_PENDING}' AND expires_at IS NOT NULL AND expires_at <= ?",
            (now,),
        )

        def any_due(conn: sqlite3.Connection) -> bool:
            return (
                conn.execute(f"SELECT 1 FROM approvals WHERE {due[0]} LIMIT 1", due[1]).fetchone()
                is not None
            )

        # Every worker sweeps once per poll interval and nearly always finds nothing due:
        # a read first keeps the writer free then (what falls due meanwhile goes next sweep).
        if not await self._lane_read("expire approvals", any_due):
            return []

        def write(conn: sqlite3.Connection) -> list[DecodedRow]:
            cursor = conn.execute(
                f"UPDATE approvals SET state = '{ApprovalState.EXPIRED.value}', decided_at = ?"
                f" WHERE {due[0]} RETURNING *",
                (now, *due[1]),
            )
            rows = _rows(cursor, approvals_table)
            run_ids = sorted({r.run_id for r in rows})
            if run_ids:  # rare enough to compile the shared statement here
                conn.execute(sqlite_text(requeue_settled(run_ids, now)))
            return rows

        expired = [
            row_to_approval(row) for row in await self._lane_write("expire approvals", write)
        ]
        expired.sort(key=lambda a: (a.requested_at, a.id))
        return expired

    # ----------------------------------------------------------------- sessions

    async def session_messages(
        self, namespace: str, session_id: str, *, include_hidden: bool = False
    ) -> list[SessionMessage]:
        sql = "SELECT * FROM session_messages WHERE namespace = ? AND session_id = ?"
        if not include_hidden:
            sql += " AND hidden = 0"
        sql += " ORDER BY position, seq"

        def read(conn: sqlite3.Connection) -> list[DecodedRow]:
            return _rows(conn.execute(sql, (namespace, session_id)), messages_table)

        rows = await self._lane_read(f"read session {session_id}", read)
        return [row_to_session_message(row) for row in rows]

    # ----------------------------------------------------------------- events

    async def append_events(self, events: Sequence[Event], lease: Lease | None = None) -> None:
        if not events:
            return
        check_events_under(events, lease)
        rows = _event_rows(events)

        def write(conn: sqlite3.Connection) -> None:
            if lease is not None:
                _refuse(conn, lease.run_id, lease)
            conn.executemany(_INSERT_EVENT, rows)

        await self._lane_write("append run events", write)

    async def list_events(
        self, run_id: str, after_seq: int = 0, limit: int | None = None
    ) -> list[Event]:
        def read(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return conn.execute(
                "SELECT run_id, seq, type, data, ts FROM run_events"
                " WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (run_id, after_seq, -1 if limit is None else limit),
            ).fetchall()

        rows = await self._lane_read("list run events", read)
        return [
            Event(run_id=r[0], seq=r[1], type=EventType(r[2]), data=json.loads(r[3]), ts=r[4])
            for r in rows
        ]


def _event_rows(events: Sequence[Event]) -> list[tuple[Any, ...]]:
    """Parameters of ``_INSERT_EVENT``."""
    return [(e.run_id, e.seq, str(e.type), e.ts, _dumps(e.data)) for e in events]
