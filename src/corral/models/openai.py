"""The ``openai``, ``azure-openai`` and ``ollama`` providers: the Chat Completions API,
and the Embeddings API (``/embeddings``; Ollama's OpenAI-compatible one) for
:meth:`~corral.models.base.Model.embed`.

One adapter serves all three; they differ only in how the SDK client is built
(:func:`create`). Any other OpenAI-compatible server (vLLM, llama.cpp server)
is the ``openai`` provider with a ``base_url``.

Such servers take a few things differently from the OpenAI API (a
:class:`Dialect`, chosen by ``base_url`` and overridable per endpoint in
``options``): the output cap goes out as ``max_tokens`` (``max_completion_tokens``
is OpenAI's newer name, which they ignore), and an assistant message with tool
calls carries ``content: ""`` (llama.cpp's server answers 500 without it, and
refuses ``null``).

The SDK's own retries are off: retrying is the gateway's job
(:class:`~corral.models.gateway.RetryingModel`). Every SDK and transport
exception is converted, by :mod:`corral.models._adapter` (the same way for
every SDK) and :func:`_api_error` here::

    openai.APITimeoutError, httpx2.TimeoutException, whole-call deadline -> ModelTimeoutError
    openai.APIConnectionError, httpx2.TransportError                    -> ModelConnectionError
    openai.APIStatusError  408, 429, 5xx                                -> ModelError(retryable=True)
    openai.APIStatusError  other 4xx                                    -> ModelError(retryable=False)
    a body cut short (json.JSONDecodeError)                             -> ModelError(retryable=True)
    a stream that ends without its final chunk                          -> ModelConnectionError
    any other openai.OpenAIError                                        -> ModelError
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import openai
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
)
from openai.types.completion_usage import CompletionUsage

from corral.core.errors import ConfigurationError, ModelError
from corral.core.messages import Message, ModelResponse, StreamItem, ToolCall, ToolSpec, Usage
from corral.models._adapter import SDKErrors, SDKModel, cut_short, http_error
from corral.models._http import sdk_http_client
from corral.models.base import (
    Embeddings,
    Model,
    ModelSettings,
    NamedTool,
    ToolChoice,
    checked_embeddings,
)
from corral.models.estimate import estimate_tokens, estimated_usage
from corral.resources.kinds import MaxTokensParam, ModelEndpointSpec, ToolCallContent

DEFAULT_AZURE_API_VERSION = "2024-10-21"
DEFAULT_OLLAMA_BASE_URL = "http://localhost:11434/v1"
#: sent to servers that need no key; the SDK insists on some value
PLACEHOLDER_API_KEY = "not-needed"

OPENAI_API_HOST = "api.openai.com"


@dataclass(frozen=True)
class Dialect:
    """How one endpoint takes what OpenAI-compatible servers disagree on.

    ``max_tokens_param``: the name the output cap goes out under.
    ``tool_call_content``: an assistant message with tool calls and no text leaves
    ``content`` out (``omit``, as the OpenAI API allows) or sends ``""`` (``empty``).
    """

    max_tokens_param: MaxTokensParam = "max_completion_tokens"
    tool_call_content: ToolCallContent = "omit"

    @staticmethod
    def of(spec: ModelEndpointSpec) -> Dialect:
        """The OpenAI API's ways for it (and Azure), the common ways of other servers for
        any other ``base_url`` and for Ollama; ``options`` override either field."""
        host = urlsplit(spec.base_url).hostname if spec.base_url else OPENAI_API_HOST
        official = spec.provider == "azure-openai" or (
            spec.provider == "openai" and host == OPENAI_API_HOST
        )
        default = Dialect() if official else Dialect("max_tokens", "empty")
        # the values were checked when the endpoint was applied (ModelEndpointSpec)
        return Dialect(
            spec.options.get("max_tokens_param", default.max_tokens_param),
            spec.options.get("tool_call_content", default.tool_call_content),
        )


# --------------------------------------------------------------------------- errors


def _api_error(exc: Exception, endpoint: str) -> ModelError | None:
    """An HTTP error answer, or an error event inside a stream; ``None`` for anything else."""
    if isinstance(exc, openai.APIStatusError):
        return http_error(endpoint, exc.status_code, exc.message, exc.response.headers)
    if isinstance(exc, openai.APIError):
        # an error event inside a stream: there is no status to go by
        retryable = exc.type in ("server_error", "rate_limit_error", "overloaded_error")
        return ModelError(
            f"model endpoint {endpoint!r}: {exc.message}", retryable=retryable, endpoint=endpoint
        )
    return None


#: how this SDK's exceptions (and its transport's) become :class:`ModelError`
SDK_ERRORS = SDKErrors(
    root=openai.OpenAIError,
    timeout=openai.APITimeoutError,
    connection=openai.APIConnectionError,
    api_error=_api_error,
)


# --------------------------------------------------------------------------- translation


def to_openai_messages(
    messages: Sequence[Message], tool_call_content: ToolCallContent = "omit"
) -> list[ChatCompletionMessageParam]:
    """Corral messages as Chat Completions messages (see :class:`Dialect`)."""
    out: list[ChatCompletionMessageParam] = []
    for message in messages:
        if message.role == "system":
            out.append({"role": "system", "content": message.content})
        elif message.role == "user":
            out.append({"role": "user", "content": message.content})
        elif message.role == "tool":
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": message.tool_call_id or "",
                    "content": message.content,
                }
            )
        elif message.tool_calls:
            calls: list[ChatCompletionMessageFunctionToolCallParam] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments or "{}"},
                }
                for call in message.tool_calls
            ]
            if message.content or tool_call_content == "empty":
                out.append({"role": "assistant", "content": message.content, "tool_calls": calls})
            else:
                # No "content": null: the API lets a message with tool calls leave it out.
                out.append({"role": "assistant", "tool_calls": calls})
        else:
            out.append({"role": "assistant", "content": message.content})
    return out


def to_openai_tools(tools: Sequence[ToolSpec]) -> list[ChatCompletionFunctionToolParam]:
    """Tool specs as function tools (names are already model-safe)."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            },
        }
        for tool in tools
    ]


