"""Retention: finished runs and their events can be pruned by age or count, on every store."""

from __future__ import annotations

import time

import pytest

from corral.cli.worker_cmd import parse_duration
from corral.core.events import Event, RunStartData
from corral.core.runs import RunRecord, RunState
from corral.store import Store
from store_helpers import create_run
from test_store import cipher_fixture, store_fixture, store_url_fixture  # noqa: F401 - fixtures


async def add_run(store: Store, run_id: str, state: RunState, finished_ago: float | None) -> None:
    now = time.time()
    record = RunRecord(id=run_id, namespace="default", agent="a", input="x", state=state)
    if finished_ago is not None:
        record.finished_at = now - finished_ago
    await create_run(store, record)
    await store.append_events([Event(run_id, 1, RunStartData(agent="a", input="x"))])


async def test_prune_by_age_keeps_unfinished_runs_and_drops_events(store: Store) -> None:
    await add_run(store, "old", RunState.SUCCEEDED, 3 * 86400)
    await add_run(store, "old-failed", RunState.FAILED, 2 * 86400)
    await add_run(store, "new", RunState.SUCCEEDED, 60)
    await add_run(store, "waiting", RunState.WAITING_APPROVAL, None)
    await add_run(store, "queued", RunState.QUEUED, None)

    pruned = await store.prune_runs(finished_before=time.time() - 86400)

    assert pruned == 2
    left = {r.id for r in await store.list_runs("default")}
    assert left == {"new", "waiting", "queued"}
    assert await store.list_events("old") == []
    assert len(await store.list_events("new")) == 1


async def test_prune_keeps_the_newest_n_per_namespace(store: Store) -> None:
    for i in range(5):
        await add_run(store, f"run{i}", RunState.SUCCEEDED, 100 - i)  # run4 is the newest
    await add_run(store, "running", RunState.RUNNING, None)
    assert await store.prune_runs(keep_last=2) == 3
    assert {r.id for r in await store.list_runs("default")} == {"run3", "run4", "running"}


async def test_a_dry_run_counts_what_would_go_and_deletes_nothing(store: Store) -> None:
    for i in range(3):
        await add_run(store, f"run{i}", RunState.SUCCEEDED, 100 - i)
    await add_run(store, "running", RunState.RUNNING, None)
    assert await store.prune_runs(keep_last=1, dry_run=True) == 2
    assert await store.prune_runs(finished_before=time.time(), dry_run=True) == 3
    assert len(await store.list_runs("default")) == 4
    assert len(await store.list_events("run0")) == 1
    assert await store.prune_runs(keep_last=1) == 2


def test_durations() -> None:
    assert [parse_duration(t) for t in ("90", "45s", "30m", "12h", "7d")] == [
        90,
        45,
        1800,
        43200,
        604800,
    ]
    with pytest.raises(ValueError):
        parse_duration("soon")
