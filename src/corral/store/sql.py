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
:meth:`SqlStore._read` or :meth:`SqlStore._write`, which retry it when the
connection drops (:mod:`corral.store._sql_transaction`).

Runs double as durable tasks. A claim bumps the run's fencing token; a write
made under a :class:`~corral.core.runs.Lease` checks the token in the same
transaction and is refused (``LeaseLostError``) once a newer claim bumped it.
Expiry alone refuses nothing: an expired lease still writes until someone
else claims the run.

The schema is created and upgraded by alembic when the store opens; a store
already at :data:`~corral.store.schema.LATEST_REVISION` opens without
importing alembic at all.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, nullcontext
from typing import Any, TypeVar

import anyio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from corral.core.errors import (
    ConflictError,
    LeaseLostError,
    NotFoundError,
    ResourceError,
)
from corral.core.events import Event, EventType
from corral.core.messages import Message
from corral.core.runs import Approval, ApprovalState, Lease, RunRecord, RunState
from corral.core.sessions import Session, SessionMessage
from corral.core.tokens import ApiToken
from corral.resources.kinds import SPEC_TYPES, Resource, SecretSpec
from corral.resources.loader import LoadedResource, format_path
from corral.resources.references import check_references, locate, referrers, resource_of
from corral.resources.secrets import SecretCipher, seal
from corral.store._agent_limits import admission, admitted
from corral.store._sql_engine import (
    BUSY_TIMEOUT_SECONDS,
    DEFAULT_POOL_SIZE,
    MIGRATIONS_DIR,
    WRITE,
    async_url,
    configure_sqlite,
    current_revision,
    db_errors,
    lock_migrations,
    pool_options,
    prepare_sqlite_path,
    sqlite_file,
    upgrade,
)
from corral.store._sql_rows import (
    approval_values,
    row_to_approval,
    row_to_run,
    row_to_session,
    row_to_session_message,
    row_to_stored,
    row_to_token,
    run_values,
    session_message_values,
    spec_json,
    token_values,
)
from corral.store._sql_statements import (
    CLAIMED_ATTEMPTS,
    EXHAUSTED,
    REFUNDED_ATTEMPTS,
    check_fence,
    in_session,
    insert_or_skip,
    last_seq,
    lock_runs,
    open_session,
    refuse,
    requeue_settled_runs,
    session_in_use,
    session_key,
    touch_session,
    unfinished_run_of_session,
)
from corral.store._sql_transaction import transact
from corral.store.base import (
    ApplyAction,
    ApplyOutcome,
    RunCounts,
    Store,
    StoredResource,
    Submitted,
)
from corral.store.schema import (
    LATEST_REVISION,
    api_tokens,
    resources,
    run_events,
    runs,
    session_messages,
    sessions,
)
from corral.store.schema import approvals as approvals_table

__all__ = ["BUSY_TIMEOUT_SECONDS", "MIGRATIONS_DIR", "SqlStore", "async_url"]

T = TypeVar("T")
Body = Callable[[AsyncConnection], Awaitable[T]]
"""What runs inside one transaction (see :mod:`corral.store._sql_transaction`)."""

_IDEMPOTENCY_COLUMNS = ("namespace", "agent", "idempotency_key")
# The statements of the hot paths as single objects, their values passed as parameters:
# SQLAlchemy finds a statement's compiled form by its cache key, which a statement built
# anew per call (``insert().values(...)`` over the runs table's columns) costs to compute.
_INSERT_RUN = runs.insert()
_UPDATE_RUN = runs.update().where(runs.c.id == sa.bindparam("b_id"))
_UPDATE_RUN_FENCED = _UPDATE_RUN.where(runs.c.fencing_token == sa.bindparam("b_token"))
_AGENT_MAX_ATTEMPTS = sa.select(resources.c.spec["max_attempts"].as_integer()).where(
    resources.c.namespace == sa.bindparam("b_namespace"),
    resources.c.kind == "Agent",
    resources.c.name == sa.bindparam("b_name"),
)
# Claim order: highest priority first, then oldest; ``ix_runs_claim`` serves it.
_CLAIM_ORDER = (runs.c.priority.desc(), runs.c.created_at, runs.c.id)


def _claim_key(row: sa.Row[Any]) -> tuple[int, float, str]:
    return (-row.priority, row.created_at, row.id)


