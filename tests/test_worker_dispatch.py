"""How a worker handles deliveries from a dispatching bus, in this process, on SQLite.

The bus is a fake at the designed seam (:class:`DispatchingBus`): a list of
deliveries the test hands out, each recording how the worker settled it. What
must hold: a delivered run is claimed by id, executed while its delivery is kept
alive, then acked; a delivery the store says needs no worker is acked; one not
due yet comes back when it is; one whose run another worker holds is acked (or,
delivered again, comes back when that lease expires, until its last delivery);
and deliveries that claim nothing never stall a full worker. Also how the worker's
sweep of the store shares slots with deliveries and child runs: expired leases are taken
over while the bus is busy, and a claim gives back what a child took the slot of meanwhile.
Without a dispatching bus: the end of a run of an Agent at max_concurrent_runs is news.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.bus.base import Delivery
from corral.bus.local import LocalBus
from corral.core.runs import RunState
from corral.core.settings import Settings
from corral.runtime.operations import submit
from corral.runtime.worker import Worker
from corral.store import Store, open_store
from durable_tools import ENV_DIR
from test_worker import NOTE_TOOL, agent, apply, get, scripted, settings, store

__all__ = ["settings", "store"]

TESTS = Path(__file__).parent


@dataclass
class FakeDelivery(Delivery):
    """A delivery that records its settlement."""

    run_id: str
    attempt: int = 1
    last: bool = False
    settled: list[tuple[str, float]] = field(default_factory=list[tuple[str, float]])
    progress: int = 0

    async def ack(self) -> None:
        self.settled.append(("ack", 0.0))

    async def nak(self, delay: float = 0.0) -> None:
        self.settled.append(("nak", delay))

    async def in_progress(self) -> None:
        self.progress += 1

    async def term(self) -> None:
        self.settled.append(("term", 0.0))


class DispatchingBus(LocalBus):
    """An in-process bus that hands out the deliveries the test gives it."""

    dispatches = True

    def __init__(self, ack_wait_seconds: float = 30.0) -> None:
        super().__init__()
        self.ack_wait_seconds = ack_wait_seconds
        self.pending: list[Delivery] = []
        self._arrived = anyio.Event()

    def deliver(self, *deliveries: Delivery) -> None:
        self.pending.extend(deliveries)
        self._arrived.set()

    async def take_runnable(self, limit: int, seconds: float) -> list[Delivery]:
        with anyio.move_on_after(seconds):
            while not self.pending:
                await self._arrived.wait()
                self._arrived = anyio.Event()
        taken, self.pending = self.pending[:limit], self.pending[limit:]
        return taken


@asynccontextmanager
async def running(
    store: Store, settings: Settings, bus: DispatchingBus, **options: float
) -> AsyncIterator[Worker]:
    """A worker on ``bus``, past its first sweep of the store (so everything afterwards
    reaches it only by delivery), stopped when the block ends."""
    worker = Worker(store, settings, bus=bus, poll_seconds=60, **options)  # type: ignore[arg-type]
    stop = anyio.Event()
    async with anyio.create_task_group() as group:
        group.start_soon(worker.serve, stop)
        await until(lambda: worker.sweeps >= 1)
        yield worker
        stop.set()


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(0.01)


async def quick_agent(store: Store) -> None:
    await apply(
        store,
        scripted("{tool_calls: [{name: note, arguments: {note: hi}}]}", "{text: done}"),
        NOTE_TOOL,
        agent(),
    )


async def test_deliveries_that_claim_nothing_never_stall_a_full_worker(
    store: Store, settings: Settings
) -> None:
    # One slot: a delivery of a run that is gone fills it; the worker must take the next.
    await quick_agent(store)
    bus = DispatchingBus()
    async with running(store, settings, bus, concurrency=1):
        gone = FakeDelivery("run_that_was_pruned")
        bus.deliver(gone)
        await until(lambda: bool(gone.settled))
        run, _ = await submit(store, "helper", "hi")
        real = FakeDelivery(run.id)
        bus.deliver(real)
        await until(lambda: bool(real.settled))
    assert gone.settled == [("ack", 0.0)]
    assert real.settled == [("ack", 0.0)]
    stored = await get(store, run)
    assert (stored.state, stored.output, stored.attempts) == (RunState.SUCCEEDED, "done", 1)


async def test_a_finished_run_is_acked_and_a_run_not_due_comes_back_when_it_is(
    store: Store, settings: Settings
) -> None:
    await quick_agent(store)
    bus = DispatchingBus()
    async with running(store, settings, bus) as worker:
        later, _ = await submit(store, "helper", "in a minute", delay=60)
        early = FakeDelivery(later.id)
        bus.deliver(early)
        await until(lambda: bool(early.settled))
        [(what, delay)] = early.settled
        assert what == "nak" and 55 < delay <= 60
        assert (await get(store, later)).state is RunState.QUEUED  # not claimed early

        cancelled = await store.request_cancel(later.id)
        assert cancelled.state is RunState.CANCELLED
        again = FakeDelivery(later.id, attempt=2)
        bus.deliver(again)
        await until(lambda: bool(again.settled))
    assert again.settled == [("ack", 0.0)]
    assert worker.dispatched == 0


async def test_a_run_another_worker_holds_is_theirs_until_its_lease_expires(
    store: Store, settings: Settings
) -> None:
    await quick_agent(store)
    bus = DispatchingBus()
    async with running(store, settings, bus) as worker:
        run, _ = await submit(store, "helper", "hi")
        await store.claim_runs("other-worker", 30, run_ids=[run.id])
        first = FakeDelivery(run.id)
        redelivered = FakeDelivery(run.id, attempt=2)
        final = FakeDelivery(run.id, attempt=5, last=True)
        bus.deliver(first, redelivered, final)
        await until(lambda: all(d.settled for d in (first, redelivered, final)))
    # A first delivery: the holder's lease is the guarantee.
    assert first.settled == [("ack", 0.0)]
    # Delivered again: its worker went silent; come back once the lease has expired.
    [(what, delay)] = redelivered.settled
    assert what == "nak" and 25 < delay < 32
    # The last delivery is never nak'ed into the dead letters: the sweep has the run.
    assert final.settled == [("ack", 0.0)]
    assert worker.dispatched == 0
    assert (await get(store, run)).lease_owner == "other-worker"


async def test_a_long_run_keeps_its_delivery_alive_until_it_ends(
    store: Store, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    await apply(
        store,
        scripted(
            "{tool_calls: [{name: slow, arguments: {label: x, seconds: 0.8}}]}", "{text: done}"
        ),
        f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: slow}}
spec:
  type: python
  python: {{function: "durable_tools:perform_once", path: "{TESTS}"}}
  idempotent: true
""",
        agent().replace("tools: [note]", "tools: [slow]"),
    )
    bus = DispatchingBus(ack_wait_seconds=0.3)  # in_progress every 0.1 s
    async with running(store, settings, bus) as worker:
        run, _ = await submit(store, "helper", "take your time")
        delivery = FakeDelivery(run.id)
        started = time.monotonic()
        bus.deliver(delivery)
        await until(lambda: bool(delivery.settled))
        took = time.monotonic() - started
    assert took >= 0.8
    assert delivery.progress >= 4  # kept alive all along
    assert delivery.settled == [("ack", 0.0)]
    assert (await get(store, run)).state is RunState.SUCCEEDED
    assert worker.dispatched == 1 and worker.swept == 0


