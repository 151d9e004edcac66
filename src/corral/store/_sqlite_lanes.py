"""Threads that own raw ``sqlite3`` connections: one writer that group-commits, one reader.

An operation is one synchronous function of a connection, run whole in the lane's
thread: one hand-off per operation instead of one per statement, and no statement
building on the event loop. The writer takes every operation queued while it was
busy and runs them in one ``BEGIN IMMEDIATE`` transaction, each inside its own
savepoint, then commits once (``synchronous=FULL``): concurrent writers share an
fsync. An operation that raises is rolled back to its savepoint alone; the others
commit. Every caller is answered only after the ``COMMIT`` returned, so what it
wrote is durable when its ``await`` returns - and if the commit fails, every
operation of the batch fails and nothing of it is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from corral.store.base import StoreError

T = TypeVar("T")
Operation = Callable[[sqlite3.Connection], T]

#: At most this many operations share one transaction (bounds the time a batch holds the lock).
MAX_BATCH = 512


@dataclass
class _Job(Generic[T]):
    operation: Operation[T]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[T]
    result: Any = None
    error: BaseException | None = field(default=None)


def connect(path: str, busy_timeout_seconds: float) -> sqlite3.Connection:
    """A connection set up like the store's others: WAL, ``synchronous=FULL``, foreign keys."""
    conn = sqlite3.connect(
        path, timeout=busy_timeout_seconds, isolation_level=None, check_same_thread=False
    )
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_seconds * 1000)}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


class Lane:
    """A thread running operations on its own connection; ``transactional`` makes it the writer."""

    def __init__(self, conn: sqlite3.Connection, name: str, *, transactional: bool) -> None:
        self._conn = conn
        self._transactional = transactional
        self._closed = False
        self._queue: queue.SimpleQueue[_Job[Any] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def run(self, operation: Operation[T]) -> asyncio.Future[T]:
        """Queue ``operation``; await the future for its result (or its exception).

        Once queued, an operation runs (and commits) even if its caller is cancelled
        while waiting - as with any driver, the caller then does not learn the outcome.
        (A future rather than a coroutine: one frame less on every operation's way.)
        """
        if self._closed:
            raise StoreError("the store is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put(_Job(operation, loop, future))
        return future

    def close(self) -> None:
        """Finish the queued operations, stop the thread and close the connection."""
        self._closed = True
        self._queue.put(None)
        self._thread.join()
        self._conn.close()

    # ----------------------------------------------------------------- the thread

    def _serve(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            batch = [job]
            stop = False
            while len(batch) < MAX_BATCH:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                batch.append(more)
            if self._transactional:
                self._commit(batch)
            else:
                for one in batch:
                    self._call(one)
            # One wake-up per event loop for the whole batch, not one per operation: each
            # call_soon_threadsafe writes to the loop's self-pipe, and the loop reads it.
            by_loop: dict[asyncio.AbstractEventLoop, list[_Job[Any]]] = {}
            for one in batch:
                by_loop.setdefault(one.loop, []).append(one)
            for loop, jobs in by_loop.items():
                # RuntimeError: the caller's event loop is closed, nobody waits
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_settle, jobs)
            if stop:
                return

    def _call(self, job: _Job[Any]) -> bool:
        try:
            job.result = job.operation(self._conn)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, re-raised there
            job.error = exc
            return False
        return True

    def _commit(self, batch: list[_Job[Any]]) -> None:
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            for job in batch:
                job.error = exc
            return
        try:
            if len(batch) == 1:  # alone in its transaction: no savepoint needed to undo it
                conn.execute("COMMIT" if self._call(batch[0]) else "ROLLBACK")
                return
            for job in batch:
                conn.execute("SAVEPOINT op")
                if self._call(job):
                    conn.execute("RELEASE op")
                else:
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for job in batch:
                job.result, job.error = None, exc


def _settle(jobs: list[_Job[Any]]) -> None:
    for job in jobs:
        if job.future.done():  # its caller was cancelled
            continue
        if job.error is not None:
            job.future.set_exception(job.error)
        else:
            job.future.set_result(job.result)
