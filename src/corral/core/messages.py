"""The provider-neutral conversation: messages, tool calls, usage.

Every model adapter translates these to and from its wire format; the engine,
the store and the events only ever see these types. :func:`dump` and
:func:`load` are the one serializer for them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from pydantic import TypeAdapter

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolCall:
    """A model's request to call one tool.

    ``arguments`` is the raw JSON text the model produced: it may be invalid,
    and the governance layer (not the adapter) decides what to do about that.
    """

    id: str
    name: str
    arguments: str = "{}"

    def parsed_arguments(self) -> Any:
        """The arguments as JSON; raises ``ValueError`` when they are not valid JSON."""
        return json.loads(self.arguments or "{}")


@dataclass(frozen=True)
class Message:
    """One message of a conversation."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False

    @staticmethod
    def system(content: str) -> Message:
        return Message("system", content)

    @staticmethod
    def user(content: str) -> Message:
        return Message("user", content)

    @staticmethod
    def assistant(content: str = "", tool_calls: tuple[ToolCall, ...] = ()) -> Message:
        return Message("assistant", content, tool_calls)

    @staticmethod
    def tool(call: ToolCall, content: str, *, is_error: bool = False) -> Message:
        return Message("tool", content, tool_call_id=call.id, name=call.name, is_error=is_error)


#: where token counts come from: the provider's report, or Corral's estimate
#: (:mod:`corral.models.estimate`) when the provider reported none
UsageSource = Literal["reported", "estimated"]


@dataclass(frozen=True)
class Usage:
    """Token counts of one or more model calls; ``source`` is ``estimated`` when any of
    them was estimated."""

    input_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0
    source: UsageSource = "reported"

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        estimated = "estimated" in (self.source, other.source)
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.requests + other.requests,
            "estimated" if estimated else "reported",
        )


@dataclass(frozen=True)
class ToolSpec:
    """What a model is told about a tool: a name, a description and a JSON Schema."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@dataclass(frozen=True)
class ModelResponse:
    """One completed model turn."""

    message: Message
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    endpoint: str = ""
    finish_reason: str | None = None
    cost_usd: float = 0.0
    #: the retries it took (``RetryingModel``): attempt, of how many, delay, cause
    retries: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Embeddings:
    """The vectors of one batch of texts, in the texts' order, and what they cost."""

    vectors: list[list[float]]
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    endpoint: str = ""
    cost_usd: float = 0.0
    #: the retries it took (``RetryingModel``), as for a chat turn
    retries: tuple[dict[str, Any], ...] = ()

    @property
    def dimensions(self) -> int:
        """The length of every vector (0 for an empty batch)."""
        return len(self.vectors[0]) if self.vectors else 0


@dataclass(frozen=True)
class TextDelta:
    """A piece of text streamed from the model before its turn completes."""

    text: str


StreamItem = TextDelta | ModelResponse
"""What ``Model.stream`` yields: text deltas, then exactly one final ``ModelResponse``."""


T = TypeVar("T")


@dataclass(frozen=True)
class _Codec:
    """The compiled pydantic serializer and validator of one type.

    ``TypeAdapter.dump_python`` and ``validate_python`` forward to these, spelling
    out every option with its default; calling them directly with the defaults
    does the same for a fraction of the cost (a run dumps and loads a dozen values).
    """

    dump: Callable[..., Any]
    load: Callable[[Any], Any]


_codecs: dict[Any, _Codec] = {}


def _codec(tp: Any) -> _Codec:
    codec = _codecs.get(tp)
    if codec is None:
        adapter: TypeAdapter[Any] = TypeAdapter(tp)
        codec = _codecs[tp] = _Codec(
            adapter.serializer.to_python, adapter.validator.validate_python
        )
    return codec


#: values that are JSON data as they are (a run's text output, most often)
_PLAIN = frozenset({str, int, float, bool, type(None)})


def dump(obj: Any) -> Any:
    """Turn a message, response, event or a list of them into JSON-able data."""
    if type(obj) in _PLAIN:
        return obj
    return _codec(type(obj)).dump(obj, mode="json")


def dump_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """:func:`dump` for a list of messages: the same data, without pydantic inferring the
    type of each item (a plain ``list`` has no item type to go by)."""
    result: list[dict[str, Any]] = _codec(list[Message]).dump(messages, mode="json")
    return result


def load(tp: type[T], data: Any) -> T:
    """The inverse of :func:`dump` for a known type (``list[Message]`` works too)."""
    result: T = _codec(tp).load(data)
    return result


def load_messages(data: Any) -> list[Message]:
    """Load a stored list of messages."""
    result: list[Message] = _codec(list[Message]).load(data)
    return result
