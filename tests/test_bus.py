"""The in-process bus: wake-ups are hints that arrive once and never block past a timeout."""

from __future__ import annotations

import time

import anyio

from corral.bus import LocalBus


async def test_an_event_watch_fires_once_per_announcement_and_only_for_its_run() -> None:
    bus = LocalBus()
    async with bus.watch_events("run_1") as watch, bus.watch_events("run_2") as other:
        await bus.announce_events("run_1", 3)  # before the wait: not lost
        assert await watch.wait(5) is True
        assert await watch.wait(0.01) is False  # consumed
        assert await other.wait(0.01) is False

        async def announce_later() -> None:
            await anyio.sleep(0.05)
            await bus.announce_events("run_1", 4)

        async with anyio.create_task_group() as group:
            group.start_soon(announce_later)
            started = time.monotonic()
            assert await watch.wait(5) is True
        assert time.monotonic() - started < 2


async def test_runnable_announcements_wake_a_waiter_and_timeouts_return() -> None:
    bus = LocalBus()
    started = time.monotonic()
    await bus.wait_runnable(0.05)  # nothing announced: returns at the timeout
    assert 0.04 <= time.monotonic() - started < 2
    await bus.announce_runnable(["run_1"])
    started = time.monotonic()
    await bus.wait_runnable(5)
    assert time.monotonic() - started < 1
    await bus.announce_runnable([])  # nothing runnable: no wake-up
    started = time.monotonic()
    await bus.wait_runnable(0.05)
    assert time.monotonic() - started >= 0.04