def to_openai_tool_choice(choice: ToolChoice) -> Any:
    """A tool choice as Chat Completions takes it (``None``: send nothing)."""
    if isinstance(choice, NamedTool):
        return {"type": "function", "function": {"name": choice.name}}
    return choice


#: a conversation as it was sent (messages, tools): what usage is estimated from when the
#: server reports none
Sent = tuple[Sequence[Message], Sequence[ToolSpec]]


def _usage(usage: CompletionUsage | None, sent: Sent, answer: Message) -> Usage:
    """The usage the server reported; estimated from ``sent`` and ``answer`` when it
    reported none, only zeros (no model reads a request in no tokens), or a negative count
    (which would give back what the run spent)."""
    if (
        usage is None
        or not (usage.prompt_tokens or usage.completion_tokens)
        or min(usage.prompt_tokens, usage.completion_tokens) < 0
    ):
        return estimated_usage(*sent, answer)
    return Usage(usage.prompt_tokens, usage.completion_tokens, 1)


def from_openai_completion(
    completion: ChatCompletion, endpoint: str, sent: Sent = ((), ())
) -> ModelResponse:
    """A complete Chat Completions answer as a :class:`ModelResponse` (``sent``: the
    request's messages and tools, to estimate the usage from when it has none)."""
    if not completion.choices:
        raise ModelError(f"model endpoint {endpoint!r} answered without choices", endpoint=endpoint)
    choice = completion.choices[0]
    calls = tuple(
        ToolCall(call.id, call.function.name, call.function.arguments or "{}")
        for call in choice.message.tool_calls or ()
        if call.type == "function"
    )
    message = Message.assistant(choice.message.content or "", calls)
    return ModelResponse(
        message=message,
        usage=_usage(completion.usage, sent, message),
        model=completion.model,
        endpoint=endpoint,
        finish_reason=choice.finish_reason,
    )


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list[str])


