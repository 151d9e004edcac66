"""Per-agent concurrency: which queued runs a claim may take without exceeding an agent's limit.

An ``Agent`` with ``max_concurrent_runs: N`` never has more than N runs in
``running`` across all workers. The limit is read from the stored resource at
claim time (so changing it applies to runs already queued), and the running
runs are counted inside the claim's own write transaction:

- on SQLite, write transactions are serialized (``BEGIN IMMEDIATE``), so the
  count cannot change under the claim;
- on PostgreSQL, claims that involve limited agents take one transaction-level
  advisory lock first, so two claimers cannot both see room for the last slot.
  Claims in deployments without limited agents never take it.

A run whose lease expired is still ``running`` and still counts: re-claiming it
takes no new slot. Agents at their limit are left out of the queued walk, so
their backlog never hides other agents' runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.runs import RunState
from corral.store.schema import runs
from corral.store.sql.statements import LIMITED_AGENTS

#: Key of the PostgreSQL advisory lock that serializes claims of limited agents.
ADVISORY_LOCK_KEY = 0x636F7272616C  # "corral"

AgentKey = tuple[str, str]


@dataclass
class Admission:
    """Room left per limited agent; agents without a limit are not in ``room``."""

    room: dict[AgentKey, int]

    @property
    def saturated(self) -> list[AgentKey]:
        return [key for key, left in self.room.items() if left <= 0]

    def exclude_saturated(self) -> sa.ColumnElement[bool]:
        """A condition on ``runs`` leaving out the runs of agents with no room."""
        full = [
            sa.and_(runs.c.namespace == namespace, runs.c.agent == agent)
            for namespace, agent in self.saturated
        ]
        return sa.not_(sa.or_(*full)) if full else sa.true()

    def admit(self, namespace: str, agent: str) -> bool:
        """Take a slot for one more queued run of the agent, if it has one."""
        key = (namespace, agent)
        if key not in self.room:
            return True
        if self.room[key] <= 0:
            return False
        self.room[key] -= 1
        return True


async def admission(conn: AsyncConnection) -> Admission | None:
    """The room of every limited agent, or ``None`` when no stored agent has a limit."""
    limited = (await conn.execute(LIMITED_AGENTS)).all()
    if not limited:
        return None
    if conn.dialect.name == "postgresql":
        await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(ADVISORY_LOCK_KEY)))
    limits = {(row[0], row[1]): int(row[2]) for row in limited}
    running = (
        await conn.execute(
            sa.select(runs.c.namespace, runs.c.agent, sa.func.count())
            .where(runs.c.state == RunState.RUNNING.value)
            .group_by(runs.c.namespace, runs.c.agent)
        )
    ).all()
    counts = {(row[0], row[1]): int(row[2]) for row in running}
    return Admission({key: cap - counts.get(key, 0) for key, cap in limits.items()})


def admitted(
    candidates: Sequence[Any], admission: Admission | None, limit: int, queued_state: str
) -> list[Any]:
    """The first ``limit`` candidates (sorted) that fit: re-claims always, queued runs if
    their agent has room. Candidates carry ``namespace``, ``agent`` and ``state``."""
    chosen: list[Any] = []
    for row in candidates:
        if len(chosen) == limit:
            break
        if (
            admission is None
            or row.state != queued_state
            or admission.admit(row.namespace, row.agent)
        ):
            chosen.append(row)
    return chosen