class SqlStore(Store):
    """A :class:`Store` on a SQL database. Create it with :meth:`open`."""

    def __init__(self, engine: AsyncEngine, cipher: SecretCipher) -> None:
        self._engine = engine
        # Same pool; connections from here open write transactions (BEGIN IMMEDIATE on SQLite).
        self._writer = engine.execution_options(**{WRITE: True})
        self._cipher = cipher
        self._dialect = engine.dialect.name
        self._run_turns = _Turns()

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        cipher: SecretCipher,
        busy_timeout_seconds: float = BUSY_TIMEOUT_SECONDS,
        pool_size: int = DEFAULT_POOL_SIZE,
    ) -> SqlStore:
        """Connect, bring the schema up to date, and return the store.

        ``busy_timeout_seconds`` is how long SQLite waits for another writer's
        lock before the operation fails with :class:`StoreError`. ``pool_size``
        is how many PostgreSQL connections the store keeps open (as many again
        are opened for bursts).
        """
        target = async_url(url)
        # CORRAL_SQLITE_FAST_PATH=0 keeps a SQLite file on the SQLAlchemy statements
        # (the ones PostgreSQL uses): a way out, and how the tests cover both paths.
        fast_path = (
            cls is SqlStore
            and sqlite_file(target)
            and os.environ.get("CORRAL_SQLITE_FAST_PATH", "1") != "0"
        )
        with db_errors("open the store"):
            if target.get_backend_name() == "sqlite":
                prepare_sqlite_path(target)
            engine = create_async_engine(target, **pool_options(target, pool_size))
            if engine.dialect.name == "sqlite":
                configure_sqlite(engine, busy_timeout_seconds)
        store: SqlStore
        if fast_path:
            # A SQLite file gets the hot path on raw connections (corral.store.sqlite).
            from corral.store.sqlite import SqliteStore

            store = SqliteStore(engine, cipher)
        else:
            store = cls(engine, cipher)
        try:
            await store._migrate()
            if fast_path:
                assert isinstance(store, SqliteStore)
                await store._start(sqlite_file(target) or "", busy_timeout_seconds)
        except BaseException:
            await engine.dispose()
            raise
        return store

    async def close(self) -> None:
        await self._engine.dispose()

    # ----------------------------------------------------------------- migrations

    async def _migrate(self) -> None:
        with db_errors("open the store"):
            async with self._engine.connect() as conn:
                current = await conn.run_sync(current_revision)
        if current == LATEST_REVISION:
            return
        with db_errors("migrate the store"):
            async with self._writer.begin() as conn:
                # SQLite's write lock, PostgreSQL's advisory lock: processes opening a new
                # database at once take turns, and the revision is re-checked under it.
                await lock_migrations(conn)
                await conn.run_sync(upgrade)

    # ----------------------------------------------------------------- transactions

    async def _read(self, action: str, body: Body[T]) -> T:
        """Run ``body`` in a read-only transaction, retried if its connection drops."""
        return await transact(self._engine, action, body, write=False)

    async def _write(self, action: str, body: Body[T]) -> T:
        """Run ``body`` in one write transaction, retried if its connection drops before
        COMMIT and checked if it drops during it (see :mod:`corral.store._sql_transaction`)."""
        return await transact(self._writer, action, body, write=True)

    # ----------------------------------------------------------------- resources

    async def apply(self, batch: Sequence[Resource | LoadedResource]) -> list[ApplyOutcome]:
        items = list(batch)
        _check_kinds(items)
        now = time.time()

        async def write(conn: AsyncConnection) -> list[ApplyOutcome]:
            async def exists(namespace: str, kind: str, name: str) -> bool:
                return await _fetch_resource(conn, namespace, kind, name) is not None

            await check_references(items, exists)
            return [await self._apply_one(conn, item, now) for item in items]

        return await self._write("apply resources", write)

    async def _apply_one(
        self, conn: AsyncConnection, item: Resource | LoadedResource, now: float
    ) -> ApplyOutcome:
        resource = resource_of(item)
        namespace, kind, name = resource.key
        row = await _fetch_resource(conn, namespace, kind, name)
        old = row_to_stored(row) if row is not None else None
        spec = resource.spec
        if isinstance(spec, SecretSpec):
            previous = old.resource.spec if old is not None else None
            try:
                spec = seal(
                    spec, previous if isinstance(previous, SecretSpec) else None, self._cipher
                )
            except ResourceError as exc:
                where = locate(item, ("spec", "encrypted_value"))
                raise ResourceError([(where, reason) for _, reason in exc.problems]) from None
        values = {"spec": spec_json(spec), "labels": dict(resource.metadata.labels)}
        if old is None:
            await conn.execute(
                resources.insert().values(
                    namespace=namespace,
                    kind=kind,
                    name=name,
                    generation=1,
                    created_at=now,
                    updated_at=now,
                    **values,
                )
            )
            return ApplyOutcome(namespace, kind, name, ApplyAction.CREATED, 1)
        current = {"spec": spec_json(old.resource.spec), "labels": old.resource.metadata.labels}
        if current == values:
            return ApplyOutcome(namespace, kind, name, ApplyAction.UNCHANGED, old.generation)
        generation = old.generation + 1
        await conn.execute(
            resources.update()
            .where(_resource_key(namespace, kind, name))
            .values(generation=generation, updated_at=now, **values)
        )
        return ApplyOutcome(namespace, kind, name, ApplyAction.CONFIGURED, generation)

    async def get_resource(self, namespace: str, kind: str, name: str) -> StoredResource | None:
        query = sa.select(resources).where(_resource_key(namespace, kind, name))
        row = await self._read("read a resource", _first(query))
        return row_to_stored(row) if row is not None else None

    async def list_resources(self, namespace: str, kind: str | None = None) -> list[StoredResource]:
        query = sa.select(resources).where(resources.c.namespace == namespace)
        if kind is not None:
            query = query.where(resources.c.kind == kind)
        query = query.order_by(resources.c.kind, resources.c.name)
        rows = await self._read("list resources", _all(query))
        return [row_to_stored(row) for row in rows]

    async def resources_fingerprint(self, namespace: str) -> tuple[int, int, float]:
        """See :meth:`Store.resources_fingerprint`: one aggregate query."""
        query = sa.select(
            sa.func.count(),
            sa.func.coalesce(sa.func.sum(resources.c.generation), 0),
            sa.func.coalesce(sa.func.max(resources.c.updated_at), 0.0),
        ).where(resources.c.namespace == namespace)
        row = await self._read("read the resources' fingerprint", _first(query))
        assert row is not None  # an aggregate without GROUP BY has one row
        count, generations, latest = tuple[Any, ...](row)
        return int(count), int(generations), float(latest)

    async def delete_resource(self, namespace: str, kind: str, name: str) -> None:
        async def write(conn: AsyncConnection) -> None:
            if await _fetch_resource(conn, namespace, kind, name) is None:
                raise NotFoundError(f"{kind} {name!r} not found in namespace {namespace!r}")
            rows = (
                await conn.execute(sa.select(resources).where(resources.c.namespace == namespace))
            ).all()
            others = [
                stored.resource
                for stored in map(row_to_stored, rows)
                if stored.resource.key != (namespace, kind, name)
            ]
            found = referrers((kind, name), others)
            if found:
                names = ", ".join(
                    f"{r.kind} {r.name!r} ({format_path(field)})" for r, field in found
                )
                raise ConflictError(
                    f"cannot delete {kind} {name!r} in namespace {namespace!r}: "
                    f"it is referenced by {names}"
                )
            await conn.execute(resources.delete().where(_resource_key(namespace, kind, name)))

        await self._write("delete a resource", write)

    # ----------------------------------------------------------------- runs

    async def create_run(self, record: RunRecord) -> None:
        insert = runs.insert().values(**run_values(record))
        await self._write(f"create run {record.id}", _execute(insert))

    async def save_run(
        self,
        record: RunRecord,
        lease: Lease | None = None,
        approvals: Sequence[Approval] = (),
        session_messages: Sequence[Message] = (),
        events: Sequence[Event] = (),
    ) -> None:
        """See :meth:`Store.save_run`. Also: ``cancel_requested`` is only ever raised by a
        save, never cleared (the flag belongs to :meth:`request_cancel`); a lease on
        another run is a ``ConflictError``."""
        if lease is not None and lease.run_id != record.id:
            raise ConflictError(f"cannot save run {record.id!r} under a lease on {lease.run_id!r}")
        values = run_values(record)
        for column in ("id", "lease_owner", "lease_expires_at", "fencing_token"):
            del values[column]
        # The flag belongs to request_cancel: a worker saving the record it claimed
        # before the request must not clear it, so a save can only raise it.
        if not record.cancel_requested:
            del values["cancel_requested"]
        if record.state is not RunState.RUNNING:
            values.update(lease_owner=None, lease_expires_at=None)
        # One statement object for every save, the values as parameters (see _INSERT_RUN).
        values["b_id"] = record.id
        statement = _UPDATE_RUN
        if lease is not None:
            # The UPDATE checks the token and locks the row in one step: on PostgreSQL a
            # claim in flight makes it wait, then re-check the token of the claimed row.
            statement = _UPDATE_RUN_FENCED
            values["b_token"] = lease.token
        namespace, session_id = record.namespace, record.session_id
        event_rows = _event_rows(events, record.id)

        async def write(conn: AsyncConnection) -> None:
            result = await conn.execute(statement, values)
            if result.rowcount == 0:
                await refuse(conn, record.id, lease)
            if approvals:
                await conn.execute(
                    approvals_table.insert(), [approval_values(a) for a in approvals]
                )
            if session_messages and session_id is not None:
                await _append_to_session(
                    conn, namespace, session_id, session_messages, record.id, time.time()
                )
            if event_rows:
                await conn.execute(run_events.insert(), event_rows)

        # Events saved with the run take their turn after the run's pending appends.
        async with self._run_turns.turn(record.id) if event_rows else nullcontext():
            await self._write(f"save run {record.id}", write)

    async def get_run(self, run_id: str) -> RunRecord | None:
        query = sa.select(runs).where(runs.c.id == run_id)
        row = await self._read(f"read run {run_id}", _first(query))
        return row_to_run(row) if row is not None else None

    async def list_runs(
        self,
        namespace: str,
        agent: str | None = None,
        limit: int = 50,
        states: Sequence[RunState] | None = None,
        *,
        before: tuple[float, str] | None = None,
    ) -> list[RunRecord]:
        query = sa.select(runs).where(runs.c.namespace == namespace)
        if agent is not None:
            query = query.where(runs.c.agent == agent)
        if states is not None:
            query = query.where(runs.c.state.in_([RunState(s).value for s in states]))
        if before is not None:
            created_at, run_id = before
            query = query.where(
                sa.or_(
                    runs.c.created_at < created_at,
                    sa.and_(runs.c.created_at == created_at, runs.c.id < run_id),
                )
            )
        query = query.order_by(runs.c.created_at.desc(), runs.c.id.desc()).limit(limit)
        rows = await self._read("list runs", _all(query))
        return [row_to_run(row) for row in rows]

    async def count_runs(self, *, now: float | None = None) -> RunCounts:
        now = time.time() if now is None else now
        by_state = sa.select(
            runs.c.namespace, runs.c.state, sa.func.count().label("runs")
        ).group_by(runs.c.namespace, runs.c.state)
        due = sa.select(sa.func.count()).where(
            runs.c.state == RunState.QUEUED.value, runs.c.not_before <= now
        )

        async def read(conn: AsyncConnection) -> tuple[Sequence[sa.Row[Any]], int]:
            rows = (await conn.execute(by_state)).all()
            return rows, (await conn.execute(due)).scalar_one()

        rows, due_count = await self._read("count runs", read)
        return RunCounts(
            by_state={(row.namespace, RunState(row.state)): int(row.runs) for row in rows},
            due=int(due_count),
        )

    # ----------------------------------------------------------------- tasks and leases

    async def submit_run(self, record: RunRecord) -> tuple[RunRecord, bool]:
        """See :meth:`Store.submit_run`; the record is stored as given (callers pass a
        ``queued`` one). A clash on the run id alone is a ``ConflictError``."""
        row = await self._write(f"submit run {record.id}", self._inserting(record))
        return (record, True) if row is None else (row_to_run(row), False)

    async def submit_agent_run(
        self, record: RunRecord, *, claim_for: tuple[str, float] | None = None
    ) -> Submitted:
        """See :meth:`Store.submit_agent_run`: the Agent's ``max_attempts`` is read, the
        session opened, the run inserted and, when asked for, claimed in one transaction
        (no resource read and validation of its own)."""
        the_agent = {"b_namespace": record.namespace, "b_name": record.agent}
        now = time.time()
        claiming = None
        if claim_for is not None and record.not_before <= now:
            owner, lease_seconds = claim_for
            claiming = self._claiming(owner, now + lease_seconds, now, 1, [record.id], False)

        async def write(
            conn: AsyncConnection,
        ) -> tuple[sa.Row[Any] | None, list[tuple[RunRecord, Lease]]]:
            found = (await conn.execute(_AGENT_MAX_ATTEMPTS, the_agent)).first()
            if found is None:
                raise NotFoundError(
                    f"Agent {record.agent!r} not found in namespace {record.namespace!r}"
                )
            if found[0] is not None:
                record.max_attempts = int(found[0])
            if record.session_id is not None:  # opened (and locked) with its run: see delete
                await open_session(
                    conn, self._dialect, record.namespace, record.session_id, record.agent, now
                )
            existing: sa.Row[Any] | None = await self._inserting(record)(conn)
            if existing is not None or claiming is None:
                return existing, []
            return None, await claiming(conn)

        row, claimed = await self._write(f"submit run {record.id}", write)
        if row is not None:
            return Submitted(row_to_run(row), False)
        if claimed:
            claimed_record, lease = claimed[0]
            return Submitted(claimed_record, True, lease)
        return Submitted(record, True)

    def _inserting(self, record: RunRecord) -> Body[sa.Row[Any] | None]:
        """The body of a transaction inserting a new run: ``None``, or the stored run with
        the same idempotency key (then nothing is inserted)."""
        if record.idempotency_key is None:
            return _execute(_INSERT_RUN, run_values(record))
        # The unique index decides between racing submits, not a prior read: the
        # insert skips a conflicting key (on PostgreSQL after waiting for the racing
        # transaction to commit), so nothing aborts; a clash on the run id alone
        # still raises (ConflictError).
        insert = insert_or_skip(self._dialect, runs, _IDEMPOTENCY_COLUMNS)
        insert = insert.values(**run_values(record)).returning(runs.c.id)
        existing = sa.select(runs).where(
            runs.c.namespace == record.namespace,
            runs.c.agent == record.agent,
            runs.c.idempotency_key == record.idempotency_key,
        )

        async def write(conn: AsyncConnection) -> sa.Row[Any] | None:
            if (await conn.execute(insert)).first() is not None:
                return None
            return (await conn.execute(existing)).one()

        return write

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
        """See :meth:`Store.claim_runs`. A ``running`` run without a lease expiry (one the
        local runtime runs in-process) is never claimable. ``attempts`` is counted up to
        ``max_attempts``, not enforced: the claimer ends a run whose lease is ``exhausted``."""
        if limit <= 0 or (run_ids is not None and not run_ids):
            return []
        now = time.time() if now is None else now
        expires_at = now + lease_seconds
        claiming = self._claiming(owner, expires_at, now, limit, run_ids, or_higher_priority)
        return await self._write("claim runs", claiming)

    def _claiming(
        self,
        owner: str,
        expires_at: float,
        now: float,
        limit: int,
        run_ids: Sequence[str] | None,
        or_higher_priority: bool,
    ) -> Body[list[tuple[RunRecord, Lease]]]:
        """The body of a claim (see :meth:`claim_runs`): the runs it claimed with their
        leases, highest priority first."""
        # Two index walks (ix_runs_claim), each stopping at ``limit``, beat one OR
        # query that would sort every queued run. SKIP LOCKED lets PostgreSQL
        # claimers pass each other; on SQLite BEGIN IMMEDIATE serializes them.
        queued = sa.and_(runs.c.state == RunState.QUEUED.value, runs.c.not_before <= now)
        expired = sa.and_(runs.c.state == RunState.RUNNING.value, runs.c.lease_expires_at < now)
        only = runs.c.id.in_(run_ids) if run_ids is not None else sa.true()

        # On PostgreSQL each candidate row is locked as it is picked (FOR UPDATE SKIP
        # LOCKED): a row another claimer - or a fenced write of its holder - has
        # locked is passed over, not waited for, and cannot be picked twice.
        def walk(runnable: sa.ColumnElement[bool]) -> sa.Select[Any]:
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
                .order_by(*_CLAIM_ORDER)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )

        async def write(conn: AsyncConnection) -> list[tuple[RunRecord, Lease]]:
            # Agents at their max_concurrent_runs are left out (store/_agent_limits.py).
            room = await admission(conn)
            fits = room.exclude_saturated() if room is not None else sa.true()
            candidates: list[Any] = []
            for runnable in (sa.and_(queued, fits, only), sa.and_(expired, only)):
                candidates.extend((await conn.execute(walk(runnable))).all())
            if candidates and run_ids is not None and or_higher_priority:
                # Runs of a higher priority than the lowest given go before it.
                above = sa.and_(
                    runs.c.priority > min(row.priority for row in candidates),
                    runs.c.id.not_in(run_ids),
                )
                for runnable in (sa.and_(queued, fits, above), sa.and_(expired, above)):
                    candidates.extend((await conn.execute(walk(runnable))).all())
            if not candidates:
                return []
            candidates.sort(key=_claim_key)
            chosen = admitted(candidates, room, limit, RunState.QUEUED.value)
            if not chosen:
                return []
            ids = [row.id for row in chosen]
            claimed = (
                await conn.execute(
                    runs.update()
                    # The guard repeats the runnable test: a row another claimer
                    # took between the SELECT and here is left alone (SQLite).
                    .where(runs.c.id.in_(ids), sa.or_(queued, expired))
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
            ).all()
            # The rows are locked (PostgreSQL) or the writer alone (SQLite) since the
            # SELECT, so its attempts are those the UPDATE saw.
            exhausted = {row.id for row in chosen if row.exhausted}
            return [
                (
                    row_to_run(row),
                    Lease(row.id, owner, row.fencing_token, expires_at, row.id in exhausted),
                )
                for row in sorted(claimed, key=_claim_key)
            ]

        return write

    async def renew_lease(self, lease: Lease, lease_seconds: float) -> tuple[Lease, bool]:
        """See :meth:`Store.renew_lease`. Also ``LeaseLostError`` when the token still
        matches but the run is no longer ``running`` (its holder saved it into another
        state, which ended the lease); ``NotFoundError`` when the run is absent."""
        expires_at = time.time() + lease_seconds
        # Fenced like save_run: the UPDATE checks the token on the row it locks.
        renew = (
            runs.update()
            .where(
                runs.c.id == lease.run_id,
                runs.c.fencing_token == lease.token,
                runs.c.state == RunState.RUNNING.value,
            )
            .values(lease_expires_at=expires_at)
            .returning(runs.c.cancel_requested)
        )

        async def write(conn: AsyncConnection) -> bool:
            row = (await conn.execute(renew)).first()
            if row is None:
                await refuse(conn, lease.run_id, lease)
                raise LeaseLostError(
                    f"run {lease.run_id!r} is no longer running under the lease of {lease.owner!r}"
                )
            return bool(row.cancel_requested)

        cancel = await self._write(f"renew the lease on run {lease.run_id}", write)
        return Lease(lease.run_id, lease.owner, lease.token, expires_at), cancel

    async def release_run(
        self, lease: Lease, *, not_before: float = 0.0, refund_attempt: bool = False
    ) -> None:
        """See :meth:`Store.release_run`. When the token matches but the run is no longer
        ``running`` (already saved as finished or waiting), nothing changes: releasing
        must never re-queue a finished run. ``NotFoundError`` when the run is absent."""
        release = (
            runs.update()
            .where(
                runs.c.id == lease.run_id,
                runs.c.fencing_token == lease.token,
                runs.c.state == RunState.RUNNING.value,
            )
            .values(
                state=RunState.QUEUED.value,
                lease_owner=None,
                lease_expires_at=None,
                not_before=not_before,
                attempts=REFUNDED_ATTEMPTS if refund_attempt else runs.c.attempts,
            )
        )

        async def write(conn: AsyncConnection) -> None:
            if (await conn.execute(release)).rowcount == 0:
                # Same token but no longer running: the holder already saved the run
                # into another state, which ended the lease; nothing to give back.
                await refuse(conn, lease.run_id, lease)

        await self._write(f"release run {lease.run_id}", write)

    async def request_cancel(self, run_id: str) -> RunRecord:
        """See :meth:`Store.request_cancel`. A run cancelled at once gets
        ``finished_at`` and ``cancel_requested``; its pending approvals expire with
        ``decision_reason = "run cancelled"``."""
        now = time.time()

        async def write(conn: AsyncConnection) -> sa.Row[Any]:
            row = (
                await conn.execute(sa.select(runs).where(runs.c.id == run_id).with_for_update())
            ).first()
            if row is None:
                raise NotFoundError(f"run {run_id!r} not found")
            state = RunState(row.state)
            if state.finished:
                return row
            if state is RunState.RUNNING:
                values: dict[str, Any] = {"cancel_requested": True}
            else:
                values = {
                    "state": RunState.CANCELLED.value,
                    "cancel_requested": True,
                    "finished_at": now,
                    "lease_owner": None,
                    "lease_expires_at": None,
                }
                await conn.execute(
                    approvals_table.update()
                    .where(
                        approvals_table.c.run_id == run_id,
                        approvals_table.c.state == ApprovalState.PENDING.value,
                    )
                    .values(
                        state=ApprovalState.EXPIRED.value,
                        decided_at=now,
                        decision_reason="run cancelled",
                    )
                )
            return (
                await conn.execute(
                    runs.update().where(runs.c.id == run_id).values(**values).returning(*runs.c)
                )
            ).one()

        return row_to_run(await self._write(f"cancel run {run_id}", write))

    # ----------------------------------------------------------------- approvals

    async def list_approvals(
        self,
        namespace: str | None = None,
        *,
        run_id: str | None = None,
        states: Sequence[str] | None = None,
    ) -> list[Approval]:
        table = approvals_table
        query = sa.select(table)
        if namespace is not None:
            query = query.where(table.c.namespace == namespace)
        if run_id is not None:
            query = query.where(table.c.run_id == run_id)
        if states is not None:
            query = query.where(table.c.state.in_([str(s) for s in states]))
        query = query.order_by(table.c.requested_at, table.c.id)
        rows = await self._read("list approvals", _all(query))
        return [row_to_approval(row) for row in rows]

    async def get_approval(self, approval_id: str) -> Approval | None:
        query = sa.select(approvals_table).where(approvals_table.c.id == approval_id)
        row = await self._read(f"read approval {approval_id}", _first(query))
        return row_to_approval(row) if row is not None else None

    async def decide_approval(
        self, approval_id: str, approved: bool, *, by: str | None = None, reason: str | None = None
    ) -> Approval:
        """See :meth:`Store.decide_approval`. A pending approval already past its
        ``expires_at`` (not yet swept) is expired on the spot - committed, its run
        re-queued as by :meth:`expire_approvals` - and the decision is refused with
        ``ConflictError``."""
        now = time.time()
        table = approvals_table

        async def write(conn: AsyncConnection) -> tuple[sa.Row[Any], bool]:
            found = (
                await conn.execute(
                    sa.select(table.c.state, table.c.expires_at)
                    .where(table.c.id == approval_id)
                    .with_for_update()
                )
            ).first()
            if found is None:
                raise NotFoundError(f"approval {approval_id!r} not found")
            if found.state != ApprovalState.PENDING.value:
                raise ConflictError(f"approval {approval_id!r} is already {found.state}")
            overdue = found.expires_at is not None and found.expires_at <= now
            if overdue:
                # Past its deadline but not swept yet: expire it now (and commit that)
                # rather than let a late decision through.
                values: dict[str, Any] = {"state": ApprovalState.EXPIRED.value, "decided_at": now}
            else:
                state = ApprovalState.APPROVED if approved else ApprovalState.REJECTED
                values = {
                    "state": state.value,
                    "decided_at": now,
                    "decided_by": by,
                    "decision_reason": reason,
                }
            row = (
                await conn.execute(
                    table.update()
                    .where(table.c.id == approval_id)
                    .values(**values)
                    .returning(*table.c)
                )
            ).one()
            await requeue_settled_runs(conn, [row.run_id], now)
            return row, overdue

        row, overdue = await self._write(f"decide approval {approval_id}", write)
        if overdue:
            raise ConflictError(f"approval {approval_id!r} is already expired")
        return row_to_approval(row)

    async def expire_approvals(self, now: float | None = None) -> list[Approval]:
        """See :meth:`Store.expire_approvals`; due means ``expires_at <= now``."""
        now = time.time() if now is None else now
        table = approvals_table
        expire = (
            table.update()
            .where(
                table.c.state == ApprovalState.PENDING.value,
                table.c.expires_at.is_not(None),
                table.c.expires_at <= now,
            )
            .values(state=ApprovalState.EXPIRED.value, decided_at=now)
            .returning(*table.c)
        )

        async def write(conn: AsyncConnection) -> Sequence[sa.Row[Any]]:
            rows = (await conn.execute(expire)).all()
            if rows:
                await requeue_settled_runs(conn, sorted({r.run_id for r in rows}), now)
            return rows

        rows = await self._write("expire approvals", write)
        expired = [row_to_approval(row) for row in rows]
        expired.sort(key=lambda a: (a.requested_at, a.id))
        return expired

    # ----------------------------------------------------------------- sessions

    async def get_or_create_session(self, namespace: str, session_id: str, agent: str) -> Session:
        action = f"open session {session_id}"
        row = await self._read(
            action, _first(sa.select(sessions).where(session_key(namespace, session_id)))
        )
        if row is None:
            now = time.time()

            async def write(conn: AsyncConnection) -> sa.Row[Any]:
                return await open_session(conn, self._dialect, namespace, session_id, agent, now)

            row = await self._write(action, write)
        elif row.agent != agent:
            raise ConflictError(f"session {session_id!r} belongs to agent {row.agent!r}")
        return row_to_session(row)

    async def get_session(self, namespace: str, session_id: str) -> Session | None:
        query = sa.select(sessions).where(session_key(namespace, session_id))
        row = await self._read(f"read session {session_id}", _first(query))
        return row_to_session(row) if row is not None else None

    async def list_sessions(self, namespace: str, agent: str | None = None) -> list[Session]:
        query = sa.select(sessions).where(sessions.c.namespace == namespace)
        if agent is not None:
            query = query.where(sessions.c.agent == agent)
        query = query.order_by(sessions.c.updated_at.desc(), sessions.c.id.desc())
        rows = await self._read("list sessions", _all(query))
        return [row_to_session(row) for row in rows]

    async def prune_runs(
        self,
        *,
        finished_before: float | None = None,
        keep_last: int | None = None,
        namespace: str | None = None,
    ) -> int:
        finished = runs.c.state.in_([s.value for s in RunState if s.finished])
        scope = finished if namespace is None else sa.and_(finished, runs.c.namespace == namespace)
        doomed: list[sa.ColumnElement[bool]] = []
        if finished_before is not None:
            doomed.append(runs.c.finished_at < finished_before)
        if keep_last is not None:
            rank = (
                sa.select(
                    runs.c.id,
                    sa.func.row_number()
                    .over(partition_by=runs.c.namespace, order_by=runs.c.finished_at.desc())
                    .label("rank"),
                )
                .where(scope)
                .subquery()
            )
            doomed.append(runs.c.id.in_(sa.select(rank.c.id).where(rank.c.rank > keep_last)))
        if not doomed:
            return 0
        # events and approvals go with their run (ON DELETE CASCADE)
        delete = runs.delete().where(scope, sa.or_(*doomed))

        async def write(conn: AsyncConnection) -> int:
            return int((await conn.execute(delete)).rowcount)

        return await self._write("prune runs", write)

    async def delete_session(self, namespace: str, session_id: str) -> None:
        """See :meth:`Store.delete_session`: the check for unfinished runs and the delete
        are one transaction."""
        delete = sessions.delete().where(session_key(namespace, session_id))
        unfinished = unfinished_run_of_session(namespace, session_id)

        async def write(conn: AsyncConnection) -> None:
            # Deleting first locks the row (PostgreSQL): a submit holding it (open_session)
            # has committed its run by the time the check below reads the runs.
            if (await conn.execute(delete)).rowcount == 0:
                raise NotFoundError(f"session {session_id!r} not found")
            run = (await conn.execute(unfinished)).first()
            if run is not None:  # raising rolls the delete back
                raise session_in_use(session_id, run.id, run.state)

        await self._write(f"delete session {session_id}", write)

    async def append_session_messages(
        self,
        namespace: str,
        session_id: str,
        messages: Sequence[Message],
        run_id: str | None = None,
        lease: Lease | None = None,
    ) -> list[SessionMessage]:
        """See :meth:`Store.append_session_messages`. ``run_id`` defaults to the lease's
        run; seqs continue from the session's last one; ``NotFoundError`` when the
        session is absent."""
        if not messages:
            return []
        if run_id is None and lease is not None:
            run_id = lease.run_id
        now = time.time()

        async def write(conn: AsyncConnection) -> list[SessionMessage]:
            if lease is not None:
                await check_fence(conn, lease)
            return await _append_to_session(conn, namespace, session_id, messages, run_id, now)

        return await self._write(f"append to session {session_id}", write)

    async def session_messages(
        self, namespace: str, session_id: str, *, include_hidden: bool = False
    ) -> list[SessionMessage]:
        """See :meth:`Store.session_messages`: ordered by position (a summary sits before
        the messages it left visible); an unknown session has no messages."""
        table = session_messages
        query = sa.select(table).where(in_session(namespace, session_id))
        if not include_hidden:
            query = query.where(table.c.hidden == sa.false())
        query = query.order_by(table.c.position, table.c.seq)
        rows = await self._read(f"read session {session_id}", _all(query))
        return [row_to_session_message(row) for row in rows]

    async def compact_session(
        self, namespace: str, session_id: str, up_to_seq: int, summary: Message | None
    ) -> None:
        """See :meth:`Store.compact_session`. ``up_to_seq`` names the last message to
        hide *in session order*: every visible message placed at or before it is
        hidden - for ordinary messages that is ``seq <= up_to_seq``, and an earlier
        summary (a high seq placed early) goes with what it summarised. A seq that is
        not in the session cuts at that number. ``NotFoundError`` when absent."""
        table = session_messages
        messages_of = in_session(namespace, session_id)
        now = time.time()

        async def write(conn: AsyncConnection) -> None:
            await touch_session(conn, namespace, session_id, now)
            # The cut is where message ``up_to_seq`` sits in the session's order, so
            # an earlier summary (a high seq placed early) is hidden with what it
            # summarised. Ordinary messages sit at position == seq.
            found = (
                await conn.execute(
                    sa.select(table.c.position).where(messages_of, table.c.seq == up_to_seq)
                )
            ).scalar()
            cut = float(up_to_seq) if found is None else float(found)
            visible = sa.and_(messages_of, table.c.hidden == sa.false())
            await conn.execute(
                table.update().where(visible, table.c.position <= cut).values(hidden=True)
            )
            if summary is None:
                return
            top = await last_seq(conn, namespace, session_id)
            following = (
                await conn.execute(
                    sa.select(sa.func.min(table.c.position)).where(visible, table.c.position > cut)
                )
            ).scalar()
            # Between the cut and the first message left visible; with none left,
            # before the position the next appended message will get.
            low = min(cut, float(top))
            high = float(following) if following is not None else float(top + 1)
            stored = SessionMessage(top + 1, summary, summary=True, created_at=now)
            await conn.execute(
                table.insert().values(
                    **session_message_values(namespace, session_id, stored, (low + high) / 2)
                )
            )

        await self._write(f"compact session {session_id}", write)

    # ----------------------------------------------------------------- events

    async def append_events(self, events: Sequence[Event], lease: Lease | None = None) -> None:
        """See :meth:`Store.append_events`; under a lease, events of another run are a
        ``ConflictError``."""
        if not events:
            return
        if lease is not None and any(e.run_id != lease.run_id for e in events):
            raise ConflictError(
                f"events of another run cannot be written under a lease on {lease.run_id!r}"
            )
        rows = _event_rows(events)
        run_ids = sorted({e.run_id for e in events})

        async def write(conn: AsyncConnection) -> None:
            if lease is not None:
                await check_fence(conn, lease)
            else:
                await lock_runs(conn, run_ids)
            await conn.execute(run_events.insert(), rows)

        # One batch of a run at a time, in call order (see _Turns); a batch of several
        # runs (never under a lease) is ordered by the row locks alone.
        turn = self._run_turns.turn(run_ids[0]) if len(run_ids) == 1 else nullcontext()
        async with turn:
            await self._write("append run events", write)

    async def list_events(
        self, run_id: str, after_seq: int = 0, limit: int | None = None
    ) -> list[Event]:
        query = (
            sa.select(run_events)
            .where(run_events.c.run_id == run_id, run_events.c.seq > after_seq)
            .order_by(run_events.c.seq)
            .limit(limit)
        )
        rows = await self._read("list run events", _all(query))
        return [
            Event(run_id=r.run_id, seq=r.seq, type=EventType(r.type), data=r.data, ts=r.ts)
            for r in rows
        ]

    # ----------------------------------------------------------------- API tokens

    async def create_token(self, token: ApiToken) -> None:
        insert = api_tokens.insert().values(**token_values(token))
        await self._write(f"create token {token.id}", _execute(insert))

    async def get_token(self, token_id: str) -> ApiToken | None:
        query = sa.select(api_tokens).where(api_tokens.c.id == token_id)
        row = await self._read(f"read token {token_id}", _first(query))
        return row_to_token(row) if row is not None else None

    async def list_tokens(self, namespace: str | None = None) -> list[ApiToken]:
        query = sa.select(api_tokens)
        if namespace is not None:
            query = query.where(api_tokens.c.namespace == namespace)
        query = query.order_by(api_tokens.c.created_at, api_tokens.c.id)
        rows = await self._read("list tokens", _all(query))
        return [row_to_token(row) for row in rows]

    async def revoke_token(self, token_id: str) -> ApiToken:
        now = time.time()
        revoke = (
            api_tokens.update()
            .where(api_tokens.c.id == token_id, api_tokens.c.revoked_at.is_(None))
            .values(revoked_at=now)
        )

        async def write(conn: AsyncConnection) -> sa.Row[Any] | None:
            await conn.execute(revoke)
            return (
                await conn.execute(sa.select(api_tokens).where(api_tokens.c.id == token_id))
            ).first()

        row = await self._write(f"revoke token {token_id}", write)
        if row is None:
            raise NotFoundError(f"token {token_id!r} not found")
        return row_to_token(row)

    async def touch_token(self, token_id: str, when: float) -> None:
        # Only forward: a late write from another process never moves it back.
        touch = (
            api_tokens.update()
            .where(
                api_tokens.c.id == token_id,
                sa.or_(api_tokens.c.last_used_at.is_(None), api_tokens.c.last_used_at < when),
            )
            .values(last_used_at=when)
        )
        await self._write(f"touch token {token_id}", _execute(touch))


# --------------------------------------------------------------------------- helpers


class _Turns:
    """First come, first served turns per key (a run id), within one store instance.

    Event appends of one run commit in the order they were called: the
    executor may flush two batches from parallel tool calls, and a follower
    reading after a cursor must never see seq 6 committed before seq 5 (it
    would skip 5). Across processes only the lease holder appends, and the
    run row lock (``check_fence``) serializes the transactions themselves.
    """

    def __init__(self) -> None:
        self._locks: dict[str, tuple[anyio.Lock, int]] = {}

    @asynccontextmanager
    async def turn(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (anyio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:  # anyio locks are FIFO
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


def _all(query: sa.Executable) -> Body[Sequence[sa.Row[Any]]]:
    """A body that returns every row of ``query``."""

    async def body(conn: AsyncConnection) -> Sequence[sa.Row[Any]]:
        return (await conn.execute(query)).all()

    return body


def _first(query: sa.Executable) -> Body[sa.Row[Any] | None]:
    """A body that returns the first row of ``query``, or ``None``."""

    async def body(conn: AsyncConnection) -> sa.Row[Any] | None:
        return (await conn.execute(query)).first()

    return body


def _execute(statement: sa.Executable, parameters: dict[str, Any] | None = None) -> Body[None]:
    """A body that executes ``statement`` (with ``parameters``)."""

    async def body(conn: AsyncConnection) -> None:
        await conn.execute(statement, parameters)

    return body


# --------------------------------------------------------------------------- rows


def _event_rows(events: Sequence[Event], run_id: str | None = None) -> list[dict[str, Any]]:
    """Rows of ``run_events``; with ``run_id``, events of another run are a ``ConflictError``."""
    if run_id is not None and any(e.run_id != run_id for e in events):
        raise ConflictError(f"events of another run cannot be saved with run {run_id!r}")
    return [
        {"run_id": e.run_id, "seq": e.seq, "type": str(e.type), "ts": e.ts, "data": e.data}
        for e in events
    ]


def _check_kinds(items: Sequence[Resource | LoadedResource]) -> None:
    problems = []
    for item in items:
        resource = resource_of(item)
        expected = SPEC_TYPES.get(resource.kind)
        if expected is None or not isinstance(resource.spec, expected):
            problems.append(
                (
                    locate(item, ("spec",)),
                    f"{resource.kind} {resource.name!r}: spec does not fit the kind",
                )
            )
    if problems:
        raise ResourceError(problems)


def _resource_key(namespace: str, kind: str, name: str) -> sa.ColumnElement[bool]:
    return sa.and_(
        resources.c.namespace == namespace, resources.c.kind == kind, resources.c.name == name
    )


async def _fetch_resource(
    conn: AsyncConnection, namespace: str, kind: str, name: str
) -> sa.Row[Any] | None:
    query = sa.select(resources).where(_resource_key(namespace, kind, name))
    return (await conn.execute(query)).first()


async def _append_to_session(
    conn: AsyncConnection,
    namespace: str,
    session_id: str,
    messages: Sequence[Message],
    run_id: str | None,
    now: float,
) -> list[SessionMessage]:
    # Touching the session first also locks it (PostgreSQL) for the seq below.
    await touch_session(conn, namespace, session_id, now)
    top = await last_seq(conn, namespace, session_id)
    stored = [
        SessionMessage(top + i, message, run_id, created_at=now)
        for i, message in enumerate(messages, start=1)
    ]
    await conn.execute(
        session_messages.insert(),
        [session_message_values(namespace, session_id, m, float(m.seq)) for m in stored],
    )
    return stored
