"""The store on PostgreSQL only: row locks, dropped connections, concurrent opens.

Each test gets a fresh database on the test server (``databases.py``). Where a
test needs the store's transaction to stand still at a known point, another
session holds a lock it must wait for; where it needs a connection to die, it
is terminated with ``pg_terminate_backend`` or cut by a TCP proxy between
the store and the server.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import sqlalchemy as sa

from corral.core.errors import LeaseLostError
from corral.core.events import Event, RunFinishData, RunStartData, StepStartData
from corral.core.messages import Message
from corral.core.runs import RunState
from corral.resources.secrets import SecretCipher
from corral.store import Store, StoreError, open_store
from corral.store.schema import LATEST_REVISION
from corral.store.sql import SqlStore
from databases import PostgresServer, eventually, rows_of
from store_helpers import append_session_messages
from test_store import cipher_fixture  # noqa: F401 - fixtures
from test_store_durable import a_task, child_env, claim_one


@pytest.fixture(name="database")
def database_fixture(postgres: PostgresServer, request: pytest.FixtureRequest) -> str:
    """The name of a new migrated database, dropped after the test."""
    name = postgres.create(migrated=request.node.get_closest_marker("empty_database") is None)
    request.addfinalizer(lambda: postgres.drop(name))
    return name


@pytest.fixture(name="url")
def url_fixture(postgres: PostgresServer, database: str) -> str:
    return postgres.url(database)


@pytest.fixture(name="store")
async def store_fixture(url: str, cipher: SecretCipher) -> AsyncIterator[Store]:
    async with await SqlStore.open(url, cipher=cipher, pool_size=4) as opened:
        yield opened


@pytest.fixture(name="admin")
async def admin_fixture(url: str) -> AsyncIterator[asyncpg.Connection]:
    """A session of its own on the test's database, behind the store's back."""
    conn = await asyncpg.connect(url)
    try:
        yield conn
    finally:
        await conn.close()


async def store_backends(admin: asyncpg.Connection, *, waiting: bool = False) -> list[int]:
    """The pids of the store's sessions on this database (waiting for a lock, if asked)."""
    rows = await admin.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'corral' AND pid <> pg_backend_pid()"
        + (" AND wait_event_type = 'Lock'" if waiting else "")
    )
    return [row["pid"] for row in rows]


async def terminate(admin: asyncpg.Connection, pids: list[int]) -> None:
    for pid in pids:
        await admin.execute("SELECT pg_terminate_backend($1)", pid)


# --------------------------------------------------------------------------- claims


async def test_claims_from_many_pools_never_double_claim(url: str, cipher: SecretCipher) -> None:
    stores = [await SqlStore.open(url, cipher=cipher, pool_size=3) for _ in range(4)]
    try:
        total = 240
        for i in range(total):
            await stores[0].submit_run(a_task(f"run_{i:03}", priority=i % 4, created_at=float(i)))
        claimed: list[tuple[str, str]] = []

        async def claimer(store: Store, name: str) -> None:
            while batch := await store.claim_runs(name, 60.0, limit=3):
                claimed.extend((record.id, name) for record, _ in batch)

        await asyncio.gather(
            *(claimer(store, f"w{s}.{c}") for s, store in enumerate(stores) for c in range(3))
        )
        ids = [run_id for run_id, _ in claimed]
        assert len(ids) == len(set(ids)) == total
        owners = dict(
            await rows_of(url, "SELECT id, lease_owner FROM runs WHERE fencing_token = 1")
        )
        assert owners == dict(claimed)
    finally:
        for store in stores:
            await store.close()


async def test_a_claim_passes_over_a_locked_run_instead_of_waiting(
    store: Store, admin: asyncpg.Connection
) -> None:
    await store.submit_run(a_task("run_top", priority=9))
    await store.submit_run(a_task("run_next", priority=1))
    async with admin.transaction():
        await admin.execute("SELECT 1 FROM runs WHERE id = 'run_top' FOR UPDATE")
        started = time.monotonic()
        [(record, _)] = await asyncio.wait_for(store.claim_runs("w", 30.0), 5.0)
        assert record.id == "run_next"
        assert time.monotonic() - started < 2.0
    [(record, _)] = await store.claim_runs("w", 30.0)
    assert record.id == "run_top"


# --------------------------------------------------------------------------- fencing


