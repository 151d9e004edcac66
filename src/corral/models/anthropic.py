"""The ``anthropic`` provider: the Messages API through the official SDK.

Wire facts this module owns: the system prompt travels apart from the
conversation; tool calls are ``tool_use`` blocks of an assistant message and
their results ``tool_result`` blocks of a user message (consecutive results go
in one user message); ``max_tokens`` is required.

The SDK's own retries are off (the gateway retries). Exceptions are converted
as for every SDK (:mod:`corral.models._adapter`; the table is in
:mod:`corral.models.openai`); 529 (overloaded) is a 5xx and therefore
retryable, and so is an ``overloaded_error`` event inside a stream. A stream
that ends without ``message_stop`` is a :class:`ModelConnectionError`, never a
silently shortened answer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import anthropic
from anthropic.types import (
    ContentBlockParam,
    MessageParam,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
    RawMessageStreamEvent,
    TextBlock,
    ToolChoiceParam,
    ToolParam,
    ToolUseBlock,
)
from anthropic.types import Message as AnthropicMessage
from anthropic.types import Usage as AnthropicUsage

from corral.core.errors import ConfigurationError, ModelError
from corral.core.messages import Message, ModelResponse, StreamItem, ToolCall, ToolSpec, Usage
from corral.models._adapter import SDKErrors, SDKModel, cut_short, http_error
from corral.models._http import sdk_http_client
from corral.models.base import Model, ModelSettings, NamedTool, ToolChoice
from corral.resources.kinds import ModelEndpointSpec

DEFAULT_MAX_TOKENS = 4096

#: Anthropic's stop reasons in the vocabulary the rest of Corral uses (OpenAI's)
FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
}

_RETRYABLE_ERROR_TYPES = ("overloaded_error", "api_error", "rate_limit_error", "timeout_error")


# --------------------------------------------------------------------------- errors


def _error_type(body: object) -> str | None:
    error = body.get("error") if isinstance(body, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    return kind if isinstance(kind, str) else None


def _api_error(exc: Exception, endpoint: str) -> ModelError | None:
    """An HTTP error answer, or an error event inside a stream; ``None`` for anything else."""
    if not isinstance(exc, anthropic.APIStatusError):
        return None
    if exc.status_code < 400:
        # an error event inside a 200 stream: the body's type says what happened
        retryable = _error_type(exc.body) in _RETRYABLE_ERROR_TYPES
        return ModelError(
            f"model endpoint {endpoint!r}: {exc.message}", retryable=retryable, endpoint=endpoint
        )
    return http_error(endpoint, exc.status_code, exc.message, exc.response.headers)


#: how this SDK's exceptions (and its transport's) become :class:`ModelError`
SDK_ERRORS = SDKErrors(
    root=anthropic.AnthropicError,
    timeout=anthropic.APITimeoutError,
    connection=anthropic.APIConnectionError,
    api_error=_api_error,
)


# --------------------------------------------------------------------------- translation


def _tool_input(call: ToolCall) -> dict[str, object]:
    """The arguments as the JSON object Anthropic wants.

    Arguments that are not a JSON object (a model can produce broken JSON) are
    sent as an empty object: the tool result already told the model what went wrong.
    """
    try:
        value = json.loads(call.arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def to_anthropic_messages(messages: Sequence[Message]) -> tuple[str, list[MessageParam]]:
    """Corral messages as ``(system prompt, Messages API conversation)``.

    Messages of the same role that follow each other are merged into one, which
    puts consecutive tool results into a single user message as the API requires.
    """
    system: list[str] = []
    turns: list[tuple[str, list[ContentBlockParam]]] = []
    for message in messages:
        blocks: list[ContentBlockParam] = []
        if message.role == "system":
            system.append(message.content)
            continue
        if message.role == "tool":
            role = "user"
            blocks.append(
                {
                    "type": "tool_result",
                    "tool_use_id": message.tool_call_id or "",
                    "content": message.content,
                    "is_error": message.is_error,
                }
            )
        else:
            role = message.role
            if message.content:
                blocks.append({"type": "text", "text": message.content})
            for call in message.tool_calls:
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call.id,
                        "name": call.name,
                        "input": _tool_input(call),
                    }
                )
        if not blocks:
            continue  # the API rejects empty messages
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    out: list[MessageParam] = []
    for role, content in turns:
        if role == "assistant":
            out.append({"role": "assistant", "content": content})
        else:
            out.append({"role": "user", "content": content})
    return "\n\n".join(part for part in system if part), out


def to_anthropic_tools(tools: Sequence[ToolSpec]) -> list[ToolParam]:
    """Tool specs as Messages API tools (names are already model-safe)."""
    return [
        {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}
        for tool in tools
    ]


def to_anthropic_tool_choice(choice: ToolChoice) -> ToolChoiceParam:
    """A tool choice in the Messages API's terms (``required`` is its ``any``)."""
    if isinstance(choice, NamedTool):
        return {"type": "tool", "name": choice.name}
    if choice == "required":
        return {"type": "any"}
    if choice == "none":
        return {"type": "none"}
    return {"type": "auto"}


def _usage(usage: AnthropicUsage) -> Usage:
    # cached prompt tokens are reported apart from input_tokens; they are still input
    cached = (usage.cache_creation_input_tokens or 0) + (usage.cache_read_input_tokens or 0)
    return _counted(usage.input_tokens + cached, usage.output_tokens)


def _counted(input_tokens: int, output_tokens: int) -> Usage:
    """A turn's usage; a negative count (a broken or hostile server's) counts as none,
    since it would give back what the run spent."""
    return Usage(max(input_tokens, 0), max(output_tokens, 0), 1)


def _finish_reason(stop_reason: str | None) -> str | None:
    return None if stop_reason is None else FINISH_REASONS.get(stop_reason, stop_reason)


