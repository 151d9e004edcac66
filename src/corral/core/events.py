"""Run events: the ordered, numbered record of what a run did - the journal.

The engine emits events through an :class:`EventSink`; whoever runs the engine
decides where they go (the store, a terminal, an SSE stream). Sequence numbers
start at 1 and have no gaps within a run.

Each event type has one frozen payload class (``RunStartData``, ``ToolCallData``,
...), and :data:`AnyEventData` is their union, discriminated by ``TYPE``: emitters
construct a payload, readers ``match`` on ``event.data``. The stored and wire form
of a payload is a JSON object (:meth:`EventData.to_dict`), its keys in the order
the fields are declared here:

- a field without a default is always present (``null`` where its type allows);
- a field with a default is *optional*: present only when it has a value, so an
  absent optional field and a ``null`` one read the same (:meth:`EventData.from_dict`).

Journals written before a field existed lack it; that is why every field added to
a payload after its first release is optional. docs/api.md's event table is
generated from these classes (:func:`event_table`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Self, TypeVar

#: a JSON object as an event carries it (a message, usage, an error, a spec)
JsonObject = dict[str, Any]


class EventType(StrEnum):
    """Every event type a run can emit."""

    RUN_START = "run.start"
    STEP_START = "step.start"
    TEXT_DELTA = "text.delta"
    TOOL_CALL = "tool.call"
    TOOL_RESULT = "tool.result"
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_RESOLVED = "approval.resolved"
    CHILD_START = "child.start"
    CHILD_FINISH = "child.finish"
    MESSAGE_SEND = "message.send"
    MESSAGE_DELIVER = "message.deliver"
    BRANCH_JOIN = "branch.join"
    HANDOFF = "handoff"
    MESSAGE_CREATE = "message.create"
    MEMORY_WRITE = "memory.write"
    MEMORY_SEARCH = "memory.search"
    STEP_FINISH = "step.finish"
    RUN_FINISH = "run.finish"
    ERROR = "error"
    #: something the run's reader should know that does not stop it (``code``, ``message``),
    #: said once per run: ``usage_estimated`` (a provider reported no token usage)
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class _Key:
    """How one field of a payload is stored: its attribute, its JSON key, and whether
    it is written when it has no value (a field without a default)."""

    attr: str
    key: str
    always: bool


class EventData:
    """The payload of one event type (a frozen dataclass of its own below)."""

    __slots__ = ()
    TYPE: ClassVar[EventType]
    #: the payload's fields in order, worked out once per class (see :func:`_payload`)
    _keys: ClassVar[tuple[_Key, ...]] = ()

    def to_dict(self) -> JsonObject:
        """The JSON object stored and sent for this payload (optional fields without a
        value left out)."""
        out: JsonObject = {}
        for k in self._keys:
            value = getattr(self, k.attr)
            if k.always or value is not None:
                out[k.key] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """The payload of a stored or received JSON object; ``ValueError`` when a field
        without a default is missing. Keys no field names are ignored."""
        values = {k.attr: data[k.key] for k in cls._keys if k.key in data}
        missing = [k.key for k in cls._keys if k.always and k.attr not in values]
        if missing:
            raise ValueError(f"a {cls.TYPE} event lacks {', '.join(missing)}")
        return cls(**values)


_PAYLOADS: dict[EventType, type[EventData]] = {}
_P = TypeVar("_P", bound=EventData)


def _payload(cls: type[_P]) -> type[_P]:
    """Register a payload class: its stored keys (a field's ``key`` metadata names a
    JSON key that is not a Python name, e.g. ``from``)."""
    cls._keys = tuple(
        _Key(
            f.name,
            str(f.metadata.get("key", f.name)),
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
    )
    if cls.TYPE in _PAYLOADS:  # pragma: no cover - a mistake in this module
        raise TypeError(f"two payload classes of {cls.TYPE}")
    _PAYLOADS[cls.TYPE] = cls
    return cls


def _named(key: str) -> Any:
    """A field stored under ``key`` (a Python keyword)."""
    return field(metadata={"key": key})


def _named_optional(key: str) -> Any:
    return field(default=None, metadata={"key": key})


@_payload
@dataclass(frozen=True, slots=True, kw_only=True)
class RunStartData(EventData):
    """The run began. ``messages``: the initial conversation; ``execution``: the agent's
    effective execution policy (``isolation``, ``network``, ``allowed_tool_types``, and
    ``sources`` saying where each came from), absent when the run failed before its
    agent was built. A system run has ``system`` and ``system_spec`` (the spec it
    follows) instead of ``messages``."""

    TYPE = EventType.RUN_START
    agent: str | None
    input: str
    messages: list[JsonObject] | None = None
    execution: JsonObject | None = None
    system: str | None = None
    system_spec: JsonObject | None = None


@_payload
@dataclass(frozen=True, slots=True, kw_only=True)
class StepStartData(EventData):
    """A step (a model turn and the tool calls it asks for) began."""

    TYPE = EventType.STEP_START
    step: int


@_payload
@dataclass(frozen=True, slots=True, kw_only=True)
class TextDeltaData(EventData):
    """A piece of the streamed answer."""

    TYPE = EventType.TEXT_DELTA
    text: str


@_payload
@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallData(EventData):
    """A tool call's execution begins (``arguments``: the JSON text the model gave)."""

    TYPE = EventType.TOOL_CALL
    step: int
    call_id: str
    tool: str
    arguments: str
    idempotent: bool = False


