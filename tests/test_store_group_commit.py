"""Group commit of the SQLite store: concurrent writes share a transaction, each stays atomic."""

from __future__ import annotations

from pathlib import Path

import anyio

from corral.core.errors import ConflictError, LeaseLostError
from corral.core.events import Event, EventType
from corral.core.runs import Lease, RunRecord, RunState
from corral.resources.secrets import SecretCipher
from corral.store.sql import SqlStore
from corral.store.sqlite import SqliteStore


def task(run_id: str) -> RunRecord:
    return RunRecord(id=run_id, namespace="default", agent="a", input="hi", state=RunState.QUEUED)


async def test_a_failing_write_in_a_batch_leaves_the_others_committed(tmp_path: Path) -> None:
    store = await SqlStore.open(
        f"sqlite:///{tmp_path / 'c.db'}", cipher=SecretCipher(key=SecretCipher.generate_key())
    )
    try:
        assert isinstance(store, SqliteStore)
        for i in range(20):
            await store.submit_run(task(f"run_{i}"))
        claims = await store.claim_runs("w", 60.0, 20)
        stale = Lease(claims[0][1].run_id, "w", claims[0][1].token - 1, 0.0)
        outcomes: dict[str, str] = {}

        async def write(lease: Lease, name: str) -> None:
            try:
                await store.append_events([Event(lease.run_id, 1, EventType.RUN_START)], lease)
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
