"""The NATS JetStream bus against a real NATS server: dispatch, redelivery, dead letters,
and a server restart (what every bus does, wake-ups and event fan-out across connections, is
in ``tests/conformance/test_buses.py``).

Each test has a subject and stream prefix of its own on the shared server
(``nats_prefix``); the restart test runs a server of its own (``private_nats``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable

import anyio
import nats
import pytest
from nats.aio.msg import Msg

from corral.bus import LocalBus, open_bus
from corral.bus.base import Delivery, MessageDelivery
from corral.bus.nats import NatsBus, inbox_subject, inbox_token
from corral.core.errors import BusError, ConfigurationError
from nats_servers import (
    NatsServerProcess,
    OpenBus,
    connect_fixture,
    free_port,
    nats_prefix_fixture,
    nats_server_url_fixture,
    private_nats_fixture,
)

__all__ = [
    "connect_fixture",
    "nats_prefix_fixture",
    "nats_server_url_fixture",
    "private_nats_fixture",
]


async def take(bus: NatsBus, seconds: float = 5.0, limit: int = 10) -> list[Delivery]:
    """The deliveries of one fetch that waits up to ``seconds`` for the first."""
    return await bus.take_runnable(limit, seconds)


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await anyio.sleep(0.05)


async def dead_letters(bus: NatsBus) -> list[tuple[str, dict[str, str]]]:
    """The dead-letter stream's run dispatches: (run id, headers)."""
    info = await bus.js.stream_info(bus.dead_stream)
    found = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        stored = await bus.js.get_msg(bus.dead_stream, seq)
        if stored.subject == bus.dead_subject:
            found.append(((stored.data or b"").decode(), dict(stored.headers or {})))
    return found


# --------------------------------------------------------------------------- opening


async def test_without_a_url_the_bus_is_the_in_process_one() -> None:
    async with await open_bus(None) as bus:
        assert isinstance(bus, LocalBus) and not bus.dispatches


async def test_an_unreachable_server_fails_the_start_with_a_bus_error() -> None:
    started = time.monotonic()
    with pytest.raises(BusError, match="cannot connect to NATS"):
        await open_bus(f"nats://127.0.0.1:{free_port()}", prefix="nobody")
    assert time.monotonic() - started < 15


async def test_a_prefix_that_is_not_a_subject_token_is_refused(nats_server_url: str) -> None:
    with pytest.raises(ConfigurationError, match="prefix"):
        await open_bus(nats_server_url, prefix="a.b")


# --------------------------------------------------------------------------- dispatch


async def test_the_same_change_announced_twice_is_delivered_once_and_a_new_change_again(
    connect: OpenBus,
) -> None:
    bus = await connect()
    await bus.announce_runnable(["run_a"], mark="submitted")
    await bus.announce_runnable(["run_a"], mark="submitted")  # a retried publish
    [first] = await take(bus)
    assert (first.run_id, first.attempt, first.last) == ("run_a", 1, False)
    await first.ack()
    assert await take(bus, 0.5) == []  # the duplicate was dropped by its Nats-Msg-Id

    await bus.announce_runnable(["run_a"], mark="released:1")  # a later change of the run
    await bus.announce_runnable(["run_a", "run_b"])  # no mark: never dropped
    await bus.announce_runnable(["run_b"])
    delivered = [d.run_id for d in await take(bus)]
    assert sorted(delivered) == ["run_a", "run_a", "run_b", "run_b"]


async def test_each_delivery_goes_to_one_of_the_workers_sharing_the_consumer(
    connect: OpenBus,
) -> None:
    one, two = await connect(), await connect()
    await one.announce_runnable([f"run_{i}" for i in range(20)], mark="submitted")
    seen: list[str] = []
    for bus in (one, two, one, two):
        for delivery in await take(bus, 1.0, limit=5):
            seen.append(delivery.run_id)
            await delivery.ack()
    assert sorted(seen) == sorted(f"run_{i}" for i in range(20))