@_payload
@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResultData(EventData):
    """A tool call's outcome: ``output``, or ``error`` (``code``, ``reason``,
    ``retryable``); ``retries`` when the call was retried; ``handoff`` (``agent``,
    ``reason``) for an accepted ``handoff`` call."""

    TYPE = EventType.TOOL_RESULT
    step: int
    call_id: str
    tool: str
    output: Any
    error: JsonObject | None
    attempts: int = 1
    duration_ms: float | None = None
    retries: list[JsonObject] | None = None
    handoff: JsonObject | None = None


@_payload
@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRequestedData(EventData):
    """A call waits for a human's decision (``expires_at``: when it counts as rejected)."""

    TYPE = EventType.APPROVAL_REQUESTED
    step: int
    call_id: str
    tool: str
    arguments: str
    reason: str
    requested_at: float
    expires_at: float | None


@_payload
@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalResolvedData(EventData):
    """A human decided on a call (or its request expired: ``expired``). ``by``: who
    decided (``token:ID (NAME)`` over the API, the OS user for the embedded CLI)."""

    TYPE = EventType.APPROVAL_RESOLVED
    step: int
    call_id: str
    tool: str
    approved: bool
    reason: str | None
    by: str | None = None
    decided_at: float | None = None
    approval_id: str | None = None
    expired: bool | None = None


@_payload
@dataclass(frozen=True, slots=True, kw_only=True)
class ChildStartData(EventData):
    """A tool call (``agents_exec``) started the child run ``run_id``; the run waits in
    ``waiting_children``. Of a system run: a node run, with ``message_id``,
    ``branch_id`` and ``parent_branch_id`` and no ``step``/``call_id``/``tool``."""

    TYPE = EventType.CHILD_START
    step: int | None = None
    call_id: str | None = None
    tool: str | None = None
    run_id: str
    agent: str
    message_id: str | None = None
    branch_id: str | None = None
    parent_branch_id: str | None = None


@_payload
@dataclass(frozen=True, slots=True, kw_only=True)
class ChildFinishData(EventData):
    """The child run ``run_id`` ended in ``state``; its spend (``usage``, ``cost_usd``)
    counts as the parent's, and the call's ``tool.result`` follows. No ``call_id``: a
    child a tool program started over the API, charged once its step's calls were done.
    Of a system run: ``message_id`` and ``branch_id`` and no ``step``."""

    TYPE = EventType.CHILD_FINISH
    step: int | None = None
    call_id: str | None = None
    run_id: str
    agent: str
    state: str
    usage: JsonObject | None = None
    cost_usd: float = 0.0
    message_id: str | None = None
    branch_id: str | None = None


@_payload
@dataclass(frozen=True, slots=True, kw_only=True)
class MessageSendData(EventData):
    """A system run stored an agent message: its input to the entry, a node's output to
    a next node, the gathered outputs into a join. ``from`` absent: the input or a join;
    ``kind``: ``input``, ``output`` or ``join``."""

    TYPE = EventType.MESSAGE_SEND
    message_id: str
    from_agent: str | None = _named_optional("from")
    to: str
    kind: str
    branch_id: str | None = None
    parent_branch_id: str | None = None
    hop: int = 0


