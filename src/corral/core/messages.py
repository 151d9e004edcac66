"""The provider-neutral conversation: messages, tool calls, usage.

Every model adapter translates these to and from its wire format; the engine,
the store and the events only ever see these types. :func:`dump` and
:func:`load` are the one serializer for them.
"""

from __future__ import annotations

import json
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


@dataclass(frozen=True)
class Usage:
    """Token counts of one or more model calls."""

    input_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.requests + other.requests,
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


@dataclass(frozen=True)
class TextDelta:
    """A piece of text streamed from the model before its turn completes."""

    text: str


StreamItem = TextDelta | ModelResponse
"""What ``Model.stream`` yields: text deltas, then exactly one final ``ModelResponse``."""


T = TypeVar("T")

_adapters: dict[Any, TypeAdapter[Any]] = {}


def _adapter(tp: Any) -> TypeAdapter[Any]:
    adapter = _adapters.get(tp)
    if adapter is None:
        adapter = _adapters[tp] = TypeAdapter(tp)
    return adapter


def dump(obj: Any) -> Any:
    """Turn a message, response, event or a list of them into JSON-able data."""
    return _adapter(type(obj)).dump_python(obj, mode="json")


def load(tp: type[T], data: Any) -> T:
    """The inverse of :func:`dump` for a known type (``list[Message]`` works too)."""
    result: T = _adapter(tp).validate_python(data)
    return result


def load_messages(data: Any) -> list[Message]:
    """Load a stored list of messages."""
    result: list[Message] = _adapter(list[Message]).validate_python(data)
    return result
