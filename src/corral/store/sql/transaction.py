"""One transaction of the SQL store, run again when its connection drops.

Every :class:`~corral.store.sql.SqlStore` operation is one call of
:func:`transact`: a body run in one transaction (a read-only one for reads).
This is the only place that retries.

- **Before COMMIT.** When the connection fails while the body runs (PostgreSQL
  restarted or failed over, a backend terminated, a connection reset by the
  network), nothing of the body was committed, so the whole body runs again on
  a fresh connection: a few attempts with a short, jittered backoff. Deadlocks
  and serialization failures, which PostgreSQL resolves by rolling one
  transaction back, are retried the same way. A disconnect invalidates the
  whole pool, so the next attempt does not pick another dead connection (this
  is also how a connection that died while idle is found: pinging each one
  before use would cost a round trip per operation).
- **During COMMIT.** When the connection drops after COMMIT was sent, the
  client cannot know whether the server committed: running the body again
  could store a batch of events or session messages twice, and giving up
  could fail a run whose write landed. So on PostgreSQL the body ends by
  reading its transaction id (``txid_current_if_assigned()``, ``NULL`` for a
  transaction that wrote nothing) and its backend pid. After such a drop a
  fresh connection first ends the old backend if it still holds that
  transaction (a COMMIT the server never received can then never land later),
  then asks ``txid_status()``: ``committed`` returns the body's result as if
  nothing happened, ``aborted`` runs the body again. Each operation thus
  happens exactly once. Only when the server stays unreachable for the whole
  check is the outcome reported as unknown (``StoreError``); the architecture
  document says why every fenced write is still safe then.

SQLite connections do not drop; there the same code runs without ever retrying.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from corral.store.base import StoreError
from corral.store.sql.database import db_errors

T = TypeVar("T")

ATTEMPTS = 5
"""How often one operation is tried when its connection keeps dropping (under a second of waits)."""

# SQLSTATEs after which the transaction is known to be rolled back: serialization
# failure, deadlock, and the server ending the session (terminated backend, crash,
# shutdown, still starting up). Class 08 (connection exceptions) is matched whole.
_ROLLED_BACK_STATES = frozenset({"40001", "40P01", "57P01", "57P02", "57P03"})

# How long to wait, in turn, for the verdict on a COMMIT whose connection dropped.
_VERDICT_DELAYS = (0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6)

_WHO_AM_I = sa.text("SELECT txid_current_if_assigned(), pg_backend_pid()")
# backend_xid is the 32-bit xid; txid values carry the epoch above it.
_END_OLD_BACKEND = sa.text(
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
    " WHERE pid = :pid AND backend_xid::text::bigint = :xid % 4294967296"
)
_STATUS = sa.text("SELECT txid_status(:xid)")


class CommitAborted(Exception):
    """The COMMIT of a dropped connection turned out rolled back: run the body again."""


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection failed (or the server rolled back) before COMMIT."""
    if isinstance(exc, CommitAborted):
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        state = getattr(exc.orig, "sqlstate", None)
        if isinstance(state, str) and (state in _ROLLED_BACK_STATES or state.startswith("08")):
            return True
        return _broken_pipe(exc.orig)
    return isinstance(exc, ConnectionError)


def _broken_pipe(exc: BaseException | None) -> bool:
    """A socket error somewhere in the chain of a driver exception."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, ConnectionError):
            return True
        # asyncpg's "the connection was closed in the middle of operation" carries no errno.
        if type(exc).__name__ in ("ConnectionDoesNotExistError", "ConnectionFailureError"):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


async def transact(
    engine: AsyncEngine,
    action: str,
    body: Callable[[AsyncConnection], Awaitable[T]],
    *,
    write: bool,
) -> T:
    """Run ``body`` in one transaction on ``engine``; errors converted, dropped connections retried.

    ``write`` commits the transaction (and on SQLite begins it with
    ``BEGIN IMMEDIATE``, through the engine's execution options); a read is
    rolled back, or on PostgreSQL runs without ``BEGIN`` at all (autocommit: at
    ``READ COMMITTED`` each statement of a transaction takes a snapshot of its
    own anyway, so this only saves two round trips). ``action`` names the
    operation in error messages.
    """
    with db_errors(action):
        try:
            try:  # the first attempt outside tenacity: almost every operation needs one only
                return await _attempt(engine, action, body, write)
            except Exception as exc:
                if not connection_lost(exc):
                    raise
            retrying = AsyncRetrying(
                retry=retry_if_exception(connection_lost),
                stop=stop_after_attempt(ATTEMPTS - 1),
                wait=wait_exponential(multiplier=0.05, max=0.5) + wait_random(0, 0.05),
                reraise=True,
            )
            return await retrying(_attempt, engine, action, body, write)
        except CommitAborted as exc:  # every attempt's COMMIT was lost and rolled back
            raise StoreError(f"cannot {action}: the database kept dropping the connection") from exc


async def _attempt(
    engine: AsyncEngine, action: str, body: Callable[[AsyncConnection], Awaitable[T]], write: bool
) -> T:
    async with engine.connect() as conn:
        postgresql = conn.dialect.name == "postgresql"
        if not write:
            if postgresql:
                await conn.execution_options(isolation_level="AUTOCOMMIT")
            return await body(conn)  # SQLite: the implicit transaction is rolled back on close
        done = False
        xid: int | None = None
        pid: int | None = None
        try:
            async with conn.begin():
                result = await body(conn)
                if postgresql:
                    row = (await conn.execute(_WHO_AM_I)).one()
                    xid, pid = row[0], row[1]
                done = True
        except sa_exc.DBAPIError as exc:
            if not (done and postgresql and connection_lost(exc)):
                raise
            lost = exc  # the body finished, so the failure came from COMMIT itself
        else:
            return result
    if xid is None:
        return result  # the transaction wrote nothing: there is nothing to lose
    status = await _verdict(engine, xid, pid)
    if status == "committed":
        return result
    if status == "aborted":
        raise CommitAborted(f"the COMMIT of {action} was lost and rolled back") from lost
    raise StoreError(
        f"cannot {action}: the connection dropped during COMMIT and the database stayed "
        f"unreachable, so whether it was stored is unknown ({lost.orig})"
    ) from lost


async def _verdict(engine: AsyncEngine, xid: int, pid: int | None) -> str | None:
    """``committed`` or ``aborted`` for transaction ``xid``; ``None`` if it cannot be learnt.

    A backend still holding the transaction (the network dropped, the server
    has not noticed yet) is ended first: a COMMIT it never received then
    cannot land later, and one it did receive finishes before it exits.
    """
    for delay in _VERDICT_DELAYS:
        await anyio.sleep(delay)
        try:
            async with engine.connect() as conn:
                if pid is not None:
                    await conn.execute(_END_OLD_BACKEND, {"pid": pid, "xid": xid})
                status = (await conn.execute(_STATUS, {"xid": xid})).scalar()
        except sa_exc.DBAPIError as exc:
            if connection_lost(exc):
                continue
            raise
        if status in ("committed", "aborted"):
            return str(status)
        # "in progress": the old backend is still on its way out.
    return None
