"""The clock seam (core/clock.py) and the fake clock the runtime's tests advance."""

from __future__ import annotations

import anyio

from corral.core.clock import SYSTEM_CLOCK, move_on_after
from fake_clock import FakeClock


def test_a_fake_clock_fires_its_timers_in_order_each_at_its_own_time() -> None:
    clock = FakeClock()
    fired: list[tuple[str, float]] = []
    for name, seconds in [("c", 0.3), ("a", 0.1), ("b", 0.2), ("never", 0.2)]:
        timer = clock.call_later(seconds, lambda n=name: fired.append((n, clock.monotonic())))
    timer.cancel()  # the last one's
    clock.advance(0.15)
    assert fired == [("a", 0.1)]
    before = clock.now()
    clock.advance(1.0)
    assert fired == [("a", 0.1), ("b", 0.2), ("c", 0.3)]
    assert clock.monotonic() == 1.15 and clock.now() - before >= 1.0  # wall time moved too


async def test_a_sleep_on_a_fake_clock_ends_when_the_clock_is_advanced_past_it() -> None:
    clock = FakeClock()
    woke = anyio.Event()

    async def sleeper() -> None:
        await clock.sleep(5.0)
        woke.set()

    async with anyio.create_task_group() as group:
        group.start_soon(sleeper)
        await clock.sleeping()
        clock.advance(4.9)
        assert clock.pending == 1 and not woke.is_set()
        clock.advance(0.1)
        with anyio.fail_after(5):
            await woke.wait()
    assert clock.pending == 0


async def test_move_on_after_ends_its_block_when_the_time_passed_on_its_clock() -> None:
    clock = FakeClock()
    caught = anyio.Event()

    async def wait_forever() -> None:
        with move_on_after(clock, 2.0) as scope:
            await anyio.sleep_forever()
        assert scope.cancelled_caught
        caught.set()

    async with anyio.create_task_group() as group:
        group.start_soon(wait_forever)
        await clock.sleeping()
        clock.advance(2.0)
        with anyio.fail_after(5):
            await caught.wait()
    with move_on_after(SYSTEM_CLOCK, 0.01) as real:  # the system clock's: real time
        await anyio.sleep_forever()
    assert real.cancelled_caught


async def test_a_sleep_whose_time_already_passed_returns_at_once_on_either_clock() -> None:
    # (a paced loop asks for the rest of its period, less than nothing after a slow round)
    with anyio.fail_after(5):
        await SYSTEM_CLOCK.sleep(-0.5)
        await FakeClock().sleep(-0.5)
