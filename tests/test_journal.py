"""When the journal writes what (runtime/journal.py), checked against a real SQLite store.

The store is wrapped only to hold commits back (a gate), so the tests can see
which events the engine waited for and which it did not; the timer of a behind
write runs on a fake clock the tests advance.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio
import pytest

from corral.core.errors import LeaseLostError
from corral.core.events import Event, EventType, parse_event_data, payload_class
from corral.core.runs import Lease, RunRecord
from corral.runtime.journal import BEHIND_AFTER_SECONDS, FencedSink
from corral.store import Store, open_store
from fake_clock import FakeClock


class GatedStore:
    """Delegates to a real store; ``append_events`` waits for ``gate`` when it is closed."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.gate: anyio.Event | None = None
        self.started = 0
        self._another = anyio.Event()

    async def append_events(self, events: Sequence[Event], lease: Lease | None = None) -> None:
        self.started += 1
        self._another.set()
        if self.gate is not None:
            await self.gate.wait()
        await self.store.append_events(events, lease=lease)

    async def until_started(self, writes: int) -> None:
        """Until ``writes`` writes have started (held at the gate or not)."""
        with anyio.fail_after(5):
            while self.started < writes:
                await self._another.wait()
                self._another = anyio.Event()


@pytest.fixture
async def claimed(tmp_path: Path) -> AsyncIterator[tuple[Store, Lease]]:
    store = await open_store(f"sqlite:///{tmp_path / 'c.db'}")
    record = RunRecord(id="run_1", namespace="default", agent="a", input="x", created_at=1.0)
    await store.submit_run(record)
    [(_, lease)] = await store.claim_runs("w1", 30.0)
    try:
        yield store, lease
    finally:
        await store.close()


#: what an event of the tests below carries where it says nothing (the sink reads only
#: the types, call ids and flags the tests give)
_FILLER: dict[str, object] = {
    "step": 1,
    "call_id": "c0",
    "tool": "t",
    "arguments": "{}",
    "output": None,
    "error": None,
    "agent": "a",
    "input": "x",
    "run_id": "run_0",
    "state": "succeeded",
    "code": "failed",
    "message": "x",
}


def event(seq: int, kind: EventType, **data: object) -> Event:
    keys = payload_class(kind)._keys
    filled = {k.key: _FILLER[k.key] for k in keys if k.always and k.key not in data}
    return Event("run_1", seq, parse_event_data(kind, {**filled, **data}), time.time())


async def stored(store: Store) -> list[int]:
    return [e.seq for e in await store.list_events("run_1")]


async def test_an_idempotent_call_and_its_result_share_a_commit_the_engine_does_not_wait_for(
    claimed: tuple[Store, Lease],
) -> None:
    store, lease = claimed
    gated = GatedStore(store)
    async with FencedSink(gated, lease, None) as sink:  # type: ignore[arg-type]
        gated.gate = anyio.Event()
        await sink(event(1, EventType.RUN_START))  # later: nothing written
        await sink(event(2, EventType.MESSAGE_CREATE, message={"role": "assistant"}))
        assert gated.started == 0
        with anyio.fail_after(5):  # behind, then ahead: both return at once
            await sink(event(3, EventType.TOOL_CALL, call_id="c1", idempotent=True))
            await sink(event(4, EventType.TOOL_RESULT, call_id="c1"))
        await anyio.sleep(0)  # the write has started, and is held back
        assert gated.started == 1 and await stored(store) == []

        async def call_not_idempotent() -> None:
            await sink(event(5, EventType.MESSAGE_CREATE, message={"role": "assistant"}))
            await sink(event(6, EventType.TOOL_CALL, call_id="c2", idempotent=False))

        async with anyio.create_task_group() as group:
            group.start_soon(call_not_idempotent)
            await anyio.sleep(0.2)
            assert await stored(store) == []  # a side effect waits for the results before it
            gated.gate.set()
        assert await stored(store) == [1, 2, 3, 4, 5, 6]  # in order, all durable
    assert gated.started == 2  # the call went with its result: 1-4, then 5-6


async def test_the_result_of_a_call_that_is_not_idempotent_waits_for_its_commit(
    claimed: tuple[Store, Lease],
) -> None:
    store, lease = claimed
    gated = GatedStore(store)
    async with FencedSink(gated, lease, None) as sink:  # type: ignore[arg-type]
        await sink(event(1, EventType.TOOL_CALL, call_id="c1", idempotent=False))
        assert await stored(store) == [1]  # now: on disk before the tool starts
        gated.gate = anyio.Event()
        returned = anyio.Event()

        async def result() -> None:
            await sink(event(2, EventType.TOOL_RESULT, call_id="c1"))
            returned.set()

        async with anyio.create_task_group() as group:
            group.start_soon(result)
            await anyio.sleep(0.2)
            assert gated.started == 2 and not returned.is_set()  # the engine waits
            gated.gate.set()
        assert await stored(store) == [1, 2]