async def test_a_due_run_its_agent_has_no_room_for_comes_back_later_and_later(
    store: Store, settings: Settings
) -> None:
    await apply(
        store,
        scripted("{tool_calls: [{name: note, arguments: {note: hi}}]}", "{text: done}"),
        NOTE_TOOL,
        agent(extra="  max_concurrent_runs: 1"),
    )
    bus = DispatchingBus()
    async with running(store, settings, bus) as worker:
        busy, _ = await submit(store, "helper", "first")
        await store.claim_runs("other-worker", 30, run_ids=[busy.id])  # the agent's one slot
        waiting, _ = await submit(store, "helper", "second")
        deliveries = [
            FakeDelivery(waiting.id, attempt=1),
            FakeDelivery(waiting.id, attempt=3),
            FakeDelivery(waiting.id, attempt=5, last=True),
        ]
        bus.deliver(*deliveries)
        await until(lambda: all(d.settled for d in deliveries))
    assert [d.settled for d in deliveries] == [[("nak", 0.5)], [("nak", 2.0)], [("ack", 0.0)]]
    assert worker.dispatched == 0
    assert (await get(store, waiting)).state is RunState.QUEUED


async def test_a_more_urgent_due_run_is_claimed_in_place_of_a_delivered_one(
    store: Store, settings: Settings
) -> None:
    # NATS delivers in announcement order; the claim puts the more urgent run first.
    await quick_agent(store)
    bus = DispatchingBus()
    async with running(store, settings, bus, concurrency=1) as worker:
        normal, _ = await submit(store, "helper", "whenever")
        urgent, _ = await submit(store, "helper", "now", priority=5)
        first = FakeDelivery(normal.id)
        bus.deliver(first)
        await until(lambda: bool(first.settled))
        await until(lambda: not worker.active)
        assert (await get(store, urgent)).state is RunState.SUCCEEDED
        assert (await get(store, normal)).state is RunState.QUEUED
        late = FakeDelivery(urgent.id)  # the urgent run's own delivery, behind the other
        again = FakeDelivery(normal.id, attempt=2)
        bus.deliver(late, again)
        await until(lambda: bool(late.settled and again.settled))
    assert first.settled == [("nak", 0.5)]  # displaced: comes again shortly
    assert late.settled == [("ack", 0.0)] and again.settled == [("ack", 0.0)]
    done = await get(store, normal)
    assert done.state is RunState.SUCCEEDED and done.attempts == 1
    assert (await get(store, urgent)).attempts == 1
    assert worker.dispatched == 2 and worker.swept == 0


