"""Runs in the SQL store: save, read, list and count them, cancel one, prune finished ones.

Submitting, claiming and the leases of runs-as-tasks are in
:mod:`corral.store.sql.claims`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.errors import NotFoundError
from corral.core.events import Event
from corral.core.messages import Message
from corral.core.runs import Approval, ApprovalState, Lease, RunRecord, RunState
from corral.core.selectors import Selector
from corral.store.base import RunCounts, WokenRun
from corral.store.schema import approvals as approvals_table
from corral.store.schema import run_events, runs
from corral.store.sql import keyset
from corral.store.sql.claims import claiming
from corral.store.sql.engine import SqlEngine, fetch_all, fetch_first
from corral.store.sql.labels import selector_clause
from corral.store.sql.rows import APPROVALS, EVENTS, RUNS
from corral.store.sql.rules import check_events_saved_with, saved_run_values
from corral.store.sql.statements import (
    SAVE_RUN,
    SAVE_RUN_FENCED,
    append_to_session,
    children_of,
    parent_of_child,
    queue_overdue,
    refuse,
    requeue_parent,
    run_by_id,
    wake_parent,
)


class SqlRuns(SqlEngine):
    """The run operations of :class:`~corral.store.sql.SqlStore` (claims aside)."""

    async def save_run(
        self,
        record: RunRecord,
        lease: Lease | None = None,
        approvals: Sequence[Approval] = (),
        session_messages: Sequence[Message] = (),
        events: Sequence[Event] = (),
        claim_woken: tuple[str, float] | None = None,
    ) -> WokenRun | None:
        """See :meth:`Store.save_run`. Also: ``cancel_requested`` is only ever raised by a
        save, never cleared (the flag belongs to :meth:`request_cancel`); a lease on
        another run is a ``ConflictError``."""
        values = saved_run_values(record, lease)
        # One statement object for every save, the values as parameters (see SAVE_RUN).
        values["b_id"] = record.id
        statement = SAVE_RUN
        if lease is not None:
            # The UPDATE checks the token and locks the row in one step: on PostgreSQL a
            # claim in flight makes it wait, then re-check the token of the claimed row.
            statement = SAVE_RUN_FENCED
            values["b_token"] = lease.token
        namespace, session_id = record.namespace, record.session_id
        check_events_saved_with(events, record.id)
        event_rows = [EVENTS.values(e) for e in events]
        now = time.time()

        async def write(conn: AsyncConnection) -> WokenRun | None:
            result = await conn.execute(statement, values)
            if result.rowcount == 0:
                await refuse(conn, record.id, lease)
            woken = await wake_parent(conn, record.id, record.parent_run_id, record.state, now)
            if approvals:
                await conn.execute(
                    approvals_table.insert(), [APPROVALS.values(a) for a in approvals]
                )
            if session_messages and session_id is not None:
                await append_to_session(
                    conn, namespace, session_id, session_messages, record.id, now
                )
            if event_rows:
                await conn.execute(run_events.insert(), event_rows)
            if woken is None or claim_woken is None:
                return None if woken is None else WokenRun(woken)
            # Last: a claim may take the admission lock (agent_limits.py), which a submit
            # takes after locking its session; the session's lock comes first here too.
            owner, lease_seconds = claim_woken
            claimed = await claiming(owner, now + lease_seconds, now, 1, [woken], False)(conn)
            return WokenRun(woken, *claimed[0]) if claimed else WokenRun(woken)

        # Events saved with the run take their turn after the run's pending appends.
        async with self._run_turns.turn(record.id) if event_rows else nullcontext():
            return await self._write(f"save run {record.id}", write)

    async def get_run(self, run_id: str) -> RunRecord | None:
        row = await self._read(f"read run {run_id}", fetch_first(run_by_id(run_id)))
        return RUNS.record(row) if row is not None else None

    async def list_runs(
        self,
        namespace: str,
        agent: str | None = None,
        limit: int = 50,
        states: Sequence[RunState] | None = None,
        *,
        before: tuple[float, str] | None = None,
        selector: Selector | None = None,
        session: str | None = None,
        status_since: float | None = None,
    ) -> list[RunRecord]:
        matching = self._matching(namespace, agent, states, selector, session, status_since)
        query = keyset.page(
            sa.select(runs).where(*matching),
            (runs.c.created_at, runs.c.id),
            limit=limit,
            position=before,
            descending=True,
        )
        rows = await self._read("list runs", fetch_all(query))
        return [RUNS.record(row) for row in rows]

    async def count_matching_runs(
        self,
        namespace: str,
        agent: str | None = None,
        states: Sequence[RunState] | None = None,
        *,
        selector: Selector | None = None,
        session: str | None = None,
        status_since: float | None = None,
    ) -> int:
        matching = self._matching(namespace, agent, states, selector, session, status_since)
        query = sa.select(sa.func.count()).select_from(runs).where(*matching)

        async def read(conn: AsyncConnection) -> int:
            return int((await conn.execute(query)).scalar_one())

        return await self._read("count runs", read)

    def _matching(
        self,
        namespace: str,
        agent: str | None,
        states: Sequence[RunState] | None,
        selector: Selector | None,
        session: str | None,
        status_since: float | None,
    ) -> list[sa.ColumnElement[bool]]:
        """The conditions of :meth:`list_runs` and :meth:`count_matching_runs`, once."""
        matching = [runs.c.namespace == namespace]
        if agent is not None:
            matching.append(runs.c.agent == agent)
        if states is not None:
            matching.append(runs.c.state.in_([RunState(s).value for s in states]))
        if selector is not None:
            matching.append(selector_clause(self._dialect, runs.c.labels, selector))
        if session is not None:
            matching.append(runs.c.session_id == session)
        if status_since is not None:
            # RunRecord.status_at, in SQL
            status_at = sa.func.coalesce(runs.c.finished_at, runs.c.started_at, runs.c.created_at)
            matching.append(status_at >= status_since)
        return matching

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

    async def request_cancel(self, run_id: str) -> RunRecord:
        """See :meth:`Store.request_cancel`. A run cancelled at once gets
        ``finished_at`` and ``cancel_requested``; its pending approvals expire with
        ``decision_reason = "run cancelled"``. Its unfinished descendants (child runs,
        their children) are cancelled the same way in the same transaction, and a
        parent waiting for it is queued when it was its last unfinished child."""
        now = time.time()

        async def write(conn: AsyncConnection) -> sa.Row[Any]:
            locked = run_by_id(run_id).with_for_update()
            row: sa.Row[Any] | None = (await conn.execute(locked)).first()
            if row is None:
                raise NotFoundError(f"run {run_id!r} not found")
            # A finished run's descendants are still cancelled: a parent that ended
            # cancelled may have started a child after an earlier cascade looked.
            cancelled = row if RunState(row.state).finished else await _cancel_one(conn, row, now)
            level = [run_id]
            while level:  # the descendants, one generation at a time
                found = (await conn.execute(children_of(level).with_for_update())).all()
                unfinished = [r for r in found if not RunState(r.state).finished]
                for child in unfinished:
                    await _cancel_one(conn, child, now)
                level = [r.id for r in found]
            if (
                cancelled.state == RunState.CANCELLED.value
                and not RunState(row.state).finished
                and row.parent_run_id is not None
            ):
                await conn.execute(parent_of_child(row.parent_run_id))
                await conn.execute(requeue_parent(row.parent_run_id, now))
            return cancelled

        return RUNS.record(await self._write(f"cancel run {run_id}", write))

    async def queue_overdue_runs(self, now: float | None = None) -> list[tuple[str, int]]:
        """See :meth:`Store.queue_overdue_runs`: one ``UPDATE``, whose row locks (PostgreSQL;
        SQLite's write lock) let one of two racing workers queue each run."""
        overdue = queue_overdue(time.time() if now is None else now)

        async def write(conn: AsyncConnection) -> list[tuple[str, int]]:
            return [(row.id, row.fencing_token) for row in (await conn.execute(overdue)).all()]

        return await self._write("queue overdue runs", write)

    async def list_children(
        self, run_id: str, *, ids: Sequence[str] | None = None
    ) -> list[RunRecord]:
        query = children_of([run_id])
        if ids is not None:
            query = query.where(runs.c.id.in_(list(ids)))
        rows = await self._read(f"list the children of run {run_id}", fetch_all(query))
        return [RUNS.record(row) for row in rows]

    async def prune_runs(
        self,
        *,
        finished_before: float | None = None,
        keep_last: int | None = None,
        namespace: str | None = None,
        dry_run: bool = False,
    ) -> int:
        finished: sa.ColumnElement[bool] = runs.c.state.in_(
            [s.value for s in RunState if s.finished]
        )
        # A finished child stays while its parent is unfinished: the parent reads its outcome.
        parent = runs.alias("parent")
        parent_waits = sa.exists().where(
            parent.c.id == runs.c.parent_run_id,
            parent.c.state.in_([s.value for s in RunState if not s.finished]),
        )
        finished = sa.and_(finished, ~parent_waits)
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
        if dry_run:
            count = sa.select(sa.func.count()).select_from(runs).where(scope, sa.or_(*doomed))
            row = await self._read("count prunable runs", fetch_first(count))
            return int(row[0]) if row is not None else 0
        # events and approvals go with their run (ON DELETE CASCADE)
        delete = runs.delete().where(scope, sa.or_(*doomed))

        async def write(conn: AsyncConnection) -> int:
            return int((await conn.execute(delete)).rowcount)

        return await self._write("prune runs", write)


async def _cancel_one(conn: AsyncConnection, row: sa.Row[Any], now: float) -> sa.Row[Any]:
    """Cancel one unfinished run (see :meth:`Store.request_cancel`): a running one is asked
    to stop (its worker saves it cancelled), any other is cancelled now, its pending
    approvals expired. Returns its row as it is now."""
    run_id = row.id
    if RunState(row.state) is RunState.RUNNING:
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
    updated: sa.Row[Any] = (
        await conn.execute(
            runs.update().where(runs.c.id == run_id).values(**values).returning(*runs.c)
        )
    ).one()
    return updated