async def test_fenced_writes_wait_for_a_claim_in_flight_then_are_refused(
    store: Store, admin: asyncpg.Connection
) -> None:
    await store.submit_run(a_task("run_1"))
    session = await store.get_or_create_session("default", "ses_1", "assistant")
    record, lease = await claim_one(store, "w1")
    tx = admin.transaction()
    await tx.start()
    # A claim that has bumped the token but not committed yet.
    await admin.execute(
        "UPDATE runs SET fencing_token = fencing_token + 1, lease_owner = 'w2' WHERE id = 'run_1'"
    )
    record.state = RunState.SUCCEEDED
    writes = [
        asyncio.ensure_future(w)
        for w in (
            store.append_events(
                [Event("run_1", 1, RunStartData(agent="a", input="x"))], lease=lease
            ),
            store.save_run(record, lease=lease),
            store.renew_lease(lease, 30.0),
            store.release_run(lease),
            append_session_messages(store, "default", session.id, [Message.user("x")], lease=lease),
        )
    ]
    await asyncio.sleep(0.5)
    assert not any(w.done() for w in writes)  # each waits on the run row
    await tx.commit()
    results = await asyncio.gather(*writes, return_exceptions=True)
    assert all(isinstance(r, LeaseLostError) for r in results), results
    assert await store.list_events("run_1") == []
    assert await store.session_messages("default", session.id) == []
    stored = await store.get_run("run_1")
    assert stored is not None
    assert (stored.state, stored.lease_owner, stored.fencing_token) == (RunState.RUNNING, "w2", 2)


async def test_a_fenced_write_in_flight_holds_off_a_reclaim(
    store: Store, url: str, cipher: SecretCipher, admin: asyncpg.Connection
) -> None:
    now = time.time()
    await store.submit_run(a_task("run_1"))
    _, old = await claim_one(store, "w1", now=now - 3600)  # long expired
    async with await SqlStore.open(url, cipher=cipher, pool_size=2) as other:
        tx = admin.transaction()
        await tx.start()
        await admin.execute("LOCK TABLE run_events IN EXCLUSIVE MODE")
        # The stale holder's append has locked the run row and waits to insert.
        append = asyncio.ensure_future(
            store.append_events([Event("run_1", 1, RunStartData(agent="a", input="x"))], lease=old)
        )
        await eventually(lambda: _has_waiter(admin))
        assert await other.claim_runs("w2", 30.0) == []  # passed over, not waited for
        await tx.commit()
        await append  # it held the lease when it wrote: it lands
        [(_, new)] = await other.claim_runs("w2", 30.0)
        assert new.token == old.token + 1
        with pytest.raises(LeaseLostError):
            await store.append_events([Event("run_1", 2, StepStartData(step=1))], lease=old)
        await other.append_events([Event("run_1", 2, StepStartData(step=1))], lease=new)
    assert [e.seq for e in await store.list_events("run_1")] == [1, 2]


async def _has_waiter(admin: asyncpg.Connection) -> bool:
    return bool(await store_backends(admin, waiting=True))


# --------------------------------------------------------------------------- dropped connections


async def test_terminated_connections_are_survived_between_operations(
    store: Store, admin: asyncpg.Connection
) -> None:
    await store.submit_run(a_task("run_1"))
    record, lease = await claim_one(store)
    for seq in range(1, 7):
        await terminate(admin, await store_backends(admin))
        await store.append_events([Event("run_1", seq, StepStartData(step=1))], lease=lease)
        await terminate(admin, await store_backends(admin))
        assert [e.seq for e in await store.list_events("run_1")] == list(range(1, seq + 1))
    record.state = RunState.SUCCEEDED
    await terminate(admin, await store_backends(admin))
    await store.save_run(record, lease=lease)
    stored = await store.get_run("run_1")
    assert stored is not None and stored.state is RunState.SUCCEEDED


async def test_a_connection_terminated_inside_a_transaction_is_retried_once_and_whole(
    store: Store, admin: asyncpg.Connection
) -> None:
    await store.submit_run(a_task("run_1"))
    session = await store.get_or_create_session("default", "ses_1", "assistant")
    record, lease = await claim_one(store)
    await store.append_events([Event("run_1", 1, RunStartData(agent="a", input="x"))], lease=lease)
    record.state, record.output, record.session_id = RunState.SUCCEEDED, "done", session.id
    for table, write in (
        (
            "run_events",
            store.append_events([Event("run_1", 2, RunFinishData(state="succeeded"))], lease),
        ),
        (
            "session_messages",
            store.save_run(record, lease, session_messages=[Message.assistant("done")]),
        ),
    ):
        tx = admin.transaction()
        await tx.start()
        await admin.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
        pending = asyncio.ensure_future(write)
        await eventually(lambda: _has_waiter(admin))
        await terminate(admin, await store_backends(admin, waiting=True))
        await asyncio.sleep(0.2)  # the retry waits on the same lock
        assert not pending.done()
        await tx.commit()
        await asyncio.wait_for(pending, 10.0)
    assert [e.seq for e in await store.list_events("run_1")] == [1, 2]
    assert [m.message.content for m in await store.session_messages("default", session.id)] == [
        "done"
    ]
    stored = await store.get_run("run_1")
    assert stored is not None and (stored.state, stored.output) == (RunState.SUCCEEDED, "done")


