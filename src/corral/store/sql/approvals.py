"""Approvals in the SQL store: list and read them, decide one, expire the overdue ones.

Deciding or expiring a run's last pending approval re-queues the run in the
same transaction (:func:`~corral.store.sql.statements.requeue_settled_runs`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.errors import ConflictError, NotFoundError
from corral.core.runs import Approval, ApprovalState
from corral.store.schema import approvals as approvals_table
from corral.store.sql import keyset
from corral.store.sql.engine import SqlEngine, fetch_all, fetch_first
from corral.store.sql.rows import APPROVALS
from corral.store.sql.statements import expire_due_approvals, requeue_settled_runs


class SqlApprovals(SqlEngine):
    """The approval operations of :class:`~corral.store.sql.SqlStore`."""

    async def list_approvals(
        self,
        namespace: str | None = None,
        *,
        run_id: str | None = None,
        states: Sequence[str] | None = None,
        limit: int | None = None,
        after: tuple[float, str] | None = None,
    ) -> list[Approval]:
        query = select_approvals(namespace, run_id, states, limit, after)
        rows = await self._read("list approvals", fetch_all(query))
        return [APPROVALS.record(row) for row in rows]

    async def get_approval(self, approval_id: str) -> Approval | None:
        query = sa.select(approvals_table).where(approvals_table.c.id == approval_id)
        row = await self._read(f"read approval {approval_id}", fetch_first(query))
        return APPROVALS.record(row) if row is not None else None

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
        return APPROVALS.record(row)

    async def expire_approvals(self, now: float | None = None) -> list[Approval]:
        """See :meth:`Store.expire_approvals`; due means ``expires_at <= now``."""
        now = time.time() if now is None else now
        expire = expire_due_approvals(now)

        async def write(conn: AsyncConnection) -> Sequence[sa.Row[Any]]:
            rows = (await conn.execute(expire)).all()
            if rows:
                await requeue_settled_runs(conn, sorted({r.run_id for r in rows}), now)
            return rows

        rows = await self._write("expire approvals", write)
        expired = [APPROVALS.record(row) for row in rows]
        expired.sort(key=lambda a: (a.requested_at, a.id))
        return expired


def select_approvals(
    namespace: str | None,
    run_id: str | None,
    states: Sequence[str] | None,
    limit: int | None,
    after: tuple[float, str] | None,
) -> sa.Select[Any]:
    """The query of :meth:`Store.list_approvals` (the SQLite fast path runs it too)."""
    table = approvals_table
    query = sa.select(table)
    if namespace is not None:
        query = query.where(table.c.namespace == namespace)
    if run_id is not None:
        query = query.where(table.c.run_id == run_id)
    if states is not None:
        query = query.where(table.c.state.in_([str(s) for s in states]))
    return keyset.page(query, (table.c.requested_at, table.c.id), limit=limit, position=after)