class BusyBus(DispatchingBus):
    """A bus that always has something for the worker: each fetch hands out a delivery
    of a run that is gone (acked at once), so the worker never finds the bus quiet."""

    def __init__(self) -> None:
        super().__init__()
        self.handed = 0

    async def take_runnable(self, limit: int, seconds: float) -> list[Delivery]:
        await anyio.sleep(0.01)
        self.handed += 1
        return [FakeDelivery(f"run_gone_{self.handed}")]


async def test_a_busy_bus_still_gets_a_run_back_whose_worker_died_without_announcing_it(
    store: Store, settings: Settings
) -> None:
    # A child claimed on its parent's worker (or a parent its child's save woke and
    # claimed) is never announced: when that worker dies, no delivery comes back for it.
    # The sweep must claim it once its lease expires even while the bus is never quiet,
    # and still leave a queued run (announced, its delivery on the way) to the bus.
    await quick_agent(store)
    orphan, _ = await submit(store, "helper", "claimed where it was submitted")
    [(_, lease)] = await store.claim_runs("dead-worker", 0.5, run_ids=[orphan.id])
    bus = BusyBus()
    worker = Worker(store, settings, bus=bus, poll_seconds=0.05)  # type: ignore[arg-type]
    stop = anyio.Event()
    async with anyio.create_task_group() as group:
        group.start_soon(worker.serve, stop)
        await until(lambda: bus.handed >= 2)  # the bus is busy from here on
        announced, _ = await submit(store, "helper", "its delivery is on the way")
        await until(lambda: worker.swept >= 1)
        await until(lambda: not worker.active)
        sweeps = worker.sweeps
        await until(lambda: worker.sweeps >= sweeps + 3)
        stop.set()
    done = await get(store, orphan)
    assert (done.state, done.output, done.attempts) == (RunState.SUCCEEDED, "done", 2)
    assert done.fencing_token > lease.token
    assert (await get(store, announced)).state is RunState.QUEUED
    assert worker.swept == 1 and bus.handed > 3


