"""The CLI's one output layer: ``-o table|wide|json|yaml|name`` for every read command.

- ``table`` and ``wide``: one renderer in kubectl's style: upper-case headers, columns
  three spaces apart, no borders; ``wide`` adds columns. A cell is one line (runs of
  whitespace become a space) and nothing wraps. In a terminal, free-text cells
  (arguments, reasons, errors) are shortened with ``…`` to fit its width; piped, no
  cell is shortened, so a line is as long as it needs (an id is never cut or split).
  Times are ages (``3m``; ``3m ago`` where the header is not ``AGE``).
- ``json`` and ``yaml``: the API's bodies, with their timestamps as RFC 3339 text
  (UTC, milliseconds: ``2026-11-26T23:14:05.123Z``) where the HTTP API sends epoch
  seconds; a list is a JSON/YAML sequence.
- ``name``: ``kind/name`` per line (``task/run_...``), kubectl's ``-o name``.

An empty list prints ``No resources found in NS namespace.`` on stderr and nothing on
stdout (``[]`` in json and yaml).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import TYPE_CHECKING, Any, Generic, TypeVar, get_args

import typer

from corral.cli.common import EXIT_BAD_INPUT, fail, printable

if TYPE_CHECKING:
    from pydantic import BaseModel

T = TypeVar("T")

#: every read command's formats
FORMATS = ("table", "wide", "json", "yaml", "name")
#: what a command that changes something prints besides its one-line report
CHANGE_FORMATS = ("json", "yaml", "name")
#: columns of a table
GAP = "   "
#: the narrowest a free-text column is shortened to, in a terminal
MIN_TEXT = 12


def check_output(value: str | None, formats: Sequence[str] = FORMATS) -> str | None:
    """``value`` when it is one of ``formats``, else a clear error and exit 2."""
    if value is not None and value not in formats:
        fail(
            f"unknown output format {value!r} (use {', '.join(formats[:-1])} or {formats[-1]})",
            EXIT_BAD_INPUT,
        )
    return value


def output_option(default: str | None = "table", formats: Sequence[str] = FORMATS) -> Any:
    """The ``-o/--output`` option of a command, checked as it is parsed."""
    shown = ", ".join(formats)

    def check(value: str | None) -> str | None:
        return check_output(value, formats)

    return typer.Option(default, "-o", "--output", help=f"Output format: {shown}.", callback=check)


# --------------------------------------------------------------------------- times


def rfc3339(timestamp: float) -> str:
    """Epoch seconds as RFC 3339 in UTC with milliseconds: ``2026-11-26T23:14:05.123Z``."""
    moment = datetime.fromtimestamp(timestamp, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def age(seconds: float) -> str:
    """A duration as kubectl shows ages: ``45s``, ``12m``, ``5h``, ``3d``."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "m" else 1):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def age_of(timestamp: float | None, now: float | None = None) -> str:
    """The age of a moment (``3m``), ``<none>`` when there is none."""
    if timestamp is None:
        return "<none>"
    return age((time.time() if now is None else now) - timestamp)


def ago(timestamp: float | None, now: float | None = None) -> str:
    """``3m ago`` (``in 5m`` for a moment to come), ``<none>`` when there is none."""
    if timestamp is None:
        return "<none>"
    delta = (time.time() if now is None else now) - timestamp
    return f"{age(delta)} ago" if delta >= 0 else f"in {age(-delta)}"


def when(timestamp: float | None) -> str:
    """A moment for a human: ``2026-11-26T23:14:05.123Z (3m ago)``."""
    if timestamp is None:
        return "<none>"
    return f"{rfc3339(timestamp)} ({ago(timestamp)})"


# --------------------------------------------------------------------------- documents


@cache
def _timestamp_fields(model: type[BaseModel]) -> frozenset[str]:
    """The fields of a body typed :data:`corral.api.common.Timestamp` (optional or not)."""
    from corral.api.common import Timestamp

    description = get_args(Timestamp)[1].description
    return frozenset(
        name
        for name, info in model.model_fields.items()
        # a required Timestamp is merged into its field; an optional one stays in the union
        if (info.annotation is float and info.description == description)
        or Timestamp in get_args(info.annotation)
    )


def document(body: BaseModel) -> Any:
    """An API body as ``-o json|yaml`` shows it: the body's JSON with RFC 3339 times."""
    return _convert(body, body.model_dump(mode="json"))


def _convert(body: Any, data: Any) -> Any:
    from pydantic import BaseModel

    if isinstance(body, BaseModel) and isinstance(data, dict):
        stamps = _timestamp_fields(type(body))
        for key in list(data):
            value = getattr(body, key, None)
            if key in stamps and isinstance(value, int | float):
                data[key] = rfc3339(value)
            elif isinstance(value, BaseModel | list):
                data[key] = _convert(value, data[key])
    elif isinstance(body, list) and isinstance(data, list):
        return [_convert(b, d) for b, d in zip(body, data, strict=True)]
    return data