async def test_an_unsettled_delivery_comes_again_after_the_ack_wait(connect: OpenBus) -> None:
    bus = await connect(ack_wait_seconds=1.0)
    other = await connect(ack_wait_seconds=1.0)
    await bus.announce_runnable(["run_a"], mark="submitted")
    [first] = await take(bus)  # and its worker goes silent
    started = time.monotonic()
    [again] = await take(other)
    waited = time.monotonic() - started
    assert (again.run_id, again.attempt) == ("run_a", 2)
    assert 0.5 < waited < 4, waited
    await again.ack()
    await first.ack()  # too late, and harmless


async def test_in_progress_keeps_a_delivery_from_its_other_workers(connect: OpenBus) -> None:
    bus = await connect(ack_wait_seconds=1.0)
    other = await connect(ack_wait_seconds=1.0)
    await bus.announce_runnable(["run_long"], mark="submitted")
    [held] = await take(bus)
    stolen: list[Delivery] = []

    async def keep_alive() -> None:
        for _ in range(8):  # 2.4 s, more than twice the ack wait
            await anyio.sleep(0.3)
            await held.in_progress()

    async def fetch_meanwhile() -> None:
        deadline = time.monotonic() + 2.4
        while time.monotonic() < deadline:
            stolen.extend(await take(other, 0.5))

    async with anyio.create_task_group() as group:
        group.start_soon(keep_alive)
        group.start_soon(fetch_meanwhile)
    assert stolen == []
    await held.ack()
    assert await take(other, 1.5) == []  # acknowledged: gone from the work queue


async def test_nak_with_a_delay_delivers_again_once_the_delay_passed(connect: OpenBus) -> None:
    bus = await connect()
    await bus.announce_runnable(["run_later"], mark="submitted")
    [delivery] = await take(bus)
    await delivery.nak(1.0)  # e.g. a retry due in a second
    started = time.monotonic()
    [again] = await take(bus)
    assert again.run_id == "run_later" and again.attempt == 2
    assert 0.7 < time.monotonic() - started < 4
    await again.ack()


async def test_a_delivery_past_max_deliver_moves_to_the_dead_letter_stream(
    connect: OpenBus,
) -> None:
    bus = await connect(ack_wait_seconds=1.0, max_deliver=2)
    await bus.announce_runnable(["run_poison"], mark="submitted")
    [first] = await take(bus)
    await first.nak()
    [last] = await take(bus)
    assert (last.attempt, last.last) == (2, True)
    await last.nak()  # its worker gave up on it once more: the server stops delivering

    async def dead() -> bool:
        assert await take(bus, 0.3) == []  # a pending fetch lets the server notice
        return bool(await dead_letters(bus))

    await until(dead)
    [(run_id, headers)] = await dead_letters(bus)
    assert run_id == "run_poison"
    assert headers["Corral-Run-Id"] == "run_poison" and headers["Corral-Deliveries"] == "2"
    info = await bus.js.stream_info(bus.stream)
    assert info.state.messages == 0  # deleted from the work queue


async def test_a_malformed_dispatch_is_terminated_not_handed_out(
    connect: OpenBus, nats_server_url: str
) -> None:
    bus = await connect()
    client = await nats.connect(nats_server_url)
    try:
        await client.jetstream().publish(bus.runnable_subject, b"\xff\xfe")
    finally:
        await client.close()
    assert await take(bus, 1.0) == []
    assert await take(bus, 1.5) == []  # not delivered again either


# --------------------------------------------------------------------------- a NATS restart


