"""Store operations only tests need: storing a run as it is, appending to a session directly.

Corral itself stores runs by submitting them and appends session messages with the
run that produced them (``save_run``); the store tests set up runs in any state and
exercise session appends on their own, through these.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.messages import Message
from corral.core.runs import Lease, RunRecord
from corral.core.sessions import SessionMessage
from corral.store import Store
from corral.store.sql import SqlStore
from corral.store.sql.statements import append_to_session, check_fence


async def create_run(store: Store, record: RunRecord) -> None:
    """Store ``record`` as it is, in whatever state; ``ConflictError`` when its id exists."""
    _, created = await store.submit_run(record)
    assert created, f"run {record.id} has the idempotency key of a stored run"


async def append_session_messages(
    store: Store,
    namespace: str,
    session_id: str,
    messages: Sequence[Message],
    run_id: str | None = None,
    lease: Lease | None = None,
) -> list[SessionMessage]:
    """Append ``messages`` to a session in one transaction of ``store``, with the statements
    ``save_run`` uses (fenced by ``lease`` when given; ``run_id`` defaults to the lease's
    run). Seqs continue from the session's last one; ``NotFoundError`` when it is absent."""
    assert isinstance(store, SqlStore)
    if not messages:
        return []
    if run_id is None and lease is not None:
        run_id = lease.run_id
    now = time.time()

    async def write(conn: AsyncConnection) -> list[SessionMessage]:
        if lease is not None:
            await check_fence(conn, lease)
        return await append_to_session(conn, namespace, session_id, messages, run_id, now)

    return await store._write(f"append to session {session_id}", write)