async def test_a_sweep_gives_back_what_a_child_run_took_the_slot_of_meanwhile(
    store: Store, settings: Settings
) -> None:
    # A child submitted by a run of this worker while a sweep's claim is under way takes a
    # slot the claim is filling: the claim's least urgent run goes back (its attempt
    # refunded) rather than the worker running one more than its concurrency.
    await quick_agent(store)
    urgent, _ = await submit(store, "helper", "urgent", priority=5)
    later, _ = await submit(store, "helper", "later")
    took: list[object] = []
    worker = Worker(store, settings, bus=LocalBus(), concurrency=2, poll_seconds=60)
    claim_runs = store.claim_runs

    async def claim_while_a_child_takes_a_slot(*args: Any, **kwargs: Any) -> Any:
        claims = await claim_runs(*args, **kwargs)
        if not took:
            took.append(worker.reserve())  # (a run of the worker submitting a child)
        return claims

    store.claim_runs = claim_while_a_child_takes_a_slot  # type: ignore[method-assign]
    stop = anyio.Event()
    async with anyio.create_task_group() as group:
        group.start_soon(worker.serve, stop)
        await until(lambda: worker.executed == 2)  # (the child's slot stays taken)
        stop.set()
    assert took[0] is not None
    assert worker.swept == 2  # the urgent run, then the given-back run by the next sweep
    for run, claims in ((urgent, 1), (later, 2)):
        done = await get(store, run)
        # given back with its attempt refunded, then claimed again
        assert (done.state, done.attempts, done.fencing_token) == (
            RunState.SUCCEEDED,
            1,
            claims,
        )


async def test_a_slot_kept_by_a_claim_is_not_free_while_the_rest_goes_back(
    store: Store, settings: Settings
) -> None:
    # The claim keeps the urgent run and gives the other back (a child took its slot). While
    # the give-back waits on the store, the kept run holds its slot: a second child asking
    # then (or a delivery) finds none free, or the worker would run three runs on two slots.
    await quick_agent(store)
    await submit(store, "helper", "urgent", priority=5)
    await submit(store, "helper", "later")
    slots: list[object] = []
    worker = Worker(store, settings, bus=LocalBus(), concurrency=2, poll_seconds=60)
    claim_runs, release_run = store.claim_runs, store.release_run

    async def claim_while_a_child_takes_a_slot(*args: Any, **kwargs: Any) -> Any:
        claims = await claim_runs(*args, **kwargs)
        if not slots:
            slots.append(worker.reserve())  # (a run of the worker submitting a child)
        return claims

    async def release_while_another_child_asks(*args: Any, **kwargs: Any) -> None:
        slots.append(worker.reserve())
        await release_run(*args, **kwargs)

    store.claim_runs = claim_while_a_child_takes_a_slot  # type: ignore[method-assign]
    store.release_run = release_while_another_child_asks  # type: ignore[method-assign]
    stop = anyio.Event()
    async with anyio.create_task_group() as group:
        group.start_soon(worker.serve, stop)
        await until(lambda: len(slots) == 2)
        await until(lambda: worker.executed >= 1)
        stop.set()
    assert slots[0] is not None  # the first child's slot
    assert slots[1] is None, "a slot the kept claim holds went to another child"


@pytest.fixture(params=["sqlite", "postgresql"])
async def either_store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Store]:
    """A SQLite store, or the scratch PostgreSQL database (runs claimed by sweeping both)."""
    monkeypatch.setenv("CORRAL_TEST_SIDE_EFFECTS", str(tmp_path / "effects.txt"))
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'corral.db'}"
    else:
        postgres = request.getfixturevalue("postgres")
        url = postgres.url(postgres.scratch())
    opened = await open_store(url)
    try:
        yield opened
    finally:
        await opened.close()