@dataclass
class _StreamState:
    """What the chunks of one streamed answer add up to."""

    tools_offered: bool = False
    #: the request's messages and tools (see :func:`_usage`)
    sent: Sent = ((), ())
    chunks: int = 0
    text: list[str] = field(default_factory=list[str])
    calls: dict[int, _PartialCall] = field(default_factory=dict[int, _PartialCall])
    usage: CompletionUsage | None = None
    model: str = ""
    finish_reason: str | None = None

    @property
    def complete(self) -> bool:
        """Whether the final chunk (the one with a finish reason) arrived."""
        return self.finish_reason is not None

    def add(self, chunk: ChatCompletionChunk) -> str:
        """Fold one chunk in; return its new text."""
        self.chunks += 1
        self.model = chunk.model or self.model
        if chunk.usage is not None:
            self.usage = chunk.usage
        text = ""
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            if choice.finish_reason is not None:
                self.finish_reason = choice.finish_reason
            delta = choice.delta
            if delta.content:
                text += delta.content
            for piece in delta.tool_calls or ():
                call = self.calls.setdefault(piece.index, _PartialCall())
                call.id = piece.id or call.id
                if piece.function is not None:
                    call.name = piece.function.name or call.name
                    if piece.function.arguments:
                        call.arguments.append(piece.function.arguments)
        self.text.append(text)
        return text

    def cut_short(self, endpoint: str) -> ModelError:
        if self.chunks or not self.tools_offered:
            return cut_short(endpoint)
        # A 200 with an empty stream is an answer, not a dropped connection: llama.cpp's
        # server sends it when its chat format cannot stream the tool call it chose.
        return ModelError(
            f"model endpoint {endpoint!r}: the server answered a streamed request with tools "
            "with an empty stream: it cannot stream tool calls (llama.cpp's "
            "chatml-function-calling cannot with tool_choice auto, which a forced tool_choice "
            "goes back to once the run called a tool); set 'stream: false' on the Agent, or "
            "name the tool in its model_settings.tool_choice with reset_tool_choice: false",
            endpoint=endpoint,
        )

    def response(self, endpoint: str) -> ModelResponse:
        calls = tuple(
            ToolCall(
                call.id or f"call_{index}",
                call.name,
                "".join(call.arguments) or "{}",
            )
            for index, call in sorted(self.calls.items())
        )
        message = Message.assistant("".join(self.text), calls)
        return ModelResponse(
            message=message,
            usage=_usage(self.usage, self.sent, message),
            model=self.model,
            endpoint=endpoint,
            finish_reason=self.finish_reason,
        )


# --------------------------------------------------------------------------- the model