@_payload
@dataclass(frozen=True, slots=True, kw_only=True)
class MessageDeliverData(EventData):
    """A system run's message reached its agent: ``run_id`` is the node run handling it."""

    TYPE = EventType.MESSAGE_DELIVER
    message_id: str
    to: str
    run_id: str
    branch_id: str | None = None


@_payload
@dataclass(frozen=True, slots=True, kw_only=True)
class BranchJoinData(EventData):
    """A join node (``join``: ``all`` or ``first``) of a system run gathered ``inputs``
    (message ids) into the message ``message_id`` and dropped ``dropped``; a late input
    to a join that already ran has only ``agent``, ``message_id`` and ``dropped``."""

    TYPE = EventType.BRANCH_JOIN
    agent: str
    join: str | None = None
    message_id: str
    branch_id: str | None = None
    inputs: list[str] | None = None
    dropped: list[str] | None = None


@_payload
@dataclass(frozen=True, slots=True, kw_only=True)
class HandoffData(EventData):
    """The conversation goes on under ``to`` (a ``handoff`` call): its system prompt
    ``system`` replaced the first."""

    TYPE = EventType.HANDOFF
    step: int
    call_id: str
    from_agent: str = _named("from")
    to: str
    reason: str | None = None
    system: str | None = None


@_payload
@dataclass(frozen=True, slots=True, kw_only=True)
class MessageCreateData(EventData):
    """A message joined the conversation: the model's answer of ``step`` (with the
    ``endpoint`` that gave it, ``usage``, ``cost_usd``, and ``retries`` when the
    endpoint was retried), or a message the loop added (a structured-output repair:
    ``message`` alone)."""

    TYPE = EventType.MESSAGE_CREATE
    step: int | None = None
    message: JsonObject
    endpoint: str | None = None
    usage: JsonObject | None = None
    cost_usd: float | None = None
    retries: list[JsonObject] | None = None


@_payload
@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryWriteData(EventData):
    """A memory tool wrote: ``key`` (a write) or ``key_prefix`` and ``chunks`` (an
    ingest), ``written`` (a write: whether it wrote; an ingest: how many chunks it wrote
    now), ``preview`` (the first 80 characters, redacted), ``chars``; ``usage`` and
    ``cost_usd``: what embedding it cost, charged to the run. A call that failed after
    paying for embeddings: ``memory``, ``failed`` (the error code), ``usage``,
    ``cost_usd``. The call's ``tool.result`` follows."""

    TYPE = EventType.MEMORY_WRITE
    step: int | None = None
    call_id: str | None = None
    tool: str | None = None
    memory: str
    key: str | None = None
    key_prefix: str | None = None
    chunks: int | None = None
    written: bool | int | None = None
    failed: str | None = None
    preview: str | None = None
    chars: int | None = None
    usage: JsonObject | None = None
    cost_usd: float | None = None


@_payload
@dataclass(frozen=True, slots=True, kw_only=True)
class MemorySearchData(EventData):
    """A memory tool searched: ``query`` (its first 80 characters, redacted) and how many
    ``hits``; ``usage``/``cost_usd`` and ``failed`` as for ``memory.write``."""

    TYPE = EventType.MEMORY_SEARCH
    step: int | None = None
    call_id: str | None = None
    tool: str | None = None
    memory: str
    query: str | None = None
    hits: int | None = None
    failed: str | None = None
    usage: JsonObject | None = None
    cost_usd: float | None = None


@_payload
@dataclass(frozen=True, slots=True, kw_only=True)
class StepFinishData(EventData):
    """A step ended: the run's spend so far."""

    TYPE = EventType.STEP_FINISH
    step: int
    usage: JsonObject | None = None
    cost_usd: float = 0.0