async def test_the_bus_rides_out_a_nats_restart(private_nats: NatsServerProcess) -> None:
    prefix = "restart"
    async with (
        await NatsBus.connect(private_nats.url, prefix=prefix, ack_wait_seconds=1.0) as bus,
        await NatsBus.connect(private_nats.url, prefix=prefix) as api,
    ):
        await api.announce_runnable(["run_before"], mark="submitted")
        held = await take(bus)
        assert [d.run_id for d in held] == ["run_before"]  # taken, never settled

        await anyio.to_thread.run_sync(private_nats.stop)

        async def noticed() -> bool:
            return not bus.client.is_connected and not api.client.is_connected

        await until(noticed)
        # While it is down nothing raises and nothing blocks for long.
        started = time.monotonic()
        await api.announce_runnable(["run_during"], mark="submitted")  # dropped: the sweep's
        await api.announce_events("run_x", 1)
        assert await bus.take_runnable(5, 0.3) == []
        await held[0].in_progress()
        assert time.monotonic() - started < 5

        await anyio.to_thread.run_sync(private_nats.start)

        async def reconnected() -> bool:
            return bus.client.is_connected and api.client.is_connected

        await until(reconnected, timeout=20)
        # The stream and its unsettled message survived the restart: delivered again.
        seen: list[str] = []

        async def redelivered() -> bool:
            for delivery in await take(bus, 1.0):
                seen.append(delivery.run_id)
                await delivery.ack()
            return "run_before" in seen

        await until(redelivered, timeout=20)
        assert "run_during" not in seen  # announced while unreachable: left to the sweep
        # Dispatch and fan-out work again on the same connections.
        await api.announce_runnable(["run_after"], mark="submitted")
        [after] = await take(bus)
        assert after.run_id == "run_after"
        await after.ack()
        async with bus.watch_events("run_y") as watch:

            async def fanned_out() -> bool:
                # Core NATS hints are best-effort: one sent while a connection is still
                # settling may be lost (a follower then finds the events at its next poll).
                await api.announce_events("run_y", 3)
                return await watch.wait(0.2)

            await until(fanned_out)


# --------------------------------------------------------------------------- agent messages


async def take_messages(bus: NatsBus, seconds: float = 5.0) -> list[MessageDelivery]:
    return await bus.take_agent_messages(10, seconds)


async def dead_messages(bus: NatsBus) -> list[tuple[dict[str, str], dict[str, str]]]:
    """The agent messages in the dead-letter stream: (payload, headers)."""
    info = await bus.js.stream_info(bus.dead_stream)
    found = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        stored = await bus.js.get_msg(bus.dead_stream, seq)
        if stored.subject == bus.dead_messages_subject:
            found.append((json.loads(stored.data or b""), dict(stored.headers or {})))
    return found


def test_every_inbox_is_one_literal_subject_of_its_own() -> None:
    names = ["writer", "a", "b", "a.b", "b.c", "a.b.c", "*", ">", "a.*", "a.>", "a b", "a\tb"]
    names += ["A", "a-b", "a_b", "_" + "0" * 40, "x612e62", "\u0000", "é" * 64, "n" * 300, ""]
    names += ["ünïcødé-名前", "\ud800"]  # a lone surrogate, as a broken decoder leaves it
    subjects = {(ns, agent): inbox_subject("p", ns, agent) for ns in names for agent in names}
    assert len(set(subjects.values())) == len(subjects)  # no two inboxes share a subject
    for subject in subjects.values():
        tokens = subject.split(".")
        assert tokens[:2] == ["p", "inbox"] and len(tokens) == 4, subject
        assert all(t and t not in ("*", ">") and not re.search(r"\s", t) for t in tokens)
        assert subject.isascii() and len(subject) < 120
    assert inbox_token("writer") == "writer"  # a plain name stays readable