def dumps_json(data: Any, *, indent: int | None = 2) -> str:
    return json.dumps(data, indent=indent, ensure_ascii=False)


def dumps_yaml(data: Any) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip()


# --------------------------------------------------------------------------- tables


def one_line(text: str) -> str:
    """A cell's text on one line, terminal control characters made harmless."""
    return " ".join(printable(text).split())


def _width(text: str) -> int:
    from rich.cells import cell_len

    return cell_len(text)


def _fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` terminal cells, ending in ``…`` when cut."""
    if _width(text) <= width:
        return text
    from rich.cells import set_cell_size

    return set_cell_size(text, width - 1) + "…"


def _pad(text: str, width: int) -> str:
    return text + " " * (width - _width(text))


def terminal_width() -> int | None:
    """The terminal's width when stdout is one; ``None`` when piped (nothing is cut)."""
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns


def table_lines(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    free_text: Sequence[bool] | None = None,
    width: int | None = None,
) -> list[str]:
    """The one table renderer: a header row and a row per item, columns three spaces apart.

    With ``width``, the free-text columns (from the right) are shortened until the
    lines fit, no narrower than :data:`MIN_TEXT`; the other columns (ids, names,
    states) are never cut.
    """
    cells = [[one_line(c) for c in row] for row in rows]
    widths = [max([_width(h), *(_width(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    if width is not None and free_text is not None:
        excess = sum(widths) + len(GAP) * (len(widths) - 1) - width
        for i in reversed(range(len(widths))):
            if excess <= 0:
                break
            if free_text[i]:
                floor = max(MIN_TEXT, _width(headers[i]))
                cut = min(excess, max(0, widths[i] - floor))
                widths[i] -= cut
                excess -= cut
        cells = [[_fit(c, widths[i]) for i, c in enumerate(row)] for row in cells]
    return [
        GAP.join(_pad(c, widths[i]) for i, c in enumerate(row)).rstrip()
        for row in [list(headers), *cells]
    ]


@dataclass(frozen=True)
class Column(Generic[T]):
    """A column of a table: its header and how an item makes its cell."""

    header: str
    cell: Callable[[T], str]
    #: only with ``-o wide``
    wide: bool = False
    #: free text: shortened to fit a terminal (never an id or a name)
    free_text: bool = False


@dataclass(frozen=True)
class View(Generic[T]):
    """How one kind of item is shown in every format."""

    #: the ``-o name`` kind: ``task``, ``approval``, ``agent``...
    kind: Callable[[T], str]
    name: Callable[[T], str]
    columns: Sequence[Column[T]]
    #: the ``-o json|yaml`` form of an item when it is not :func:`document` of its body
    shown_as: Callable[[T], Any] | None = None

    def document(self, item: T) -> Any:
        """The ``-o json|yaml`` form of an item (its API body with RFC 3339 times)."""
        return self.shown_as(item) if self.shown_as is not None else document(item)  # type: ignore[arg-type]

    def table(self, items: Sequence[T], wide: bool) -> list[str]:
        chosen = [c for c in self.columns if wide or not c.wide]
        return table_lines(
            [c.header for c in chosen],
            [[c.cell(item) for c in chosen] for item in items],
            free_text=[c.free_text for c in chosen],
            width=terminal_width(),
        )

    def names(self, items: Sequence[T]) -> list[str]:
        return [f"{self.kind(item)}/{self.name(item)}" for item in items]


def no_resources(namespace: str | None) -> None:
    """kubectl's line for an empty list, on stderr."""
    where = f" in {namespace} namespace" if namespace else ""
    typer.echo(f"No resources found{where}.", err=True)


def print_list(view: View[T], items: Sequence[T], output: str, *, namespace: str | None) -> None:
    """A list of items in the chosen format (``namespace``: the empty list's message)."""
    if output == "json":
        typer.echo(dumps_json([view.document(item) for item in items]))
    elif output == "yaml":
        typer.echo(dumps_yaml([view.document(item) for item in items]))
    elif not items:
        no_resources(namespace)
    elif output == "name":
        typer.echo("\n".join(view.names(items)))
    else:
        typer.echo("\n".join(view.table(items, output == "wide")))


def print_one(view: View[T], item: T, output: str) -> None:
    """One item in the chosen format."""
    if output == "json":
        typer.echo(dumps_json(view.document(item)))
    elif output == "yaml":
        typer.echo(dumps_yaml(view.document(item)))
    elif output == "name":
        typer.echo(view.names([item])[0])
    else:
        typer.echo("\n".join(view.table([item], output == "wide")))


def print_change(view: View[T], items: Sequence[T], output: str, *, many: bool = False) -> None:
    """What a change did (``apply``, ``submit``, ``cancel``, ``approve``) as ``-o`` asks;
    ``many``: a list even of one item (``apply``)."""
    if output == "name":
        typer.echo("\n".join(view.names(items)))
    elif many:
        print_list(view, items, output, namespace=None)
    else:
        print_one(view, items[0], output)