class CommitCutter:
    """A TCP proxy to PostgreSQL that, once armed, lets the next COMMIT through and then
    cuts that connection before its answer reaches the client: the transaction is
    committed, and the client cannot know it."""

    COMMIT = re.compile(rb"Q\x00\x00\x00.COMMIT", re.DOTALL)

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.armed = False
        self.cuts = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.target)
        cut = asyncio.Event()

        async def upstream() -> None:
            while data := await client_r.read(65536):
                if self.armed and self.COMMIT.search(data):
                    # Whatever the server says from now on answers this COMMIT.
                    self.armed = False
                    cut.set()
                server_w.write(data)
                await server_w.drain()
                if cut.is_set():
                    return

        async def downstream() -> None:
            while data := await server_r.read(65536):
                if cut.is_set():
                    break  # the server answered the COMMIT: drop the answer and the line
                client_w.write(data)
                await client_w.drain()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        self._tasks.update(tasks)
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if cut.is_set():
            await tasks[1]
            self.cuts += 1
        for task in tasks:
            task.cancel()
        client_w.transport.abort()
        server_w.transport.abort()


async def test_a_commit_whose_answer_is_lost_is_not_applied_twice(
    url: str, cipher: SecretCipher
) -> None:
    target = sa.make_url(url)
    cutter = CommitCutter(target.host or "127.0.0.1", target.port or 5432)
    port = await cutter.start()
    try:
        store = await SqlStore.open(target.set(port=port).render_as_string(False), cipher=cipher)
        try:
            await store.submit_run(a_task("run_1"))
            session = await store.get_or_create_session("default", "ses_1", "assistant")
            record, lease = await claim_one(store)

            cutter.armed = True
            await store.append_events(
                [Event("run_1", 1, RunStartData(agent="a", input="x"))], lease=lease
            )
            cutter.armed = True
            messages = [Message.user("hi"), Message.assistant("hello")]
            appended = await append_session_messages(
                store, "default", session.id, messages, lease=lease
            )
            cutter.armed = True
            record.state, record.session_id = RunState.SUCCEEDED, session.id
            await store.save_run(record, lease=lease, session_messages=[Message.user("bye")])
            assert cutter.cuts == 3
        finally:
            await store.close()
    finally:
        await cutter.close()
    async with await SqlStore.open(url, cipher=cipher) as direct:
        assert [e.seq for e in await direct.list_events("run_1")] == [1]
        assert [m.seq for m in appended] == [1, 2]
        stored = await direct.session_messages("default", "ses_1")
        assert [(m.seq, m.message.content) for m in stored] == [(1, "hi"), (2, "hello"), (3, "bye")]
        saved = await direct.get_run("run_1")
        assert saved is not None and saved.state is RunState.SUCCEEDED


async def test_a_commit_cut_off_before_it_lands_runs_again(
    store: Store, admin: asyncpg.Connection
) -> None:
    # A deferred trigger makes the first COMMIT of an event insert wait, so the backend
    # can be terminated in the middle of COMMIT: that transaction is rolled back.
    await admin.execute(
        """
        CREATE SEQUENCE commit_stalls;
        CREATE FUNCTION stall_first_commit() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF nextval('commit_stalls') = 1 THEN PERFORM pg_sleep(30); END IF;
            RETURN NULL;
        END $$;
        CREATE CONSTRAINT TRIGGER stall AFTER INSERT ON run_events
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION stall_first_commit();
        """
    )
    await store.submit_run(a_task("run_1"))
    _, lease = await claim_one(store)
    append = asyncio.ensure_future(
        store.append_events([Event("run_1", 1, RunStartData(agent="a", input="x"))], lease=lease)
    )

    async def stalled() -> bool:
        rows = await admin.fetch(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'corral'"
            " AND wait_event = 'PgSleep'"
        )
        return bool(rows)

    await eventually(stalled)
    await terminate(admin, await store_backends(admin))
    await asyncio.wait_for(append, 10.0)
    assert [e.seq for e in await store.list_events("run_1")] == [1]
    assert await admin.fetchval("SELECT last_value FROM commit_stalls") == 2


async def test_an_unreachable_server_is_a_store_error(cipher: SecretCipher) -> None:
    with pytest.raises(StoreError, match="cannot open the store"):
        await SqlStore.open("postgresql://postgres@127.0.0.1:1/corral", cipher=cipher)


# --------------------------------------------------------------------------- migrations


OPEN_CHILD = """\
import asyncio, sys
from corral.store import open_store

async def main(url):
    store = await open_store(url)
    await store.close()

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.empty_database
async def test_processes_opening_a_new_database_at_once_migrate_it_once(
    url: str, tmp_path: Path
) -> None:
    async def open_in_process() -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            OPEN_CHILD,
            url,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=child_env(tmp_path),
        )
        _, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()

    await asyncio.gather(*(open_in_process() for _ in range(3)))
    assert await rows_of(url, "SELECT version_num FROM alembic_version") == [(LATEST_REVISION,)]
    async with await open_store(url) as store:
        assert (await store.submit_run(a_task("run_1", key="k")))[1]


async def test_the_store_keeps_a_bounded_pool_of_named_sessions(
    store: Store, admin: asyncpg.Connection
) -> None:
    await asyncio.gather(*(store.list_runs("default") for _ in range(20)))
    assert 1 <= len(await store_backends(admin)) <= 8  # pool_size 4, as many again for bursts