def from_anthropic_message(message: AnthropicMessage, endpoint: str) -> ModelResponse:
    """A complete Messages API answer as a :class:`ModelResponse`."""
    text: list[str] = []
    calls: list[ToolCall] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            text.append(block.text)
        elif isinstance(block, ToolUseBlock):
            calls.append(ToolCall(block.id, block.name, json.dumps(block.input)))
    return ModelResponse(
        message=Message.assistant("".join(text), tuple(calls)),
        usage=_usage(message.usage),
        model=message.model,
        endpoint=endpoint,
        finish_reason=_finish_reason(message.stop_reason),
    )


@dataclass
class _PartialCall:
    id: str
    name: str
    json: list[str] = field(default_factory=list[str])


@dataclass
class _StreamState:
    """What the events of one streamed answer add up to."""

    text: list[str] = field(default_factory=list[str])
    calls: dict[int, _PartialCall] = field(default_factory=dict[int, _PartialCall])
    input_tokens: int = 0
    output_tokens: int = 0
    model: str = ""
    stop_reason: str | None = None
    stopped: bool = False

    @property
    def complete(self) -> bool:
        """Whether ``message_stop`` arrived."""
        return self.stopped

    def add(self, event: RawMessageStreamEvent) -> str:
        """Fold one event in; return its new text."""
        if isinstance(event, RawMessageStartEvent):
            self.model = event.message.model
            self.input_tokens = _usage(event.message.usage).input_tokens
            self.output_tokens = event.message.usage.output_tokens
        elif isinstance(event, RawContentBlockStartEvent):
            block = event.content_block
            if isinstance(block, ToolUseBlock):
                self.calls[event.index] = _PartialCall(block.id, block.name)
            elif isinstance(block, TextBlock) and block.text:
                self.text.append(block.text)
                return block.text
        elif isinstance(event, RawContentBlockDeltaEvent):
            delta = event.delta
            if delta.type == "text_delta":
                self.text.append(delta.text)
                return delta.text
            if delta.type == "input_json_delta" and event.index in self.calls:
                self.calls[event.index].json.append(delta.partial_json)
        elif isinstance(event, RawMessageDeltaEvent):
            self.stop_reason = event.delta.stop_reason or self.stop_reason
            # message_delta carries cumulative counts
            self.output_tokens = event.usage.output_tokens
            if event.usage.input_tokens is not None:
                cached = (event.usage.cache_creation_input_tokens or 0) + (
                    event.usage.cache_read_input_tokens or 0
                )
                self.input_tokens = event.usage.input_tokens + cached
        elif isinstance(event, RawMessageStopEvent):
            self.stopped = True
        return ""

    def cut_short(self, endpoint: str) -> ModelError:
        return cut_short(endpoint)

    def response(self, endpoint: str) -> ModelResponse:
        calls = tuple(
            ToolCall(call.id, call.name, "".join(call.json) or "{}")
            for _, call in sorted(self.calls.items())
        )
        return ModelResponse(
            message=Message.assistant("".join(self.text), calls),
            usage=_counted(self.input_tokens, self.output_tokens),
            model=self.model,
            endpoint=endpoint,
            finish_reason=_finish_reason(self.stop_reason),
        )


# --------------------------------------------------------------------------- the model


class AnthropicModel(SDKModel[anthropic.AsyncAnthropic]):
    """A model behind the Messages API, reached through an injected SDK client."""

    errors = SDK_ERRORS
    default_output_tokens = DEFAULT_MAX_TOKENS

    def _params(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> dict[str, Any]:
        system, conversation = to_anthropic_messages(messages)
        params: dict[str, Any] = {
            "model": self.model,
            "messages": conversation,
            "max_tokens": settings.max_output_tokens or DEFAULT_MAX_TOKENS,
        }
        if system:
            params["system"] = system
        if tools:
            params["tools"] = to_anthropic_tools(tools)
            if settings.tool_choice is not None:
                params["tool_choice"] = to_anthropic_tool_choice(settings.tool_choice)
        if settings.temperature is not None:
            # this SDK version has no typed argument for it; the API still takes it
            params["extra_body"] = {"temperature": settings.temperature}
        return params

    async def request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> ModelResponse:
        message = await self._call(
            lambda: self.client.messages.create(
                **self._params(messages, tools, settings), stream=False
            )
        )
        return from_anthropic_message(message, self.name)

    def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> AsyncIterator[StreamItem]:
        # no generator of its own: the caller closes the one that reads the stream
        return self._stream(
            lambda: self.client.messages.create(
                **self._params(messages, tools, settings), stream=True
            ),
            _StreamState(),
        )


# --------------------------------------------------------------------------- factory


def create(name: str, spec: ModelEndpointSpec, api_key: str | None) -> Model:
    """Provider factory for ``anthropic``.

    Without a key the SDK looks for one (``ANTHROPIC_API_KEY``, its config
    profiles); finding none is a :class:`ConfigurationError` here, not at the
    first request.
    """
    try:
        client = anthropic.AsyncAnthropic(
            api_key=api_key,
            base_url=spec.base_url,
            timeout=spec.timeout_seconds,
            max_retries=0,
            http_client=sdk_http_client(anthropic.DefaultAsyncHttpxClient),
        )
    except anthropic.AnthropicError as exc:
        raise ConfigurationError(f"model endpoint {name!r}: {exc}") from exc
    if client.api_key is None and client.auth_token is None and client.credentials is None:
        # the SDK would only notice at the first request, with a TypeError
        raise ConfigurationError(
            f"model endpoint {name!r}: no API key (set 'api_key' or ANTHROPIC_API_KEY)"
        )
    return AnthropicModel(name, client, spec.model, timeout_seconds=spec.timeout_seconds)
