"""Child runs in their parent's worker (:mod:`corral.runtime.delegation`): a child
claimed as it is submitted starts in a free slot of the worker; a parent whose children
all run there waits for them in its slot instead of parking when they end soon; a
parent that parked is claimed by its last child's final save. Each path is counted by
the worker (``executed``: executions; ``taken``: runs claimed by its own runs).

Every test runs on the embedded SQLite store and on PostgreSQL + NATS (:mod:`backends`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from backends import SQLITE, Backend, backend_fixture, deployment_fixture
from corral.bus.local import LocalBus
from corral.core.events import EventType
from corral.core.runs import RunState
from corral.core.settings import Settings
from corral.runtime import delegation
from corral.runtime.operations import submit
from corral.runtime.worker import Worker
from corral.store import open_store
from nats_servers import nats_prefix_fixture, nats_server_url_fixture
from systems_helpers import agent, apply, call, get, model, tool_results

__all__ = [
    "backend_fixture",
    "deployment_fixture",
    "nats_prefix_fixture",
    "nats_server_url_fixture",
]

TESTS = Path(__file__).parent


def nap_tool() -> str:
    return json.dumps(
        {
            "apiVersion": "corral/v1",
            "kind": "Tool",
            "metadata": {"name": "nap"},
            "spec": {
                "type": "python",
                "python": {"function": "agent_tools:nap", "path": str(TESTS)},
                "idempotent": True,
            },
        }
    )


async def boss_and_helper(backend: Backend, *helper_turns: dict[str, Any]) -> None:
    await apply(
        backend.store,
        nap_tool(),
        model("boss-model", call("agents_exec", agent="helper", input="help"), {"text": "done"}),
        model("helper-model", *helper_turns),
        agent("helper", "helper-model", tools=["nap"]),
        agent("boss", "boss-model", links=["helper"]),
    )


async def check_answered(backend: Backend, run_id: str, answer: str) -> None:
    parent = await backend.store.get_run(run_id)
    assert parent is not None and (parent.state, parent.output) == (RunState.SUCCEEDED, "done")
    (child,) = await backend.store.list_children(run_id)
    assert (child.state, child.output) == (RunState.SUCCEEDED, answer)
    events = await backend.store.list_events(run_id)
    kinds = [e.type for e in events]
    assert kinds.count(EventType.CHILD_START) == kinds.count(EventType.CHILD_FINISH) == 1
    assert kinds.count(EventType.RUN_START) == kinds.count(EventType.RUN_FINISH) == 1
    assert [r["output"] for r in tool_results(events)] == [answer]


async def test_a_child_that_ends_at_once_spares_its_parent_the_park(backend: Backend) -> None:
    await boss_and_helper(backend, {"text": "helped"})
    run, _ = await backend.submit("boss", "go")
    worker = await backend.drain()
    await check_answered(backend, run.id, "helped")
    # the parent once, the child once (claimed with its submit): no park, no second claim
    assert (worker.executed, worker.taken) == (2, 1)


class RecordingBus(LocalBus):
    """The in-process bus, keeping the mark of every announcement of runnable runs."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: list[str | None] = []

    async def announce_runnable(self, run_ids: Sequence[str], *, mark: str | None = None) -> None:
        self.marks.append(mark)
        await super().announce_runnable(run_ids, mark=mark)


async def test_a_child_whose_parent_waits_in_its_slot_wakes_nobody(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'corral.db'}"
    store = await open_store(url)
    try:
        await apply(
            store,
            model("boss-model", call("agents_exec", agent="helper", input="help"), {"text": "ok"}),
            model("helper-model", {"text": "helped"}),
            agent("helper", "helper-model"),
            agent("boss", "boss-model", links=["helper"]),
        )
        bus = RecordingBus()
        worker = Worker(
            store, Settings(home=tmp_path, db_url=url, secret_key=None), bus=bus, concurrency=4
        )
        run, _ = await submit(store, "boss", "go", bus=bus)
        await worker.serve(anyio.Event(), until_idle=True)
        assert (await get(store, run)).state is RunState.SUCCEEDED
        # the submit only: the child's save queued no parent (it waited in its slot), so
        # announcing one would only have cost the worker an empty claim
        assert bus.marks == ["submitted"]
        assert (worker.executed, worker.taken) == (2, 1)
    finally:
        await store.close()


