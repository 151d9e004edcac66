"""Sessions in the SQL store: open, read, list and delete them; append, read and compact
their messages.

A session is keyed by namespace and id. Its messages are numbered by ``seq``
and ordered by ``position`` (a summary sits before the messages it left
visible); compacting hides messages, it never deletes them.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.messages import Message
from corral.core.sessions import Session, SessionMessage
from corral.store.schema import session_messages, sessions
from corral.store.sql import keyset
from corral.store.sql.engine import SqlEngine, fetch_all, fetch_first
from corral.store.sql.rows import SESSION_MESSAGES, SESSIONS
from corral.store.sql.rules import check_session_agent, session_not_found
from corral.store.sql.statements import (
    in_session,
    last_seq,
    messages_of_session,
    open_session,
    session_in_use,
    session_key,
    touch_session,
    unfinished_run_of_session,
)


class SqlSessions(SqlEngine):
    """The session operations of :class:`~corral.store.sql.SqlStore`."""

    async def get_or_create_session(self, namespace: str, session_id: str, agent: str) -> Session:
        action = f"open session {session_id}"
        row = await self._read(
            action, fetch_first(sa.select(sessions).where(session_key(namespace, session_id)))
        )
        if row is None:
            now = time.time()

            async def write(conn: AsyncConnection) -> sa.Row[Any]:
                return await open_session(conn, self._dialect, namespace, session_id, agent, now)

            row = await self._write(action, write)
        else:
            check_session_agent(session_id, row.agent, agent)
        return SESSIONS.record(row)

    async def get_session(self, namespace: str, session_id: str) -> Session | None:
        query = sa.select(sessions).where(session_key(namespace, session_id))
        row = await self._read(f"read session {session_id}", fetch_first(query))
        return SESSIONS.record(row) if row is not None else None

    async def list_sessions(
        self,
        namespace: str,
        agent: str | None = None,
        *,
        limit: int | None = None,
        after: tuple[float, str] | None = None,
    ) -> list[Session]:
        query = sa.select(sessions).where(sessions.c.namespace == namespace)
        if agent is not None:
            query = query.where(sessions.c.agent == agent)
        order = (sessions.c.updated_at, sessions.c.id)
        query = keyset.page(query, order, limit=limit, position=after, descending=True)
        rows = await self._read("list sessions", fetch_all(query))
        return [SESSIONS.record(row) for row in rows]

    async def delete_session(self, namespace: str, session_id: str) -> None:
        """See :meth:`Store.delete_session`: the check for unfinished runs and the delete
        are one transaction."""
        delete = sessions.delete().where(session_key(namespace, session_id))
        unfinished = unfinished_run_of_session(namespace, session_id)

        async def write(conn: AsyncConnection) -> None:
            # Deleting first locks the row (PostgreSQL): a submit holding it (open_session)
            # has committed its run by the time the check below reads the runs.
            if (await conn.execute(delete)).rowcount == 0:
                raise session_not_found(session_id)
            run = (await conn.execute(unfinished)).first()
            if run is not None:  # raising rolls the delete back
                raise session_in_use(session_id, run.id, run.state)

        await self._write(f"delete session {session_id}", write)

    async def session_messages(
        self, namespace: str, session_id: str, *, include_hidden: bool = False
    ) -> list[SessionMessage]:
        """See :meth:`Store.session_messages`: ordered by position (a summary sits before
        the messages it left visible); an unknown session has no messages."""
        query = messages_of_session(namespace, session_id, include_hidden=include_hidden)
        rows = await self._read(f"read session {session_id}", fetch_all(query))
        return [SESSION_MESSAGES.record(row) for row in rows]

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
                    **SESSION_MESSAGES.values(
                        stored,
                        namespace=namespace,
                        session_id=session_id,
                        position=(low + high) / 2,
                    )
                )
            )

        await self._write(f"compact session {session_id}", write)
