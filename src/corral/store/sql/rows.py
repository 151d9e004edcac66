"""Rows <-> records for the SQL store, for both of its paths (SQLAlchemy and the SQLite
fast path): runs, run events, approvals, sessions, session messages, API tokens,
memory entries, agent messages, and resources.

A record's columns are its own fields (:class:`RecordRows`); the few fields not
stored as themselves (enums, nested records kept as JSON) are listed in the table
below each record. Messages, usage and pending approvals go through the one
serializer of :mod:`corral.core.messages` (``dump``/``load``), as JSON columns.
"""

from __future__ import annotations

import dataclasses
import json
import operator
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import sqlalchemy as sa
from pydantic import ValidationError

from corral.core.agent_messages import AgentMessage, MessageState
from corral.core.errors import ConfigurationError
from corral.core.events import Event, parse_event_data
from corral.core.memory import MemoryEntry
from corral.core.messages import Message, Usage, dump, dump_messages, load, load_messages
from corral.core.runs import Approval, ApprovalState, PendingApproval, RunRecord, RunState
from corral.core.sessions import Session, SessionMessage
from corral.core.tokens import ApiToken, Role
from corral.resources.kinds import API_VERSION, SPEC_TYPES, STORED, Metadata, Resource, Spec
from corral.store import schema
from corral.store.base import StoredResource

R = TypeVar("R")


class Columns(Protocol):
    """A row read by either SQL path, its columns as attributes: a SQLAlchemy ``Row``, or
    a row of the SQLite fast path (:class:`corral.store.sqlite.DecodedRow`)."""

    def __getattr__(self, name: str) -> Any: ...


def _json_encoder() -> Callable[[Any], str]:
    """``json.dumps`` with its default options, built once.

    ``json.dumps`` builds its C encoder anew on every call, which costs as much
    as encoding the small values stored here (a run stores a dozen). The one
    difference: no check for circular references, which values made of JSON
    data (as everything stored here is) cannot have.
    """
    plain = json.JSONEncoder(check_circular=False)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # an interpreter without the C accelerator
        return plain.encode
    encode = make(
        None,  # markers: no circular check
        plain.default,
        json.encoder.encode_basestring_ascii,
        None,  # indent
        ": ",
        ", ",
        False,  # sort_keys
        False,  # skipkeys
        True,  # allow_nan
    )

    def dumps(value: Any) -> str:
        return "".join(encode(value, 0))

    return dumps


#: JSON as SQLAlchemy's JSON type stores it (``None`` as ``null``), for the fast path.
dumps = _json_encoder()


def loads(text: str) -> Any:
    """``json.loads``, with the two texts most JSON columns hold (an empty run's) spared it."""
    if text == "null":
        return None
    if text == "[]":
        return []
    return json.loads(text)


class Stored(NamedTuple):
    """How a record's field is stored when not as itself: both directions."""

    to_column: Callable[[Any], Any]
    from_column: Callable[[Any], Any]


def _as_json(tp: Any) -> Stored:
    """A field of type ``tp`` kept as JSON by the serializer of :mod:`corral.core.messages`."""
    return Stored(dump, lambda data: load(tp, data))


def _as_value(enum: type[StrEnum]) -> Stored:
    """An enum field kept as its value (a plain string given for it is checked)."""

    def value(member: Any) -> str:
        # A member's str() is its value (StrEnum), and cheaper to get than .value.
        return str(member) if type(member) is enum else enum(member).value

    return Stored(value, enum)


