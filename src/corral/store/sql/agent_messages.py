"""Agent messages in the SQL store: the hops of system runs (:mod:`corral.core.agent_messages`).

A message is inserted or ignored by id (a coordinator that runs again sends the same
ids) and only ever moved forward (:data:`FORWARD`), so a repeated or late mark - two
deliveries of one message, a coordinator replaying its pass - changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.agent_messages import AgentMessage, MessageState
from corral.core.errors import NotFoundError
from corral.store.schema import agent_messages, runs
from corral.store.sql import keyset
from corral.store.sql.engine import SqlEngine, fetch_all, fetch_first
from corral.store.sql.rows import AGENT_MESSAGES
from corral.store.sql.statements import insert_or_skip

_PENDING, _DELIVERED = MessageState.PENDING, MessageState.DELIVERED
#: the states a message may be moved to ``state`` from
FORWARD: dict[MessageState, tuple[MessageState, ...]] = {
    MessageState.DELIVERED: (_PENDING,),
    MessageState.DONE: (_PENDING, _DELIVERED),
    MessageState.FAILED: (_PENDING, _DELIVERED),
    MessageState.DEAD_LETTER: (_PENDING, _DELIVERED),
}


class SqlAgentMessages(SqlEngine):
    """The agent message operations of :class:`~corral.store.sql.SqlStore`."""

    async def add_agent_messages(self, messages: Sequence[AgentMessage]) -> list[bool]:
        if not messages:
            return []
        statement = insert_or_skip(self._dialect, agent_messages, ("id",)).returning(
            agent_messages.c.id
        )
        run_ids = sorted({m.system_run_id for m in messages})

        async def write(conn: AsyncConnection) -> list[bool]:
            found = (await conn.execute(sa.select(runs.c.id).where(runs.c.id.in_(run_ids)))).all()
            missing = set(run_ids) - {row.id for row in found}
            if missing:
                raise NotFoundError(f"system run {sorted(missing)[0]!r} not found")
            created: list[bool] = []
            for message in messages:
                row = (await conn.execute(statement, AGENT_MESSAGES.values(message))).first()
                created.append(row is not None)
            return created

        return await self._write("store agent messages", write)

    async def get_agent_message(self, message_id: str) -> AgentMessage | None:
        query = sa.select(agent_messages).where(agent_messages.c.id == message_id)
        row = await self._read(f"read agent message {message_id}", fetch_first(query))
        return AGENT_MESSAGES.record(row) if row is not None else None

    async def list_agent_messages(
        self,
        system_run_id: str,
        *,
        limit: int | None = None,
        after: tuple[float, str] | None = None,
        states: Sequence[MessageState] | None = None,
    ) -> list[AgentMessage]:
        query = sa.select(agent_messages).where(agent_messages.c.system_run_id == system_run_id)
        if states is not None:
            query = query.where(agent_messages.c.state.in_([s.value for s in states]))
        query = keyset.page(
            query,
            (agent_messages.c.created_at, agent_messages.c.id),
            limit=limit,
            position=after,
        )
        rows = await self._read(f"list the messages of run {system_run_id}", fetch_all(query))
        return [AGENT_MESSAGES.record(row) for row in rows]

    async def mark_agent_message(
        self,
        message_id: str,
        state: MessageState,
        *,
        child_run_id: str | None = None,
        error: dict[str, Any] | None = None,
        attempt: int | None = None,
        now: float | None = None,
    ) -> AgentMessage | None:
        now = time.time() if now is None else now
        values: dict[str, Any] = {"state": state.value}
        if state is MessageState.DELIVERED:
            values["delivered_at"] = now
        else:
            values["finished_at"] = now
        if child_run_id is not None:
            values["child_run_id"] = child_run_id
        if error is not None:
            values["error"] = error
        if attempt is not None:
            values["attempt"] = attempt
        statement = (
            agent_messages.update()
            .where(
                agent_messages.c.id == message_id,
                agent_messages.c.state.in_([s.value for s in FORWARD.get(state, ())]),
            )
            .values(**values)
            .returning(*agent_messages.c)
        )

        async def write(conn: AsyncConnection) -> AgentMessage | None:
            row = (await conn.execute(statement)).first()
            return AGENT_MESSAGES.record(row) if row is not None else None

        return await self._write(f"mark agent message {message_id} {state.value}", write)
