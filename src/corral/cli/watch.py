"""``-w/--watch``: a list printed once, then its items again as they change, kubectl style.

The list is read again every ``interval`` seconds (through the command's backend, so
embedded and remote watch alike, and a run changed by another process is seen): an
item that is new, or whose ``key`` changed (a run's state, attempts, steps...), is
printed again. An item that leaves the listing (a run no longer in ``--state``, an
approval no longer pending) is read once more by ``lost`` and printed as it ended.

- ``table``/``wide``: the header and rows, then one row per change, in the same
  columns (a wider cell widens the columns of the rows after it);
- ``json``: one compact document per line (JSON Lines); ``yaml``: documents after
  ``---``; ``name``: ``kind/name`` lines.

Ctrl-C, or ``--watch-timeout`` seconds, ends the watch with exit 0.
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

import typer

from corral.cli.output import View, dumps_json, dumps_yaml, no_resources, table_lines
from corral.cli.output import terminal_width as _terminal_width

if TYPE_CHECKING:
    import anyio

T = TypeVar("T")

#: how often a watch reads the list again, unless told (modest: one small query)
DEFAULT_INTERVAL = 1.0
#: the bounds of ``--watch-interval``
MIN_INTERVAL = 0.1
MAX_INTERVAL = 3600.0


@dataclass
class _Printer(Generic[T]):
    """Prints a watch's items in one format; table rows keep the first rows' columns."""

    view: View[T]
    output: str
    namespace: str | None
    rows: list[list[str]] = field(default_factory=list[list[str]])

    def print(self, items: Sequence[T], *, first: bool = False) -> None:
        if not items:
            if first and self.output in ("table", "wide"):
                no_resources(self.namespace)
            return
        if self.output == "json":
            lines = [dumps_json(self.view.document(i), indent=None) for i in items]
        elif self.output == "yaml":
            lines = [f"---\n{dumps_yaml(self.view.document(i))}" for i in items]
        elif self.output == "name":
            lines = self.view.names(items)
        else:
            lines = self._rows(items)
        typer.echo("\n".join(lines))

    def _rows(self, items: Sequence[T]) -> list[str]:
        columns = [c for c in self.view.columns if self.output == "wide" or not c.wide]
        new = [[c.cell(item) for c in columns] for item in items]
        header = not self.rows
        self.rows += new
        lines = table_lines(
            [c.header for c in columns],
            self.rows,
            free_text=[c.free_text for c in columns],
            width=_terminal_width(),
        )
        return lines if header else lines[-len(new) :]


async def watch(
    view: View[T],
    fetch: Callable[[], Awaitable[Sequence[T]]],
    key: Callable[[T], Hashable],
    output: str,
    *,
    namespace: str | None,
    lost: Callable[[list[T]], Awaitable[Sequence[T]]] | None = None,
    interval: float = DEFAULT_INTERVAL,
    seconds: float | None = None,
) -> None:
    """Print ``fetch()``'s items, then each item again when it is new or its ``key``
    changes, until Ctrl-C or for ``seconds`` (see the module's docstring)."""
    import anyio  # here: `corral --help` imports this module, never needs anyio

    printer = _Printer(view, output, namespace)
    stop = anyio.Event()
    with _interrupt_sets(stop), anyio.move_on_after(seconds):
        items = list(await fetch())
        printer.print(items, first=True)
        seen: dict[str, Hashable] = {view.name(i): key(i) for i in items}
        while True:
            with anyio.move_on_after(interval):
                await stop.wait()
            if stop.is_set():
                break
            now = list(await fetch())
            listed = {view.name(i) for i in now}
            gone = [i for i in items if view.name(i) not in listed and view.name(i) in seen]
            if gone and lost is not None:
                now += await lost(gone)  # how they ended: printed if they changed
            changed = [i for i in now if seen.get(view.name(i), _NEVER) != key(i)]
            seen = {view.name(i): key(i) for i in now if view.name(i) in listed}
            items = [i for i in now if view.name(i) in listed]
            printer.print(changed)


_NEVER = object()


@contextmanager
def _interrupt_sets(stop: anyio.Event) -> Iterator[None]:
    """Within the block, SIGINT (Ctrl-C) sets ``stop`` instead of raising (where a signal
    handler can be set: the main thread of a running loop; elsewhere Ctrl-C interrupts)."""
    import asyncio

    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, stop.set)
    except (RuntimeError, ValueError, NotImplementedError):
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)


#: ``-w``, ``--watch-timeout`` and ``--watch-interval`` of a list command
WATCH = typer.Option(False, "-w", "--watch", help="After the list, print items as they change.")
WATCH_TIMEOUT = typer.Option(
    None,
    "--watch-timeout",
    min=0.0,
    help="End the watch after this many seconds (exit 0); default: until Ctrl-C.",
)
WATCH_INTERVAL = typer.Option(
    DEFAULT_INTERVAL,
    "--watch-interval",
    min=MIN_INTERVAL,
    max=MAX_INTERVAL,
    help="Seconds between two reads of the list.",
)