async def test_a_parent_parks_when_its_child_outlasts_the_wait_and_its_child_wakes_it(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(delegation, "CHILD_WAIT_SECONDS", 0.05)
    # the executor imported the constant: patch where it is read
    monkeypatch.setattr("corral.runtime.executor.CHILD_WAIT_SECONDS", 0.05)
    await boss_and_helper(backend, call("nap", seconds=0.5), {"text": "helped after a nap"})
    run, _ = await backend.submit("boss", "go")
    worker = await backend.drain()
    await check_answered(backend, run.id, "helped after a nap")
    # parent, child, parent again: the child (at its submit) and the parent (by the
    # child's final save) were claimed by runs of the worker
    assert (worker.executed, worker.taken) == (3, 2)
    record = await get(backend.store, run)
    assert record.fencing_token == 2  # claimed twice, the second time by its child's save


async def test_without_a_free_slot_the_child_is_queued_and_still_wakes_its_parent(
    backend: Backend,
) -> None:
    if backend.serving_worker is not None:  # postgres+nats: one worker, with its own slots
        backend.serving_worker.concurrency = 1
    else:
        backend.options["concurrency"] = 1
    await boss_and_helper(backend, {"text": "helped"})
    run, _ = await backend.submit("boss", "go")
    worker = await backend.drain()
    await check_answered(backend, run.id, "helped")
    # no slot for the child at its submit: queued, claimed when the parent parked; the
    # child's final save claimed the parent
    assert (worker.executed, worker.taken) == (3, 1)


async def test_a_child_that_ended_before_its_parent_asked_still_spares_the_park(
    backend: Backend,
) -> None:
    # the child ends while its parent's other call of the step (a nap) still runs: the
    # parent asks for it only then, and must find it ended rather than park for it
    both = {
        "tool_calls": [
            {"name": "agents_exec", "arguments": {"agent": "helper", "input": "help"}},
            {"name": "nap", "arguments": {"seconds": 0.3}},
        ]
    }
    await apply(
        backend.store,
        nap_tool(),
        model("boss-model", both, {"text": "done"}),
        model("helper-model", {"text": "helped"}),
        agent("helper", "helper-model"),
        agent("boss", "boss-model", links=["helper"], tools=["nap"]),
    )
    run, _ = await backend.submit("boss", "go")
    worker = await backend.drain()
    parent = await get(backend.store, run)
    assert (parent.state, parent.output) == (RunState.SUCCEEDED, "done")
    outputs = sorted(
        str(r["output"]) for r in tool_results(await backend.store.list_events(run.id))
    )
    assert outputs == ["helped", "slept 0.3 s"]
    # the parent once, the child once: no park, no second execution of the parent
    assert (worker.executed, worker.taken) == (2, 1)
    assert parent.fencing_token == 1


async def test_a_child_in_the_last_free_slot_is_not_joined_by_a_run_from_the_bus(
    backend: Backend,
) -> None:
    # The child takes the last free slot while the worker waits for deliveries (for that
    # slot): a run delivered then must wait for a slot, not make three runs in two slots.
    both = {
        "tool_calls": [
            {"name": "agents_exec", "arguments": {"agent": "helper", "input": "help"}},
            {"name": "nap", "arguments": {"seconds": 1.0}},
        ]
    }
    await apply(
        backend.store,
        nap_tool(),
        model("boss-model", both, {"text": "done"}),
        model("helper-model", call("nap", seconds=1.0), {"text": "helped"}),
        model("other-model", {"text": "other"}),
        agent("helper", "helper-model", tools=["nap"]),
        agent("boss", "boss-model", links=["helper"], tools=["nap"]),
        agent("other", "other-model"),
    )
    if backend.serving_worker is not None:
        backend.serving_worker.concurrency = 2
    else:
        backend.options["concurrency"] = 2
    async with backend.serving() as worker:
        run, _ = await backend.submit("boss", "go")
        with anyio.fail_after(10):
            while len(worker.active) < 2:  # the parent and its child
                await anyio.sleep(0.01)
        other, _ = await backend.submit("other", "go")
        most = 0
        with anyio.fail_after(20):
            while (await get(backend.store, other)).state is not RunState.SUCCEEDED:
                most = max(most, len(worker.active))
                await anyio.sleep(0.005)
        assert most <= 2, f"{most} runs at once in a worker of 2 slots"
    await backend.drain()
    assert (await get(backend.store, run)).output == "done"


async def test_a_parent_whose_children_end_partly_within_the_wait_parks_for_the_others(
    backend: Backend,
) -> None:
    # one child ends within the wait, the other naps past it: the parent records the
    # first and parks for the second, which is not "gone"
    both = {
        "tool_calls": [
            {"name": "agents_exec", "arguments": {"agent": "quick", "input": "help"}},
            {"name": "agents_exec", "arguments": {"agent": "slow", "input": "help"}},
        ]
    }
    await apply(
        backend.store,
        nap_tool(),
        model("boss-model", both, {"text": "done"}),
        model("quick-model", {"text": "quick answer"}),
        model("slow-model", call("nap", seconds=1.0), {"text": "slow answer"}),
        agent("quick", "quick-model"),
        agent("slow", "slow-model", tools=["nap"]),
        agent("boss", "boss-model", links=["quick", "slow"]),
    )
    run, _ = await backend.submit("boss", "go")
    await backend.drain()
    parent = await get(backend.store, run)
    assert (parent.state, parent.output) == (RunState.SUCCEEDED, "done")
    results = tool_results(await backend.store.list_events(run.id))
    assert [(r.get("output"), r.get("error")) for r in results] == [
        ("quick answer", None),
        ("slow answer", None),
    ]


@pytest.mark.parametrize("deployment", [SQLITE], indirect=True)  # (the worker's own stop)
async def test_a_stopping_worker_hands_a_chain_of_woken_parents_to_the_queue(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # boss -> mid -> leaf, both parents parked (the leaf naps past the wait). The worker
    # is stopped while the leaf naps: the leaf's save (its execution began before the
    # stop) still claims mid into its slot, but mid's save, begun while stopping, leaves
    # boss queued for another worker instead of stretching the drain by one more run.
    monkeypatch.setattr("corral.runtime.executor.CHILD_WAIT_SECONDS", 0.05)
    await apply(
        backend.store,
        nap_tool(),
        model("boss-model", call("agents_exec", agent="mid", input="go on"), {"text": "done"}),
        model("mid-model", call("agents_exec", agent="leaf", input="go on"), {"text": "mid"}),
        model("leaf-model", call("nap", seconds=0.6), {"text": "leaf"}),
        agent("leaf", "leaf-model", tools=["nap"]),
        agent("mid", "mid-model", links=["leaf"]),
        agent("boss", "boss-model", links=["mid"]),
    )
    run, _ = await backend.submit("boss", "go")
    worker = backend.new_worker(poll_seconds=0.05)
    stop = anyio.Event()
    async with anyio.create_task_group() as group:
        group.start_soon(worker.serve, stop)
        with anyio.fail_after(10):
            while (await get(backend.store, run)).state is not RunState.WAITING_CHILDREN:
                await anyio.sleep(0.02)
            (mid,) = await backend.store.list_children(run.id)
            while (await get(backend.store, mid)).state is not RunState.WAITING_CHILDREN:
                await anyio.sleep(0.02)
        stop.set()
    assert (await get(backend.store, mid)).state is RunState.SUCCEEDED
    boss = await get(backend.store, run)
    assert (boss.state, boss.lease_owner) == (RunState.QUEUED, None)
    assert worker.taken == 3  # mid and leaf at their submits, mid again by leaf's save