async def test_a_run_of_a_limited_agent_that_ends_lets_the_next_one_go_at_once(
    either_store: Store, settings: Settings
) -> None:
    # Agent at max_concurrent_runs: 1, three runs queued, a worker with slots to spare.
    # Its claims get one run at a time (the rest wait for the agent's room): the end of
    # each must lead to the next claim, not leave the worker idle until its poll.
    store = either_store
    await apply(
        store,
        scripted("{tool_calls: [{name: note, arguments: {note: hi}}]}", "{text: done}"),
        NOTE_TOOL,
        agent(extra="  max_concurrent_runs: 1"),
    )
    runs = [(await submit(store, "helper", f"run {i}"))[0] for i in range(3)]
    worker = Worker(store, settings, bus=LocalBus(), concurrency=4, poll_seconds=60)
    stop = anyio.Event()
    async with anyio.create_task_group() as group:
        group.start_soon(worker.serve, stop)
        await until(lambda: worker.executed >= 3)  # (well before the poll)
        stop.set()
    for run in runs:
        assert (await get(store, run)).state is RunState.SUCCEEDED


class AnnouncingBusyBus(BusyBus):
    """A :class:`BusyBus` that also delivers the runs announced on it."""

    def __init__(self) -> None:
        super().__init__()
        self.announced: list[str] = []

    async def announce_runnable(self, run_ids: Any, *, mark: str | None = None) -> None:
        self.announced.extend(run_ids)

    async def take_runnable(self, limit: int, seconds: float) -> list[Delivery]:
        if self.announced:
            taken, self.announced = self.announced[:limit], self.announced[limit:]
            return [FakeDelivery(run_id) for run_id in taken]
        return await super().take_runnable(limit, seconds)


async def test_a_run_a_busy_sweep_took_over_and_gave_back_is_delivered_again(
    store: Store, settings: Settings
) -> None:
    # The sweep of a worker whose bus is busy takes over a dead worker's run (never
    # announced) and gives it back: a child took the slot meanwhile. Queued again, its
    # lease no longer expired, only a sweep of queued runs would find it, and this
    # worker's bus is never quiet: it must be announced like any released run.
    await quick_agent(store)
    orphan, _ = await submit(store, "helper", "claimed where it was submitted")
    await store.claim_runs("dead-worker", 0.2, run_ids=[orphan.id])
    bus = AnnouncingBusyBus()
    worker = Worker(store, settings, bus=bus, concurrency=1, poll_seconds=0.05)  # type: ignore[arg-type]
    claim_runs, release_run = store.claim_runs, store.release_run
    took: list[object] = []

    async def claim_while_a_child_takes_the_slot(*args: Any, **kwargs: Any) -> Any:
        claims = await claim_runs(*args, **kwargs)
        if claims and not took:
            took.append(worker.reserve())  # (a run of the worker submitting a child)
        return claims

    async def release_then_the_child_ends(*args: Any, **kwargs: Any) -> None:
        await release_run(*args, **kwargs)
        if took and took[0] is not None:
            took[0] = None
            worker.release()  # (the child ended: its slot is free)

    store.claim_runs = claim_while_a_child_takes_the_slot  # type: ignore[method-assign]
    store.release_run = release_then_the_child_ends  # type: ignore[method-assign]
    stop = anyio.Event()
    async with anyio.create_task_group() as group:
        group.start_soon(worker.serve, stop)
        await until(lambda: bool(took))
        with anyio.move_on_after(5):
            while (await get(store, orphan)).state is not RunState.SUCCEEDED:
                await anyio.sleep(0.02)
        stop.set()
    done = await get(store, orphan)
    assert done.state is RunState.SUCCEEDED, f"given back and left {done.state.value}"
