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

from corral.core.messages import Usage, load
from corral.core.runs import Lease, RunRecord, RunState
from corral.store.base import Allowance, Submitted
from corral.store.schema import runs
from corral.store.sql.agent_limits import admission, admitted
from corral.store.sql.engine import Body, SqlEngine, execute
from corral.store.sql.rows import RUNS
from corral.store.sql.rules import (
    agent_not_found,
    check_parent_open,
    check_session_of_tree,
    no_longer_running,
)
from corral.store.sql.statements import (
    IDEMPOTENCY_COLUMNS,
    agent_max_attempts,
    allowance_holders,
    claim,
    claim_candidates,
    due,
    insert_or_skip,
    lease_expired,
    open_session,
    outranks,
    parent_of_new_child,
    refuse,
    release,
    renew,
    run_by_key,
    session_of_tree,
)

# The statements of the hot paths as single objects, their values passed as parameters
# (a statement built anew per call costs its cache key to compute).
_INSERT_RUN = runs.insert()
_AGENT_MAX_ATTEMPTS = agent_max_attempts(sa.bindparam("b_namespace"), sa.bindparam("b_name"))
#: the first key of the PostgreSQL advisory locks (two-int form) that serialize the submits
#: of children sharing an allowance (the second: a hash of the group)
ALLOWANCE_LOCK_CLASS = 0x636F72  # "cor"


def _claim_key(row: sa.Row[Any]) -> tuple[int, float, str]:
    return (-row.priority, row.created_at, row.id)


class SqlClaims(SqlEngine):
    """The task operations of :class:`~corral.store.sql.SqlStore`: submit, claim, lease."""

    async def submit_run(self, record: RunRecord) -> tuple[RunRecord, bool]:
        """See :meth:`Store.submit_run`; the record is stored as given (callers pass a
        ``queued`` one). A clash on the run id alone is a ``ConflictError``."""
        row = await self._write(f"submit run {record.id}", self._inserting(record))
        return (record, True) if row is None else (RUNS.record(row), False)

    async def submit_agent_run(
        self,
        record: RunRecord,
        *,
        claim_for: tuple[str, float] | None = None,
        allowance: Allowance | None = None,
    ) -> Submitted:
        """See :meth:`Store.submit_agent_run`: the Agent's ``max_attempts`` is read, a
        child's parent checked, the session opened, the run inserted and, when asked for,
        claimed in one transaction (no resource read and validation of its own)."""
        the_agent = {"b_namespace": record.namespace, "b_name": record.agent}
        now = time.time()
        claim_body = None
        if claim_for is not None and record.not_before <= now:
            owner, lease_seconds = claim_for
            claim_body = claiming(owner, now + lease_seconds, now, 1, [record.id], False)

        async def write(
            conn: AsyncConnection,
        ) -> tuple[sa.Row[Any] | None, list[tuple[RunRecord, Lease]]]:
            found = (await conn.execute(_AGENT_MAX_ATTEMPTS, the_agent)).first()
            if found is None:
                raise agent_not_found(record)
            if found[0] is not None:
                record.max_attempts = int(found[0])
            if record.parent_run_id is not None:
                parent = parent_of_new_child(record.parent_run_id)
                check_parent_open(record, (await conn.execute(parent)).first())
                if allowance is not None:
                    await self._cap_by_allowance(conn, record, allowance)
            if record.session_id is not None:  # opened (and locked) with its run: see delete
                session = await open_session(
                    conn, self._dialect, record.namespace, record.session_id, record.agent, now
                )
                await self._check_session_of_tree(conn, record, session.created_at == now)
            existing: sa.Row[Any] | None = await self._inserting(record)(conn)
            if existing is not None or claim_body is None:
                return existing, []
            return None, await claim_body(conn)

        row, claimed = await self._write(f"submit run {record.id}", write)
        if row is not None:
            return Submitted(RUNS.record(row), False)
        if claimed:
            claimed_record, lease = claimed[0]
            return Submitted(claimed_record, True, lease)
        return Submitted(record, True)

    @staticmethod
    async def _check_session_of_tree(
        conn: AsyncConnection, record: RunRecord, opened_now: bool
    ) -> None:
        """A child run continues only a session of its run tree (see the rule)."""
        if record.parent_run_id is None or opened_now or record.session_id is None:
            return
        query = session_of_tree(record.parent_run_id, record.namespace, record.session_id)
        check_session_of_tree(record, opened_now, (await conn.execute(query)).scalar())

    async def _cap_by_allowance(
        self, conn: AsyncConnection, record: RunRecord, allowance: Allowance
    ) -> None:
        """Cap the child ``record`` at what ``allowance`` has left, as this transaction reads
        it; on PostgreSQL the siblings' submits take turns (an advisory lock of the group)."""
        key = record.idempotency_key or ""
        if self._dialect == "postgresql":
            group = f"{record.parent_run_id} {allowance.group}"
            lock = sa.func.pg_advisory_xact_lock(ALLOWANCE_LOCK_CLASS, sa.func.hashtext(group))
            await conn.execute(sa.select(lock))
        holders = allowance_holders(record.parent_run_id, allowance.group)
        others = [
            (row[0], RunState(row[1]), row[2], row[3], row[4], load(Usage, row[5]))
            for row in await conn.execute(holders)
        ]
        record.max_cost_usd, record.max_tokens = allowance.caps(key, others)

    def _inserting(self, record: RunRecord) -> Body[sa.Row[Any] | None]:
        """The body of a transaction inserting a new run: ``None``, or the stored run with
        the same idempotency key (then nothing is inserted)."""
        if record.idempotency_key is None:
            return execute(_INSERT_RUN, RUNS.values(record))
        # The unique index decides between racing submits, not a prior read: the
        # insert skips a conflicting key (on PostgreSQL after waiting for the racing
        # transaction to commit), so nothing aborts; a clash on the run id alone
        # still raises (ConflictError).
        insert = insert_or_skip(self._dialect, runs, IDEMPOTENCY_COLUMNS)
        insert = insert.values(**RUNS.values(record)).returning(runs.c.id)
        existing = run_by_key(record.namespace, record.agent, record.idempotency_key)

        async def write(conn: AsyncConnection) -> sa.Row[Any] | None:
            if (await conn.execute(insert)).first() is not None:
                return None
            row: sa.Row[Any] = (await conn.execute(existing)).one()
            return row

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
        expired_only: bool = False,
    ) -> list[tuple[RunRecord, Lease]]:
        """See :meth:`Store.claim_runs`. A ``running`` run without a lease expiry (one the
        local runtime runs in-process) is never claimable. ``attempts`` is counted up to
        ``max_attempts``, not enforced: the claimer ends a run whose lease is ``exhausted``."""
        if limit <= 0 or (run_ids is not None and not run_ids):
            return []
        now = time.time() if now is None else now
        expires_at = now + lease_seconds
        body = claiming(
            owner, expires_at, now, limit, run_ids, or_higher_priority, expired_only=expired_only
        )
        return await self._write("claim runs", body)

    async def renew_lease(self, lease: Lease, lease_seconds: float) -> tuple[Lease, bool]:
        """See :meth:`Store.renew_lease`. Also ``LeaseLostError`` when the token still
        matches but the run is no longer ``running`` (its holder saved it into another
        state, which ended the lease); ``NotFoundError`` when the run is absent."""
        expires_at = time.time() + lease_seconds
        # Fenced like save_run: the UPDATE checks the token on the row it locks.
        renewal = renew(lease.run_id, lease.token, expires_at)

        async def write(conn: AsyncConnection) -> bool:
            row = (await conn.execute(renewal)).first()
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
        release_it = release(lease.run_id, lease.token, not_before, refund_attempt=refund_attempt)

        async def write(conn: AsyncConnection) -> None:
            if (await conn.execute(release_it)).rowcount == 0:
                # Same token but no longer running: the holder already saved the run
                # into another state, which ended the lease; nothing to give back.
                await refuse(conn, lease.run_id, lease)

        await self._write(f"release run {lease.run_id}", write)


