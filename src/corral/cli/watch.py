"""``-w/--watch``: print a list, then its items again as they change, until Ctrl-C.

The loop polls (:data:`INTERVAL` seconds apart) rather than following an event stream:
resources have no stream, and one cheap list query a second is what a terminal needs.
Ctrl-C ends a watch normally (exit 0, as kubectl's), and so does ``--watch-timeout``.
Shared by every command that watches (a key and a version say when an item changed).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Awaitable, Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import anyio

T = TypeVar("T")

#: seconds between two looks at the list
INTERVAL = 1.0


@dataclass
class Watch(Generic[T]):
    """What a watch polls and how it tells items apart and changed."""

    #: the items now
    fetch: Callable[[], Awaitable[list[T]]]
    #: what identifies an item across polls
    key: Callable[[T], Hashable]
    #: what changes when the item does
    version: Callable[[T], Hashable]
    #: prints the items that changed (new, updated or gone, in the order seen)
    show: Callable[[Sequence[T]], None]
    interval: float = INTERVAL


@contextlib.contextmanager
def _interrupt_sets(stop: anyio.Event) -> Iterator[None]:
    """Ctrl-C sets ``stop`` (instead of raising KeyboardInterrupt) while in the block."""
    import asyncio

    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, stop.set)
    except (RuntimeError, ValueError, NotImplementedError):  # not the main thread, not Unix
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)


async def watch(spec: Watch[T], first: Sequence[T], *, seconds: float | None = None) -> None:
    """Poll until Ctrl-C or for ``seconds`` (when given); ``first`` is what was printed already."""
    seen = {spec.key(item): (spec.version(item), item) for item in first}
    stop = anyio.Event()
    with _interrupt_sets(stop), anyio.move_on_after(seconds):
        while True:
            with anyio.move_on_after(spec.interval):
                await stop.wait()
            if stop.is_set():
                return
            now = await spec.fetch()
            changed = [
                item for item in now if seen.get(spec.key(item), (None,))[0] != spec.version(item)
            ]
            current = {spec.key(item) for item in now}
            gone = [item for key, (_, item) in seen.items() if key not in current]
            seen = {spec.key(item): (spec.version(item), item) for item in now}
            if changed or gone:
                spec.show([*changed, *gone])
