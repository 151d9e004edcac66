"""What every :class:`~corral.bus.base.Bus` does, run against each implementation.

A bus is tested through *peers*: handles of one deployment, as the processes of a
deployment hold them. The in-process bus has one handle for everybody; NATS opens a
connection per peer, under a subject and stream prefix of the test's own on the shared
server. A new bus gets these tests by a row in :data:`BUSES` and the fixture it names.
What only one bus does (NATS dispatch, redelivery, dead letters, restarts) stays in its
own module (``tests/test_bus_nats.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import pytest

from corral.bus import Bus, LocalBus
from nats_servers import (
    OpenBus,
    connect_fixture,
    nats_prefix_fixture,
    nats_server_url_fixture,
)

__all__ = ["connect_fixture", "nats_prefix_fixture", "nats_server_url_fixture"]

#: opens another handle of the test's deployment
Peer = Callable[[], Awaitable[Bus]]

#: a wait that returns within this was woken: far beyond any wake-up, far below the 60 s
#: the waits below would take on their own
PROMPTLY = 10.0


@dataclass(frozen=True)
class BusKind:
    """One Bus implementation: the fixture that gives a test its :data:`Peer` opener."""

    name: str
    peers: str


BUSES = [
    BusKind("local", "local_peers"),
    BusKind("nats", "nats_peers"),
]


@pytest.fixture
def local_peers() -> Peer:
    bus = LocalBus()

    async def peer() -> Bus:
        return bus  # one process: every peer holds the same bus

    return peer


@pytest.fixture
def nats_peers(connect: OpenBus) -> Peer:
    async def peer() -> Bus:
        return await connect()

    return peer


@pytest.fixture(params=BUSES, ids=lambda kind: kind.name)
def peer(request: pytest.FixtureRequest) -> Peer:
    opener: Peer = request.getfixturevalue(request.param.peers)
    return opener


async def test_an_event_watch_fires_once_per_announcement_and_only_for_its_run(
    peer: Peer,
) -> None:
    announcer, elsewhere = await peer(), await peer()
    async with (
        elsewhere.watch_events("run_1") as first,
        elsewhere.watch_events("run_1") as first_again,
        announcer.watch_events("run_1") as own,
        elsewhere.watch_events("run_2") as unrelated,
    ):
        await announcer.announce_events("run_1", 7)  # before the waits: not lost
        for watch in (first, first_again, own):
            assert await watch.wait(5) is True
        assert await unrelated.wait(0.3) is False
        assert await first.wait(0.1) is False  # consumed

        async def announce_later() -> None:
            await anyio.sleep(0.05)
            await announcer.announce_events("run_1", 8)

        async with anyio.create_task_group() as group:
            group.start_soon(announce_later)
            assert await first.wait(PROMPTLY) is True  # woken while it waits

    # The last watch of a run is gone: announcing again reaches nobody, and is fine.
    await announcer.announce_events("run_1", 9)


async def test_a_run_id_that_is_not_a_subject_token_still_fans_out(peer: Peer) -> None:
    announcer, elsewhere = await peer(), await peer()
    async with elsewhere.watch_events("odd.id *>") as watch:
        await announcer.announce_events("odd.id *>", 1)
        assert await watch.wait(5) is True


async def test_a_runnable_announcement_wakes_a_waiter_and_nothing_else_does(peer: Peer) -> None:
    waiter, announcer = await peer(), await peer()
    await waiter.wait_runnable(0.01)  # registered: a bus may start listening on the first wait
    with anyio.fail_after(PROMPTLY):
        async with anyio.create_task_group() as group:
            group.start_soon(waiter.wait_runnable, 60.0)
            await announcer.announce_runnable(["run_x"])

    await announcer.announce_runnable([])  # nothing runnable: no wake-up
    for _ in range(2):  # the second: nothing announced since the last wait
        started = anyio.current_time()
        await waiter.wait_runnable(0.2)
        assert anyio.current_time() - started >= 0.2  # it waited out its timeout


async def test_an_announced_run_is_handed_out_or_left_to_the_store(peer: Peer) -> None:
    """A bus that dispatches delivers the run; any other wakes the taker, who looks in the
    store (``take_runnable`` returns no delivery)."""
    taker, announcer = await peer(), await peer()
    await taker.wait_runnable(0.01)
    await announcer.announce_runnable(["run_1"], mark="submitted")
    with anyio.fail_after(PROMPTLY):
        deliveries = await taker.take_runnable(10, 60.0)
    assert [d.run_id for d in deliveries] == (["run_1"] if taker.dispatches else [])
    for delivery in deliveries:
        assert delivery.attempt == 1
        await delivery.ack()


async def test_a_closed_bus_drops_announcements_and_hands_nothing_out(peer: Peer) -> None:
    bus = await peer()
    await bus.close()
    await bus.announce_runnable(["run_1"], mark="submitted")  # dropped, never raised
    await bus.announce_events("run_1", 1)
    assert await bus.take_runnable(10, 0.05) == []
