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
from typing import TYPE_CHECKING, Generic, TypeVar

import typer

from corral.cli.output import View, dumps_json, dumps_yaml, no_resources

if TYPE_CHECKING:
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
def interrupt_sets(stop: anyio.Event) -> Iterator[None]:
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


async def watch(
    spec: Watch[T], first: Sequence[T], *, stop: anyio.Event, seconds: float | None = None
) -> None:
    """Poll until ``stop`` is set or for ``seconds`` (when given); ``first`` is what was
    printed already. ``stop`` is set by the caller's Ctrl-C handler (:func:`interrupt_sets`),
    installed before the first list is printed so that a Ctrl-C right after it is never lost."""
    import anyio  # here: `corral --help` imports this module and never needs anyio

    seen = {spec.key(item): (spec.version(item), item) for item in first}
    with anyio.move_on_after(seconds):
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


# --------------------------------------------------------------------------- printing

#: ``-w``, ``--watch-timeout`` and ``--watch-interval`` of ``tasks list`` and ``approvals list``
WATCH = typer.Option(False, "-w", "--watch", help="After the list, print items as they change.")
WATCH_TIMEOUT = typer.Option(
    None, "--watch-timeout", min=0.0, help="Stop watching after this many seconds (exit 0)."
)
WATCH_INTERVAL = typer.Option(
    INTERVAL, "--watch-interval", min=0.05, max=3600.0, help="Seconds between two looks."
)


def printer(view: View[T], output: str) -> Callable[[Sequence[T]], None]:
    """Prints a watch's items as ``-o`` asks: table rows in the columns of the rows before
    them (the header once), JSON Lines, YAML documents after ``---``, or names."""
    shown: list[T] = []  # every row printed: later rows line up with them

    def show(items: Sequence[T]) -> None:
        if output == "json":
            typer.echo("\n".join(dumps_json(view.document(i), indent=None) for i in items))
        elif output == "yaml":
            typer.echo("\n".join("---\n" + dumps_yaml(view.document(i)) for i in items))
        elif output == "name":
            typer.echo("\n".join(view.names(items)))
        else:
            lines = view.table([*shown, *items], output == "wide")
            typer.echo("\n".join(lines[-len(items) :] if shown else lines))
            shown.extend(items)

    return show


async def watch_list(
    view: View[T],
    listing: Callable[[], Awaitable[list[T]]],
    key: Callable[[T], str],
    version: Callable[[T], Hashable],
    output: str,
    *,
    namespace: str | None,
    ended: Callable[[list[T]], Awaitable[list[T]]],
    interval: float = INTERVAL,
    seconds: float | None = None,
) -> None:
    """``-w`` of a list whose items may leave it (a run no longer in ``--state``, an
    approval decided): the list, then its changes; an item that left is read once by
    ``ended`` and shown as it ended, then stays as it was (not shown again as gone)."""
    import anyio

    show = printer(view, output)
    stop = anyio.Event()
    left: dict[str, T] = {}

    async def fetch() -> list[T]:
        now = await listing()
        keys = {key(i) for i in now}
        gone = [item for k, item in previous.items() if k not in keys]
        if gone:
            left.update({key(item): item for item in await ended(gone)})
        for k in keys:
            left.pop(k, None)  # back in the list
        previous.clear()
        previous.update({key(i): i for i in now})
        return [*now, *left.values()]

    with interrupt_sets(stop):  # from before the list is printed: no Ctrl-C is lost
        first = await listing()
        if first:
            show(first)
        elif output in ("table", "wide"):
            no_resources(namespace)
        previous = {key(i): i for i in first}
        await watch(Watch(fetch, key, version, show, interval), first, seconds=seconds, stop=stop)