def claiming(
    owner: str,
    expires_at: float,
    now: float,
    limit: int,
    run_ids: Sequence[str] | None,
    or_higher_priority: bool,
    *,
    expired_only: bool = False,
) -> Body[list[tuple[RunRecord, Lease]]]:
    """The body of a claim (see :meth:`SqlClaims.claim_runs`): the runs it claimed with
    their leases, highest priority first (also a save's claim of the run it woke)."""
    # Two index walks (ix_runs_claim), each stopping at ``limit``, beat one OR
    # query that would sort every queued run. SKIP LOCKED lets PostgreSQL
    # claimers pass each other; on SQLite BEGIN IMMEDIATE serializes them.
    queued, expired = due(now), lease_expired(now)
    only = runs.c.id.in_(run_ids) if run_ids is not None else sa.true()

    async def write(conn: AsyncConnection) -> list[tuple[RunRecord, Lease]]:
        # Agents at their max_concurrent_runs are left out (store/sql/agent_limits.py).
        room = await admission(conn)
        fits = room.exclude_saturated() if room is not None else sa.true()
        candidates: list[Any] = []

        def walks(among: sa.ColumnElement[bool]) -> list[sa.ColumnElement[bool]]:
            expiries = [sa.and_(expired, among)]
            return expiries if expired_only else [sa.and_(queued, fits, among), *expiries]

        for runnable in walks(only):
            candidates.extend((await conn.execute(claim_candidates(runnable, limit))).all())
        if candidates and run_ids is not None and or_higher_priority:
            # Runs of a higher priority than the lowest given go before it.
            above = outranks(min(row.priority for row in candidates), run_ids)
            for runnable in walks(above):
                candidates.extend((await conn.execute(claim_candidates(runnable, limit))).all())
        if not candidates:
            return []
        candidates.sort(key=_claim_key)
        chosen = admitted(candidates, room, limit, RunState.QUEUED.value)
        if not chosen:
            return []
        ids = [row.id for row in chosen]
        claimed = (await conn.execute(claim(ids, owner, expires_at, now))).all()
        # The rows are locked (PostgreSQL) or the writer alone (SQLite) since the
        # SELECT, so its attempts are those the UPDATE saw.
        exhausted = {row.id for row in chosen if row.exhausted}
        return [
            (
                RUNS.record(row),
                Lease(row.id, owner, row.fencing_token, expires_at, row.id in exhausted),
            )
            for row in sorted(claimed, key=_claim_key)
        ]

    return write