@_payload
@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorData(EventData):
    """The run (or an attempt of it) failed: ``code``, ``message`` and the error's own
    fields. An attempt that will be tried again adds ``retry`` (the next attempt),
    ``max_attempts`` and ``retry_in`` (seconds)."""

    TYPE = EventType.ERROR
    code: str
    message: str
    retryable: bool | None = None
    status_code: int | None = None
    endpoint: str | None = None
    limit: str | None = None
    #: a ``budget_exceeded`` of a limit the run was given by its parent or system run
    inherited: bool | None = None
    details: JsonObject | None = None
    #: the error an earlier attempt ended with (a run given up on)
    cause: JsonObject | None = None
    retry: int | None = None
    max_attempts: int | None = None
    retry_in: float | None = None

    @classmethod
    def of(cls, error: Mapping[str, Any], **retry: Any) -> ErrorData:
        """The event of an error as ``CorralError.to_dict`` describes it."""
        return cls.from_dict({**error, **retry})


@_payload
@dataclass(frozen=True, slots=True, kw_only=True)
class WarningData(EventData):
    """Something the run's reader should know that does not stop it, said once per run:
    ``usage_estimated`` (a provider reported no token usage; the run's usage and limits
    rest on an estimate)."""

    TYPE = EventType.WARNING
    code: str
    message: str


@_payload
@dataclass(frozen=True, slots=True, kw_only=True)
class RunFinishData(EventData):
    """The run ended in ``state`` (its ``output``, and the run's ``steps``, ``usage`` and
    ``cost_usd`` when the loop ended it)."""

    TYPE = EventType.RUN_FINISH
    state: str
    output: Any = None
    steps: int | None = None
    usage: JsonObject | None = None
    cost_usd: float | None = None


AnyEventData = (
    RunStartData
    | StepStartData
    | TextDeltaData
    | ToolCallData
    | ToolResultData
    | ApprovalRequestedData
    | ApprovalResolvedData
    | ChildStartData
    | ChildFinishData
    | MessageSendData
    | MessageDeliverData
    | BranchJoinData
    | HandoffData
    | MessageCreateData
    | MemoryWriteData
    | MemorySearchData
    | StepFinishData
    | ErrorData
    | WarningData
    | RunFinishData
)

if set(_PAYLOADS) != set(EventType):  # pragma: no cover - a new type without its payload
    raise TypeError(f"event types without a payload: {set(EventType) - set(_PAYLOADS)}")


def parse_event_data(type: EventType | str, data: Mapping[str, Any]) -> AnyEventData:
    """The payload of a stored or received event (``ValueError`` for an unknown type or
    a payload that lacks a required field)."""
    cls = _PAYLOADS[EventType(type)]
    return cls.from_dict(data)  # type: ignore[return-value]


def payload_class(type: EventType) -> type[EventData]:
    """The payload class of ``type``."""
    return _PAYLOADS[type]


@dataclass(frozen=True, slots=True)
class Event:
    """One event of one run: its number, its payload, when it happened."""

    run_id: str
    seq: int
    data: AnyEventData
    ts: float = field(default_factory=time.time)

    @property
    def type(self) -> EventType:
        return self.data.TYPE


EventSink = Callable[[Event], Awaitable[None]]
"""Receives each event in order; the engine awaits it before moving on."""


def event_table() -> str:
    """docs/api.md's table of event types: each payload's fields (``?``: optional) and
    its description."""
    rows = ["| type | data |", "|---|---|"]
    for cls in _PAYLOADS.values():
        hints = {f.name: f.type for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        fields = ", ".join(
            f"`{k.key}{'' if k.always else '?'}`: {_type_name(hints[k.attr], k.always)}"
            for k in cls._keys
        )
        doc = " ".join((cls.__doc__ or "").split()).replace("``", "`")
        rows.append(f"| `{cls.TYPE}` | {fields}. {doc} |")
    return "\n".join(rows)


def _type_name(annotation: Any, always: bool) -> str:
    """A field's type as the table shows it: JSON's names, ``or null`` where a field that
    is always present may be null."""
    text = str(annotation)
    nullable = text.endswith(" | None")
    text = text.removesuffix(" | None").replace("JsonObject", "object").replace("Any", "any")
    text = text.replace("list[object]", "list of objects").replace("list[str]", "list of str")
    text = text.replace("str", "string").replace("float", "number").replace("int", "integer")
    text = text.replace("bool", "boolean").replace(" | ", " or ")
    return f"{text} or null" if nullable and always else text