async def test_a_subscriber_of_one_inbox_sees_only_that_inbox(
    connect: OpenBus, nats_server_url: str
) -> None:
    bus = await connect()
    client = await nats.connect(nats_server_url)
    seen: dict[str, list[bytes]] = {}
    try:
        for name in ("a", "a.b", "*", ">"):

            async def record(msg: Msg, name: str = name) -> None:
                seen.setdefault(name, []).append(msg.data)

            await client.subscribe(bus.inbox_subject("ns", name), cb=record)
        await client.flush()
        for number, name in enumerate(("a", "a.b", "*", ">", "b")):
            await bus.send_agent_message("ns", name, f"msg_{number}")

        async def all_seen() -> bool:
            return sum(map(len, seen.values())) >= 4

        await until(all_seen)
        await anyio.sleep(0.2)  # anything misrouted would have come by now
    finally:
        await client.close()
    assert {name: [json.loads(d)["agent"] for d in data] for name, data in seen.items()} == {
        "a": ["a"],
        "a.b": ["a.b"],
        "*": ["*"],
        ">": [">"],
    }


async def test_a_message_on_an_inbox_it_does_not_name_is_terminated(
    connect: OpenBus, nats_server_url: str
) -> None:
    bus = await connect(ack_wait_seconds=1.0)
    client = await nats.connect(nats_server_url)
    try:
        js = client.jetstream()
        forged = {"id": "msg_forged", "namespace": "other", "agent": "admin"}
        await js.publish(bus.inbox_subject("ns", "writer"), json.dumps(forged).encode())
        await js.publish(bus.inbox_subject("ns", "writer"), b"\xff not json")
        await js.publish(bus.inbox_subject("ns", "writer"), b'{"id": 1, "namespace": []}')
    finally:
        await client.close()
    assert await take_messages(bus, 1.0) == []
    assert await take_messages(bus, 1.5) == []  # not delivered again either


async def test_an_agent_message_past_max_deliver_moves_to_the_dead_letters(
    connect: OpenBus,
) -> None:
    bus = await connect(ack_wait_seconds=1.0, max_deliver=2)
    await bus.send_agent_message("team", "writer", "msg_poison")
    [first] = await take_messages(bus)
    await first.nak()
    [last] = await take_messages(bus)
    assert last.last
    await last.nak()

    async def dead() -> bool:
        assert await take_messages(bus, 0.3) == []  # a pending fetch lets the server notice
        return bool(await dead_messages(bus))

    await until(dead)
    [(payload, headers)] = await dead_messages(bus)
    assert payload == {"id": "msg_poison", "namespace": "team", "agent": "writer"}
    assert headers["Corral-Message-Id"] == "msg_poison"
    assert headers["Corral-Deliveries"] == "2"
    info = await bus.js.stream_info(bus.messages_stream)
    assert info.state.messages == 0  # deleted from the inboxes
    assert await dead_letters(bus) == []  # no run dispatch among the dead letters


async def test_agent_messages_ride_out_a_nats_restart(private_nats: NatsServerProcess) -> None:
    prefix = "restart"
    async with (
        await NatsBus.connect(private_nats.url, prefix=prefix, ack_wait_seconds=1.0) as bus,
        await NatsBus.connect(private_nats.url, prefix=prefix) as sender,
    ):
        await sender.send_agent_message("team", "writer", "msg_before")
        held = await take_messages(bus)
        assert [d.message_id for d in held] == ["msg_before"]  # taken, never settled

        await anyio.to_thread.run_sync(private_nats.stop)

        async def noticed() -> bool:
            return not bus.client.is_connected and not sender.client.is_connected

        await until(noticed)
        started = time.monotonic()
        await sender.send_agent_message("team", "writer", "msg_during")  # the sweep's
        assert await bus.take_agent_messages(5, 0.3) == []
        await held[0].in_progress()
        assert time.monotonic() - started < 5

        await anyio.to_thread.run_sync(private_nats.start)
        seen: list[str] = []

        async def redelivered() -> bool:
            for delivery in await take_messages(bus, 1.0):
                seen.append(delivery.message_id)
                await delivery.ack()
            return "msg_before" in seen

        await until(redelivered, timeout=30)
        assert "msg_during" not in seen
        await sender.send_agent_message("team", "writer", "msg_after")
        [after] = await take_messages(bus)
        assert (after.message_id, after.attempt) == ("msg_after", 1)
        await after.ack()
