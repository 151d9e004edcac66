"""What only the in-process bus does with agent messages: its dead letters and its bound
(what every bus does is in ``tests/conformance/test_buses.py``)."""

from __future__ import annotations

import anyio

from corral.bus import LocalBus
from corral.bus.local import DeadLetter


async def test_a_last_delivery_nak_ed_or_left_unsettled_becomes_a_dead_letter() -> None:
    bus = LocalBus(ack_wait_seconds=0.2, max_deliver=2)
    await bus.send_agent_message("team", "writer", "msg_nak")
    await bus.send_agent_message("team", "critic", "msg_silent")
    first = await bus.take_agent_messages(10, 1.0)
    assert sorted((d.message_id, d.attempt, d.last) for d in first) == [
        ("msg_nak", 1, False),
        ("msg_silent", 1, False),
    ]
    for delivery in first:
        await delivery.nak()
    second = await bus.take_agent_messages(10, 1.0)
    assert sorted((d.message_id, d.attempt, d.last) for d in second) == [
        ("msg_nak", 2, True),
        ("msg_silent", 2, True),
    ]
    [nak_ed] = [d for d in second if d.message_id == "msg_nak"]
    await nak_ed.nak()  # msg_silent's consumer goes silent: its ack wait runs out
    assert await bus.take_agent_messages(10, 0.6) == []
    assert sorted(bus.dead_letters, key=lambda d: d.message_id) == [
        DeadLetter("msg_nak", "team", "writer", 2),
        DeadLetter("msg_silent", "team", "critic", 2),
    ]


async def test_a_stale_delivery_settles_nothing() -> None:
    bus = LocalBus(ack_wait_seconds=0.2)
    await bus.send_agent_message("team", "writer", "msg_1")
    [stale] = await bus.take_agent_messages(1, 1.0)
    [current] = await bus.take_agent_messages(1, 1.0)  # after the ack wait: delivered again
    assert current.attempt == 2
    await stale.ack()  # the old delivery no longer holds the message
    await current.in_progress()
    await anyio.sleep(0.1)
    await current.in_progress()
    assert await bus.take_agent_messages(1, 0.15) == []  # still held by the current one
    await current.ack()
    assert await bus.take_agent_messages(1, 0.4) == []


async def test_a_full_queue_drops_a_send_and_a_taker_waits_for_the_first() -> None:
    bus = LocalBus(max_queued=2)
    for number in range(3):
        await bus.send_agent_message("team", "writer", f"msg_{number}")
    taken = await bus.take_agent_messages(10, 1.0)
    assert [d.message_id for d in taken] == ["msg_0", "msg_1"]  # msg_2 is left to the sweep
    for delivery in taken:
        await delivery.ack()  # settled: room again

    async def send_later() -> None:
        await anyio.sleep(0.05)
        await bus.send_agent_message("team", "writer", "msg_late")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(send_later)
            [late] = await bus.take_agent_messages(10, 60.0)  # woken, not timed out
    assert late.message_id == "msg_late"
    assert await bus.take_agent_messages(0, 0.01) == []