class OpenAIChatModel(SDKModel[openai.AsyncOpenAI]):
    """A model behind the Chat Completions API, reached through an injected SDK client."""

    errors = SDK_ERRORS
    public_keys = frozenset({PLACEHOLDER_API_KEY})

    def __init__(
        self,
        name: str,
        client: openai.AsyncOpenAI,
        model: str,
        *,
        timeout_seconds: float,
        dialect: Dialect | None = None,
    ) -> None:
        super().__init__(name, client, model, timeout_seconds=timeout_seconds)
        self.dialect = dialect or Dialect()

    def _params(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": self.model,
            "messages": to_openai_messages(messages, self.dialect.tool_call_content),
        }
        if tools:
            params["tools"] = to_openai_tools(tools)
            if settings.tool_choice is not None:
                params["tool_choice"] = to_openai_tool_choice(settings.tool_choice)
        if settings.temperature is not None:
            params["temperature"] = settings.temperature
        if settings.max_output_tokens is not None:
            params[self.dialect.max_tokens_param] = settings.max_output_tokens
        return params

    # Both calls post the request as ``chat.completions.create`` does (same path, same
    # bearer auth, same response types) but through ``client.post``, the SDK's documented
    # way to send a body as it is. ``create`` first walks the whole conversation through its
    # type-annotation transform, which changes nothing in a chat request (none of its types
    # renames or reformats a field: tests/test_models_openai.py checks that on a full
    # conversation) and took a third of the SDK's CPU per call, growing with the history.

    async def request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> ModelResponse:
        completion = await self._call(
            lambda: self.client.post(
                "/chat/completions",
                body=self._params(messages, tools, settings),
                cast_to=ChatCompletion,
                options={"security": {"bearer_auth": True}},
            )
        )
        return from_openai_completion(completion, self.name, (messages, tools))

    def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> AsyncIterator[StreamItem]:
        # no generator of its own: the caller closes the one that reads the stream
        body = self._params(messages, tools, settings)
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        return self._stream(
            lambda: self.client.post(
                "/chat/completions",
                body=body,
                cast_to=ChatCompletion,
                options={"security": {"bearer_auth": True}},
                stream=True,
                stream_cls=openai.AsyncStream[ChatCompletionChunk],
            ),
            _StreamState(tools_offered=bool(tools), sent=(messages, tools)),
        )

    async def embed(self, texts: Sequence[str], *, dimensions: int | None = None) -> Embeddings:
        """One Embeddings API request for the batch (floats, not the SDK's base64 default:
        every OpenAI-compatible server answers floats). ``dimensions`` is checked, not
        sent: models that cannot shorten their vectors refuse the parameter."""
        answer = await self._call(
            lambda: self.client.embeddings.create(
                model=self.model, input=list(texts), encoding_format="float"
            )
        )
        ordered = sorted(answer.data, key=lambda item: item.index)
        # some compatible servers send no usage, which the SDK does not check: estimated
        tokens = getattr(answer.usage, "prompt_tokens", None) or 0
        usage = Usage(int(tokens), 0, 1)
        if not tokens:
            usage = Usage(sum(estimate_tokens(t) for t in texts), 0, 1, source="estimated")
        return checked_embeddings(
            self.name,
            len(texts),
            [item.embedding for item in ordered],
            dimensions,
            usage,
            answer.model or self.model,
        )


# --------------------------------------------------------------------------- factory


def create(name: str, spec: ModelEndpointSpec, api_key: str | None) -> Model:
    """Provider factory for ``openai``, ``azure-openai`` and ``ollama``.

    Without a key, the ``openai`` provider on its default URL lets the SDK read
    ``OPENAI_API_KEY``; on a custom ``base_url`` (a local server) it sends a
    placeholder, so a real OpenAI key never goes to a third-party server.
    """
    common: dict[str, Any] = {
        "timeout": spec.timeout_seconds,
        "max_retries": 0,
        "http_client": sdk_http_client(openai.DefaultAsyncHttpxClient),
    }
    dialect = Dialect.of(spec)
    try:
        client: openai.AsyncOpenAI
        if spec.provider == "azure-openai":
            client = openai.AsyncAzureOpenAI(
                azure_endpoint=spec.base_url or "",
                azure_deployment=str(spec.options.get("deployment", spec.model)),
                api_version=str(spec.options.get("api_version", DEFAULT_AZURE_API_VERSION)),
                api_key=api_key,
                **common,
            )
        elif spec.provider == "ollama":
            client = openai.AsyncOpenAI(
                api_key=api_key or PLACEHOLDER_API_KEY,
                base_url=spec.base_url or DEFAULT_OLLAMA_BASE_URL,
                **common,
            )
        else:
            if api_key is None and spec.base_url is not None:
                api_key = PLACEHOLDER_API_KEY
            client = openai.AsyncOpenAI(api_key=api_key, base_url=spec.base_url, **common)
    except openai.OpenAIError as exc:
        raise ConfigurationError(f"model endpoint {name!r}: {exc}") from exc
    return OpenAIChatModel(
        name,
        client,
        spec.model,
        timeout_seconds=spec.timeout_seconds,
        dialect=dialect,
    )
