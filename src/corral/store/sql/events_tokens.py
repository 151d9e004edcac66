"""Run events and API tokens in the SQL store.

Event appends of one run commit in the order they were called (see
:class:`~corral.store.sql.engine.RunTurns`); under a lease they are fenced like
every other write of the run's holder.
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
from corral.core.runs import Lease
from corral.core.tokens import ApiToken
from corral.store.schema import api_tokens, run_events
from corral.store.sql import keyset
from corral.store.sql.engine import SqlEngine, execute, fetch_all, fetch_first
from corral.store.sql.rows import EVENTS, TOKENS
from corral.store.sql.rules import check_events_under
from corral.store.sql.statements import check_fence, events_after, lock_runs


class SqlEventsTokens(SqlEngine):
    """The event and API token operations of :class:`~corral.store.sql.SqlStore`."""

    async def append_events(self, events: Sequence[Event], lease: Lease | None = None) -> None:
        """See :meth:`Store.append_events`; under a lease, events of another run are a
        ``ConflictError``."""
        if not events:
            return
        check_events_under(events, lease)
        rows = [EVENTS.values(e) for e in events]
        run_ids = sorted({e.run_id for e in events})

        async def write(conn: AsyncConnection) -> None:
            if lease is not None:
                await check_fence(conn, lease)
            else:
                await lock_runs(conn, run_ids)
            await conn.execute(run_events.insert(), rows)

        # One batch of a run at a time, in call order (see RunTurns); a batch of several
        # runs (never under a lease) is ordered by the row locks alone.
        turn = self._run_turns.turn(run_ids[0]) if len(run_ids) == 1 else nullcontext()
        async with turn:
            await self._write("append run events", write)

    async def list_events(
        self, run_id: str, after_seq: int = 0, limit: int | None = None
    ) -> list[Event]:
        query = events_after(run_id, after_seq).limit(limit)
        rows = await self._read("list run events", fetch_all(query))
        return [EVENTS.record(row) for row in rows]

    async def create_token(self, token: ApiToken) -> None:
        insert = api_tokens.insert().values(**TOKENS.values(token))
        await self._write(f"create token {token.id}", execute(insert))

    async def get_token(self, token_id: str) -> ApiToken | None:
        query = sa.select(api_tokens).where(api_tokens.c.id == token_id)
        row = await self._read(f"read token {token_id}", fetch_first(query))
        return TOKENS.record(row) if row is not None else None

    async def list_tokens(
        self,
        namespace: str | None = None,
        *,
        limit: int | None = None,
        after: tuple[float, str] | None = None,
    ) -> list[ApiToken]:
        query = sa.select(api_tokens)
        if namespace is not None:
            query = query.where(api_tokens.c.namespace == namespace)
        order = (api_tokens.c.created_at, api_tokens.c.id)
        query = keyset.page(query, order, limit=limit, position=after)
        rows = await self._read("list tokens", fetch_all(query))
        return [TOKENS.record(row) for row in rows]

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
        return TOKENS.record(row)

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
        await self._write(f"touch token {token_id}", execute(touch))
