"""Group commit of the SQLite store: concurrent writes share a transaction, each stays atomic."""

from __future__ import annotations

from pathlib import Path

import anyio

from corral.core.errors import ConflictError, LeaseLostError
from corral.core.events import Event, RunStartData
from corral.core.runs import Lease, RunRecord, RunState
from corral.core.settings import Settings
from corral.store import open_store
from corral.store.sql import SqlStore
from corral.store.sqlite import SqliteStore


def task(run_id: str) -> RunRecord:
    return RunRecord(id=run_id, namespace="default", agent="a", input="hi", state=RunState.QUEUED)


def settings(tmp_path: Path, environ: dict[str, str]) -> Settings:
    return Settings.from_env({"CORRAL_HOME": str(tmp_path), **environ})


async def test_a_sqlite_file_takes_the_fast_path_unless_the_settings_turn_it_off(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    async with await open_store(url, settings=settings(tmp_path, {})) as fast:
        assert isinstance(fast, SqliteStore)
    off = settings(tmp_path, {"CORRAL_SQLITE_FAST_PATH": "0"})
    assert not off.sqlite_fast_path
    async with await open_store(url, settings=off) as plain:
        assert type(plain) is SqlStore


async def test_a_failing_write_in_a_batch_leaves_the_others_committed(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'c.db'}", settings=settings(tmp_path, {}))
    try:
        assert isinstance(store, SqliteStore)
        for i in range(20):
            await store.submit_run(task(f"run_{i}"))
        claims = await store.claim_runs("w", 60.0, 20)
        stale = Lease(claims[0][1].run_id, "w", claims[0][1].token - 1, 0.0)
        outcomes: dict[str, str] = {}

        async def write(lease: Lease, name: str) -> None:
            try:
                await store.append_events(
                    [Event(lease.run_id, 1, RunStartData(agent="a", input="x"))], lease
                )
                outcomes[name] = "ok"
            except (LeaseLostError, ConflictError) as exc:
                outcomes[name] = type(exc).__name__

        async with anyio.create_task_group() as group:
            group.start_soon(write, stale, "stale")
            for _, lease in claims:
                group.start_soon(write, lease, lease.run_id)
        assert outcomes.pop("stale") == "LeaseLostError"
        assert set(outcomes.values()) == {"ok"}
        for _, lease in claims:
            assert [e.seq for e in await store.list_events(lease.run_id)] == [1]
    finally:
        await store.close()
