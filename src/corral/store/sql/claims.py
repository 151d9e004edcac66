"""Runs as durable tasks in the SQL store: submit, claim, renew a lease, release.

A claim bumps the run's fencing token; a write made under a
:class:`~corral.core.runs.Lease` checks the token in the same transaction and is
refused (``LeaseLostError``) once a newer claim bumped it. Expiry alone refuses
nothing: an expired lease still writes until someone else claims the run. On
PostgreSQL claims take ``FOR UPDATE SKIP LOCKED`` and idempotent submits let the
unique index decide with ``ON CONFLICT DO NOTHING``; on SQLite ``BEGIN IMMEDIATE``
serializes them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.runs import Lease, RunRecord, RunState
from corral.store.base import Submitted
from corral.store.schema import resources, runs
from corral.store.sql.agent_limits import admission, admitted
from corral.store.sql.engine import Body, SqlEngine, execute
from corral.store.sql.rows import row_to_run, run_values
from corral.store.sql.rules import agent_not_found, no_longer_running
from corral.store.sql.statements import (
    CLAIMED_ATTEMPTS,
    EXHAUSTED,
    REFUNDED_ATTEMPTS,
    insert_or_skip,
    open_session,
    refuse,
)

_IDEMPOTENCY_COLUMNS = ("namespace", "agent", "idempotency_key")
# The statements of the hot paths as single objects, their values passed as parameters
# (a statement built anew per call costs its cache key to compute).
_INSERT_RUN = runs.insert()
_AGENT_MAX_ATTEMPTS = sa.select(resources.c.spec["max_attempts"].as_integer()).where(
    resources.c.namespace == sa.bindparam("b_namespace"),
    resources.c.kind == "Agent",
    resources.c.name == sa.bindparam("b_name"),
)
# Claim order: highest priority first, then oldest; ``ix_runs_claim`` serves it.
_CLAIM_ORDER = (runs.c.priority.desc(), runs.c.created_at, runs.c.id)


def _claim_key(row: sa.Row[Any]) -> tuple[int, float, str]:
    return (-row.priority, row.created_at, row.id)


class SqlClaims(SqlEngine):
    """The task operations of :class:`~corral.store.sql.SqlStore`: submit, claim, lease."""

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
                raise agent_not_found(record)
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
            return execute(_INSERT_RUN, run_values(record))
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
            # Agents at their max_concurrent_runs are left out (store/sql/agent_limits.py).
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
                raise no_longer_running(lease)
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