def _composed(first: Callable[[Any], Any], second: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: second(first(value))


Step = tuple[int, Callable[[Any], Any]]


class RecordRows(Generic[R]):
    """The rows of one table for one dataclass record, from the record's own fields.

    A column holds the field of the same name unless ``renamed`` says otherwise;
    ``stored`` converts the fields not stored as themselves. ``extra`` names the
    columns that are not the record's (where it is kept, given with each row). The
    table and the record are checked against each other when this is built: a field
    without a column, or a column without a field, fails at import. Adding a field
    to a record is that edit, plus its column and a migration.

    Rows come in two shapes. :meth:`values` is a dict for SQLAlchemy, which encodes
    JSON and booleans itself; :meth:`params` is the SQLite fast path's positional
    parameters in table order, JSON as text. :meth:`record` reads a row of either
    path back (``text`` for the fast path's), its columns in table order as
    ``select(table)`` and ``RETURNING`` of every column give them.
    """

    def __init__(
        self,
        record: type[R],
        table: sa.Table,
        *,
        stored: Mapping[str, Stored] | None = None,
        renamed: Mapping[str, str] | None = None,
        extra: Sequence[str] = (),
    ) -> None:
        renamed = renamed or {}
        field_names = [f.name for f in dataclasses.fields(record)]  # type: ignore[arg-type]
        field_of = {renamed.get(name, name): name for name in field_names}
        self.table = table
        self.columns = tuple(c.name for c in table.columns)
        if sorted(self.columns) != sorted([*field_of, *extra]):
            raise TypeError(
                f"table {table.name} has columns {sorted(self.columns)} but "
                f"{record.__name__} has {sorted([*field_of, *extra])}: "
                "a new field needs its column (and a migration)"
            )
        how = {renamed.get(name, name): way for name, way in (stored or {}).items()}
        json_columns = {c.name for c in table.columns if isinstance(c.type, sa.JSON)}
        flags = {c.name for c in table.columns if isinstance(c.type, sa.Boolean)}
        self._record = record
        self._extra = tuple(extra)
        self._own = tuple(c for c in self.columns if c in field_of)
        self._fields = tuple(field_of[c] for c in self._own)
        self._get = operator.attrgetter(*self._fields)
        # Each conversion as (index in the row, function), worked out once per table.
        at = {c: i for i, c in enumerate(self._own)}
        self._to_values: list[Step] = [(at[c], how[c].to_column) for c in self._own if c in how]
        self._to_params: list[Step] = []
        self._from_values: list[Step] = [
            (i, how[c].from_column) for i, c in enumerate(self.columns) if c in how
        ]
        self._from_text: list[Step] = []
        for i, column in enumerate(self.columns):
            way = how.get(column)
            if column in json_columns:
                self._from_text.append(
                    (i, loads if way is None else _composed(loads, way.from_column))
                )
            elif column in flags:
                self._from_text.append(
                    (i, bool if way is None else _composed(bool, way.from_column))
                )
            elif way is not None:
                self._from_text.append((i, way.from_column))
            if column in at:
                if column in json_columns:
                    self._to_params.append(
                        (at[column], dumps if way is None else _composed(way.to_column, dumps))
                    )
                elif way is not None:
                    self._to_params.append((at[column], way.to_column))
        # Where the record's own columns sit in a full row (extra columns left out).
        self._mine = operator.itemgetter(*(i for i, c in enumerate(self.columns) if c in at))

    def values(self, record: R, **extra: Any) -> dict[str, Any]:
        """Every column of ``record``'s row, for SQLAlchemy; ``extra`` gives the others."""
        values = list(self._get(record))
        for i, convert in self._to_values:
            values[i] = convert(values[i])
        row = dict(zip(self._own, values, strict=True))
        if extra:
            row.update(extra)
        return row

    def params(self, record: R, **extra: Any) -> list[Any]:
        """Every column of ``record``'s row in table order, for the SQLite fast path."""
        values = list(self._get(record))
        for i, convert in self._to_params:
            values[i] = convert(values[i])
        if not self._extra:
            return values
        by_column = dict(zip(self._own, values, strict=True)) | extra
        return [by_column[c] for c in self.columns]

    def record(self, row: Sequence[Any], *, text: bool = False) -> R:
        """The record of a full row, its columns in table order; ``text``: a row of the
        fast path (JSON as text, booleans as integers)."""
        values = list(row)
        for i, convert in self._from_text if text else self._from_values:
            value = values[i]
            if value is not None:
                values[i] = convert(value)
        if self._extra:
            values = list(self._mine(values))
        return self._record(**dict(zip(self._fields, values, strict=True)))


RUNS = RecordRows(
    RunRecord,
    schema.runs,
    renamed={"pending_approvals": "pending"},
    stored={
        "state": _as_value(RunState),
        "output": Stored(dump, lambda data: data),
        "usage": _as_json(Usage),
        "messages": Stored(dump_messages, load_messages),
        "pending_approvals": _as_json(list[PendingApproval]),
    },
)


class EventRows:
    """The rows of ``run_events`` (as :class:`RecordRows` gives a record's): an event's
    ``type`` column comes from its payload's class, its ``data`` column is the payload's
    JSON object, and a row is read back through the payload class of its type."""

    table = schema.run_events
    columns = ("run_id", "seq", "type", "ts", "data")

    def __init__(self) -> None:
        if tuple(c.name for c in self.table.columns) != self.columns:
            raise TypeError(f"run_events has columns {[c.name for c in self.table.columns]}")

    def values(self, event: Event) -> dict[str, Any]:
        """Every column of ``event``'s row, for SQLAlchemy."""
        return {
            "run_id": event.run_id,
            "seq": event.seq,
            "type": str(event.data.TYPE),
            "ts": event.ts,
            "data": event.data.to_dict(),
        }

    def params(self, event: Event) -> list[Any]:
        """Every column of ``event``'s row in table order, for the SQLite fast path."""
        return [
            event.run_id,
            event.seq,
            str(event.data.TYPE),
            event.ts,
            dumps(event.data.to_dict()),
        ]

    def record(self, row: Sequence[Any], *, text: bool = False) -> Event:
        """The event of a full row (``text``: the fast path's, its JSON as text)."""
        run_id, seq, kind, ts, data = row
        payload = parse_event_data(kind, loads(data) if text else data)
        return Event(run_id, seq, payload, ts)


EVENTS = EventRows()
APPROVALS = RecordRows(Approval, schema.approvals, stored={"state": _as_value(ApprovalState)})
SESSIONS = RecordRows(Session, schema.sessions)
SESSION_MESSAGES = RecordRows(
    SessionMessage,
    schema.session_messages,
    stored={"message": _as_json(Message)},
    extra=("namespace", "session_id", "position"),
)
TOKENS = RecordRows(ApiToken, schema.api_tokens, stored={"role": _as_value(Role)})
AGENT_MESSAGES = RecordRows(
    AgentMessage,
    schema.agent_messages,
    stored={"state": _as_value(MessageState), "payload": Stored(dump, lambda data: data)},
)
# The id is the full-text index's row id, the store's own: entries are named by their key.
MEMORY_ENTRIES = RecordRows(MemoryEntry, schema.memory_entries, extra=("id",))


def spec_json(spec: Spec) -> dict[str, Any]:
    """A resource spec as stored (JSON)."""
    return spec.model_dump(mode="json")


def row_to_stored(row: Columns) -> StoredResource:
    """A stored resource from a ``resources`` row; ``ConfigurationError`` if it no longer validates."""
    spec_type = SPEC_TYPES.get(row.kind)
    if spec_type is None:
        raise ConfigurationError(f"stored resource {row.kind}/{row.name} has an unknown kind")
    try:
        spec = spec_type.model_validate(row.spec, context=STORED)
        metadata = Metadata(name=row.name, namespace=row.namespace, labels=row.labels)
    except ValidationError as exc:
        raise ConfigurationError(
            f"stored {row.kind} {row.name!r} in namespace {row.namespace!r} is no longer valid: {exc}"
        ) from exc
    resource = Resource(apiVersion=API_VERSION, kind=row.kind, metadata=metadata, spec=spec)
    return StoredResource(resource, row.generation, row.created_at, row.updated_at)