async def test_child_events_ride_with_the_park_or_the_next_write_or_go_a_moment_later(
    claimed: tuple[Store, Lease],
) -> None:
    store, lease = claimed
    gated = GatedStore(store)
    clock = FakeClock()
    async with FencedSink(gated, lease, None, clock=clock) as sink:  # type: ignore[arg-type]
        gated.gate = anyio.Event()
        await sink(event(1, EventType.MESSAGE_CREATE, message={"role": "assistant"}))
        with anyio.fail_after(5):  # the child is committed already: nothing to wait for
            await sink(event(2, EventType.CHILD_START, call_id="c1", run_id="run_child"))
        assert gated.started == 0
        assert [e.seq for e in sink.take()] == [1, 2]  # what the park's commit stores
        clock.advance(BEHIND_AFTER_SECONDS)
        await anyio.sleep(0)
        assert gated.started == 0  # taken: the behind write has nothing left to write

        # resumed: the finished children's outcomes and results, which the engine does not
        # wait for (the children's records hold the outcomes for a replay): one write
        with anyio.fail_after(5):
            await sink(event(3, EventType.CHILD_FINISH, call_id="c1", run_id="run_child"))
            await sink(event(4, EventType.TOOL_RESULT, call_id="c1"))
            await sink(event(5, EventType.CHILD_FINISH, call_id="c3", run_id="run_child_3"))
            await sink(event(6, EventType.TOOL_RESULT, call_id="c3"))
        assert gated.started == 0
        clock.advance(BEHIND_AFTER_SECONDS)  # the model's next answer takes its time
        await gated.until_started(1)
        gated.gate.set()
        await sink.settle()
        assert await stored(store) == [3, 4, 5, 6]  # one commit: each spend counted once
        assert gated.started == 1

        # a run that goes on instead of parking (another call of the step still runs)
        # writes its child.start a moment later, so that followers see the child start
        await sink(event(7, EventType.CHILD_START, call_id="c2", run_id="run_child_2"))
        await sink.settle()
        assert await stored(store) == [3, 4, 5, 6]
        clock.advance(BEHIND_AFTER_SECONDS)
        with anyio.fail_after(5):
            while await stored(store) != [3, 4, 5, 6, 7]:
                await anyio.sleep(0.01)


async def test_an_idempotent_call_still_running_is_written_behind_after_a_moment(
    claimed: tuple[Store, Lease],
) -> None:
    store, lease = claimed
    gated = GatedStore(store)
    clock = FakeClock()
    async with FencedSink(gated, lease, None, clock=clock) as sink:  # type: ignore[arg-type]
        await sink(event(1, EventType.MESSAGE_CREATE, message={"role": "assistant"}))
        await sink(event(2, EventType.TOOL_CALL, call_id="c1", idempotent=True))
        await sink(event(3, EventType.TOOL_CALL, call_id="c2", idempotent=True))
        clock.advance(BEHIND_AFTER_SECONDS / 2)
        await sink.settle()  # (returns at once: no write has started)
        assert gated.started == 0 and await stored(store) == []
        clock.advance(BEHIND_AFTER_SECONDS / 2)  # a slow tool: the calls do not wait for it
        await sink.settle()
        assert await stored(store) == [1, 2, 3]
        assert gated.started == 1  # both calls (and the message) in one write
        await sink(event(4, EventType.TOOL_RESULT, call_id="c1"))  # ahead
        await sink.settle()
        assert await stored(store) == [1, 2, 3, 4]


async def test_a_refused_write_stops_the_journal_and_reaches_the_engine(
    claimed: tuple[Store, Lease],
) -> None:
    store, lease = claimed
    gated = GatedStore(store)
    clock = FakeClock()
    async with FencedSink(gated, lease, None, clock=clock) as sink:  # type: ignore[arg-type]
        await sink(event(1, EventType.TOOL_CALL, call_id="c1", idempotent=True))
        await sink.flush()
        gated.gate = anyio.Event()
        await sink(event(2, EventType.TOOL_CALL, call_id="c2", idempotent=True))
        clock.advance(BEHIND_AFTER_SECONDS)
        await gated.until_started(2)  # its write has started behind, and is held back
        assert gated.started == 2
        await store.claim_runs("w2", 30.0, now=time.time() + 60)  # the lease is taken over
        gated.gate.set()
        with pytest.raises(LeaseLostError):
            await sink(event(3, EventType.ERROR, message="x"))
        with pytest.raises(LeaseLostError):
            await sink.settle()
    assert await stored(store) == [1]  # nothing after the refused write
