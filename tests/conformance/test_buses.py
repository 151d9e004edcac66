"""What every :class:`~corral.bus.base.Bus` does, run against each implementation.

A bus is tested through *peers*: handles of one deployment, as the processes of a
deployment hold them. The in-process bus has one handle for everybody; NATS opens a
connection per peer, under a subject and stream prefix of the test's own on the shared
server. A new bus gets these tests by a row in :data:`BUSES` and the fixture it names.
What only one bus does (NATS dispatch, redelivery, dead letters, restarts) stays in its
own module (``tests/test_bus_nats.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from corral.bus import Bus, LocalBus, MessageDelivery
from corral.runtime.fanout import FanOut, FanOutBus
from corral.store import open_store
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
    # the bus of a server process: the in-process bus behind its FanOut wrapper
    BusKind("fanout", "fanout_peers"),
]


@pytest.fixture
async def fan_out(tmp_path: Path) -> AsyncIterator[FanOut]:
    store = await open_store(f"sqlite:///{tmp_path / 'corral.db'}")
    try:
        yield FanOut(store)
    finally:
        await store.close()


@pytest.fixture
def local_peers() -> Peer:
    bus = LocalBus()

    async def peer() -> Bus:
        return bus  # one process: every peer holds the same bus

    return peer


@pytest.fixture
def fanout_peers(fan_out: FanOut) -> Peer:
    bus = FanOutBus(LocalBus(), fan_out)

    async def peer() -> Bus:
        return bus

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


# --------------------------------------------------------------------------- agent messages

#: opens a handle of the test's deployment with the given delivery options
#: (``ack_wait_seconds``, ``max_deliver``); every handle of one test gets the same
InboxPeer = Callable[..., Awaitable[Bus]]

#: namespaces and agents that must each have an inbox of their own: separators,
#: wildcards, spaces, unicode, a would-be hash, an overlong name, the empty name
HOSTILE_NAMES = [
    "writer",
    "a.b",
    "a",
    "b.c",
    "*",
    ">",
    "a.*",
    "a.>",
    "with space",
    "tab\tname",
    "ünïcødé-名前",
    "_" + "0" * 40,
    "x612e62",
    "n" * 300,
    "",
]


@pytest.fixture
def local_inboxes() -> InboxPeer:
    buses: list[LocalBus] = []

    async def peer(**options: float) -> Bus:
        if not buses:  # one process: every peer holds the same bus
            buses.append(LocalBus(**options))  # type: ignore[arg-type]
        return buses[0]

    return peer


@pytest.fixture
def fanout_inboxes(fan_out: FanOut) -> InboxPeer:
    buses: list[Bus] = []

    async def peer(**options: float) -> Bus:
        if not buses:
            buses.append(FanOutBus(LocalBus(**options), fan_out))  # type: ignore[arg-type]
        return buses[0]

    return peer


@pytest.fixture
def nats_inboxes(connect: OpenBus) -> InboxPeer:
    async def peer(**options: float) -> Bus:
        return await connect(**options)

    return peer


@pytest.fixture(params=BUSES, ids=lambda kind: kind.name)
def inbox_peer(request: pytest.FixtureRequest) -> InboxPeer:
    opener: InboxPeer = request.getfixturevalue(request.param.peers.replace("peers", "inboxes"))
    return opener


async def take_messages(
    bus: Bus, seconds: float = PROMPTLY, limit: int = 10
) -> list[MessageDelivery]:
    return await bus.take_agent_messages(limit, seconds)


async def test_a_sent_agent_message_is_delivered_once_to_a_taker(inbox_peer: InboxPeer) -> None:
    sender, taker = await inbox_peer(), await inbox_peer()
    assert sender.delivers_messages and taker.delivers_messages
    await sender.send_agent_message("team", "writer", "msg_1")
    await sender.send_agent_message("team", "critic", "msg_2")
    seen: list[MessageDelivery] = []
    with anyio.fail_after(PROMPTLY):
        while len(seen) < 2:
            seen += await take_messages(taker)
    assert sorted((d.message_id, d.namespace, d.agent) for d in seen) == [
        ("msg_1", "team", "writer"),
        ("msg_2", "team", "critic"),
    ]
    assert {(d.attempt, d.last) for d in seen} == {(1, False)}
    for delivery in seen:
        await delivery.ack()
        await delivery.ack()  # settled twice: harmless
    assert await take_messages(taker, 0.5) == []


async def test_a_message_id_sent_again_is_delivered_once(inbox_peer: InboxPeer) -> None:
    one, two = await inbox_peer(), await inbox_peer()
    await one.send_agent_message("team", "writer", "msg_dup")
    await two.send_agent_message("team", "writer", "msg_dup")  # another replica, same message
    [delivery] = await take_messages(one)
    assert delivery.message_id == "msg_dup"
    await delivery.ack()
    await one.send_agent_message("team", "writer", "msg_dup")  # a coordinator replayed
    assert await take_messages(two, 0.5) == []


async def test_nak_with_a_delay_delivers_again_after_it_with_the_next_attempt(
    inbox_peer: InboxPeer,
) -> None:
    bus = await inbox_peer()
    await bus.send_agent_message("team", "writer", "msg_retry")
    [first] = await take_messages(bus)
    await first.nak(1.5)  # a retryable failure: try again in a while
    assert await take_messages(bus, 0.5) == []  # not before the delay
    [again] = await take_messages(bus)
    assert (again.message_id, again.attempt, again.last) == ("msg_retry", 2, False)
    await again.ack()


async def test_the_last_delivery_says_so_and_nothing_comes_after_it(inbox_peer: InboxPeer) -> None:
    bus = await inbox_peer(ack_wait_seconds=1.0, max_deliver=2)
    await bus.send_agent_message("team", "writer", "msg_poison")
    [first] = await take_messages(bus)
    assert (first.attempt, first.last) == (1, False)
    await first.nak()
    [last] = await take_messages(bus)
    assert (last.attempt, last.last) == (2, True)
    await last.nak()  # given up once more: a dead letter, never delivered again
    assert await take_messages(bus, 2.0) == []


async def test_an_unsettled_delivery_comes_again_after_the_ack_wait(
    inbox_peer: InboxPeer,
) -> None:
    bus, other = await inbox_peer(ack_wait_seconds=1.0), await inbox_peer(ack_wait_seconds=1.0)
    await bus.send_agent_message("team", "writer", "msg_lost")
    [first] = await take_messages(bus)  # and its consumer goes silent
    [again] = await take_messages(other)
    assert (again.message_id, again.attempt) == ("msg_lost", 2)
    await again.ack()
    await first.ack()  # too late, and harmless
    assert await take_messages(other, 1.5) == []


async def test_in_progress_keeps_a_delivery_from_the_other_consumers(
    inbox_peer: InboxPeer,
) -> None:
    bus, other = await inbox_peer(ack_wait_seconds=1.0), await inbox_peer(ack_wait_seconds=1.0)
    await bus.send_agent_message("team", "writer", "msg_long")
    [held] = await take_messages(bus)
    stolen: list[MessageDelivery] = []

    async def keep_alive() -> None:
        for _ in range(8):  # 2.4 s, more than twice the ack wait
            await anyio.sleep(0.3)
            await held.in_progress()

    async def take_meanwhile() -> None:
        with anyio.move_on_after(2.4):
            while True:
                stolen.extend(await take_messages(other, 0.5))

    async with anyio.create_task_group() as group:
        group.start_soon(keep_alive)
        group.start_soon(take_meanwhile)
    assert stolen == []
    await held.ack()
    assert await take_messages(other, 1.5) == []


async def test_a_terminated_delivery_never_comes_again(inbox_peer: InboxPeer) -> None:
    bus = await inbox_peer(ack_wait_seconds=1.0)
    await bus.send_agent_message("team", "writer", "msg_gone")
    [delivery] = await take_messages(bus)
    await delivery.term()
    assert await take_messages(bus, 2.0) == []


async def test_consumers_sharing_the_inboxes_never_both_get_one_message(
    inbox_peer: InboxPeer,
) -> None:
    one, two = await inbox_peer(), await inbox_peer()
    sent = [f"msg_{i}" for i in range(30)]
    for number, message_id in enumerate(sent):
        await one.send_agent_message("team", f"agent-{number % 3}", message_id)
    taken: dict[str, list[str]] = {"one": [], "two": []}

    async def consume(name: str, bus: Bus) -> None:
        with anyio.move_on_after(3.0):
            while sum(map(len, taken.values())) < len(sent):
                for delivery in await take_messages(bus, 0.5, limit=4):
                    taken[name].append(delivery.message_id)
                    await anyio.sleep(0.01)  # the other consumer's turn
                    await delivery.ack()

    async with anyio.create_task_group() as group:
        group.start_soon(consume, "one", one)
        group.start_soon(consume, "two", two)
    assert sorted(taken["one"] + taken["two"]) == sorted(sent)  # each exactly once
    assert not set(taken["one"]) & set(taken["two"])


async def test_hostile_inbox_names_never_reach_another_inbox(inbox_peer: InboxPeer) -> None:
    sender, taker = await inbox_peer(), await inbox_peer()
    inboxes = [(ns, agent) for ns in HOSTILE_NAMES[:6] for agent in HOSTILE_NAMES]
    inboxes += [("a", "b.c"), ("a.b", "c")]  # the same dotted path, split differently
    for number, (namespace, agent) in enumerate(inboxes):
        await sender.send_agent_message(namespace, agent, f"msg_{number}")
    delivered: dict[str, tuple[str, str]] = {}
    with anyio.fail_after(PROMPTLY * 3):
        while len(delivered) < len(inboxes):
            for delivery in await take_messages(taker, limit=50):
                assert delivery.message_id not in delivered
                delivered[delivery.message_id] = (delivery.namespace, delivery.agent)
                await delivery.ack()
    assert delivered == {f"msg_{n}": inbox for n, inbox in enumerate(inboxes)}
    assert await take_messages(taker, 0.5) == []


async def test_a_closed_bus_sends_no_agent_message_and_hands_none_out(
    inbox_peer: InboxPeer,
) -> None:
    bus = await inbox_peer()
    await bus.close()
    await bus.send_agent_message("team", "writer", "msg_after_close")  # dropped, never raised
    assert await take_messages(bus, 0.05) == []


async def test_hostile_message_ids_arrive_as_sent_and_are_deduplicated(
    inbox_peer: InboxPeer,
) -> None:
    sender, taker = await inbox_peer(), await inbox_peer()
    ids = ["msg a", "msg\r\nNats-Msg-Id: msg_b", "msg_b", "ünï", "m" * 5000, "_" + "0" * 40]
    for message_id in ids + ids:  # each sent twice
        await sender.send_agent_message("team", "writer", message_id)
    delivered: list[str] = []
    with anyio.fail_after(PROMPTLY):
        while len(delivered) < len(ids):
            for delivery in await take_messages(taker):
                delivered.append(delivery.message_id)
                await delivery.ack()
    assert sorted(delivered) == sorted(ids)
    assert await take_messages(taker, 0.5) == []
