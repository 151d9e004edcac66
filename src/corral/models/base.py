"""The one interface every model provider implements.

A provider adapter translates :mod:`corral.core.messages` to and from its wire
format and converts its SDK's exceptions into :class:`~corral.core.errors.ModelError`
(``retryable`` set for 429, 5xx, connection errors and timeouts; ``retry_after``
from the server's header when it sent one). Retries, fallbacks and pricing are
wrappers around a model (:mod:`corral.models.gateway`), never flags inside one.

Embeddings are a capability of the same ``Model``: :meth:`Model.embed` turns texts
into vectors (one request for the whole batch), and the gateway wrappers give it the
retries, deadline and cost accounting of a chat turn. A provider without an
embeddings API keeps the default, which refuses with a ``ConfigurationError``
(:data:`EMBEDDING_PROVIDERS` says which providers embed, for checks at apply).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal

from corral.core.errors import ConfigurationError, EmbeddingDimensionsError, ModelError
from corral.core.messages import (
    Embeddings,
    Message,
    ModelResponse,
    StreamItem,
    TextDelta,
    ToolSpec,
    Usage,
)
from corral.models.estimate import estimate_input_tokens

__all__ = [
    "DEFAULT_OUTPUT_TOKENS",
    "EMBEDDING_PROVIDERS",
    "Embeddings",
    "Model",
    "ModelSettings",
    "NamedTool",
    "ToolChoice",
    "TurnBound",
    "checked_embeddings",
]

#: the providers whose models embed (the others refuse :meth:`Model.embed`)
EMBEDDING_PROVIDERS = frozenset({"openai", "azure-openai", "ollama", "llama-cpp"})

#: the output cap of a turn of a run with a token or cost limit when neither the Agent
#: (``model_settings.max_output_tokens``) nor the provider sets one (it is then sent)
DEFAULT_OUTPUT_TOKENS = 4096


@dataclass(frozen=True)
class NamedTool:
    """A tool choice that makes the model call this tool (by the name the model sees)."""

    name: str


#: ``auto``, ``required``, ``none``, or the one tool the model must call; ``None`` sends
#: nothing (the provider's default)
ToolChoice = Literal["auto", "required", "none"] | NamedTool | None


@dataclass(frozen=True)
class ModelSettings:
    """Per-request settings the engine passes down."""

    temperature: float | None = None
    max_output_tokens: int | None = None
    tool_choice: ToolChoice = None
    #: send ``auto`` instead of a forced ``tool_choice`` once the run has called a tool
    #: (the engine's business: providers send ``tool_choice`` as they are given it)
    reset_tool_choice: bool = True


@dataclass(frozen=True)
class TurnBound:
    """The most one model turn can spend: its input tokens (counted, or estimated), its
    output tokens (the turn's cap) and what they cost at the endpoint's prices."""

    input_tokens: int
    output_tokens: int
    cost_usd: float = 0.0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def _checked_vectors(
    endpoint: str, texts: int, vectors: Sequence[Sequence[float]], dimensions: int | None
) -> list[list[float]]:
    """An embeddings answer, checked: one vector per text, all of one length, finite
    numbers, and ``dimensions`` long when the caller fixed it
    (:class:`~corral.core.errors.EmbeddingDimensionsError` otherwise)."""
    where = f"model endpoint {endpoint!r}"
    if len(vectors) != texts:
        raise ModelError(
            f"{where} answered {len(vectors)} embeddings for {texts} texts", endpoint=endpoint
        )
    try:
        out = [[float(x) for x in vector] for vector in vectors]
    except (TypeError, ValueError):
        raise ModelError(
            f"{where} answered embeddings that are not numbers", endpoint=endpoint
        ) from None
    sizes = {len(vector) for vector in out}
    if len(sizes) > 1 or 0 in sizes:
        raise ModelError(f"{where} answered embeddings of sizes {sorted(sizes)}", endpoint=endpoint)
    if out and dimensions is not None and len(out[0]) != dimensions:
        raise EmbeddingDimensionsError(
            f"{where} answered embeddings of {len(out[0])} dimensions, not the {dimensions} "
            f"fixed for them: use a model of {dimensions} dimensions, or a Memory of "
            f"{len(out[0])}",
            endpoint=endpoint,
        )
    if not all(math.isfinite(x) for vector in out for x in vector):
        raise ModelError(f"{where} answered an embedding that is not finite", endpoint=endpoint)
    return out


def checked_embeddings(
    endpoint: str,
    texts: int,
    vectors: Sequence[Sequence[float]],
    dimensions: int | None,
    usage: Usage,
    model: str,
) -> Embeddings:
    """A provider's paid answer as :class:`Embeddings`, checked by :func:`_checked_vectors`;
    a refusal carries what the answer cost (``ModelError.paid``), since the provider
    billed it whatever its vectors are."""
    try:
        checked = _checked_vectors(endpoint, texts, vectors, dimensions)
    except ModelError as exc:
        exc.paid = Embeddings([], usage, model, endpoint)
        raise
    return Embeddings(checked, usage, model, endpoint)


class Model(ABC):
    """A chat model that can call tools."""

    #: the endpoint (resource) name, for events and errors
    name: str = "model"

    @abstractmethod
    async def request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> ModelResponse:
        """One complete model turn."""

    async def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> AsyncIterator[StreamItem]:
        """Yield ``TextDelta`` pieces, then exactly one final ``ModelResponse``.

        The default streams nothing incrementally: it yields the whole text as one
        delta. Providers with native streaming override it.
        """
        response = await self.request(messages, tools, settings)
        if response.message.content:
            yield TextDelta(response.message.content)
        yield response

    #: the output cap the provider sends when the settings set none (``None``: it sends
    #: none, and the model may write up to its own limit)
    default_output_tokens: int | None = None

    def turn_bound(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> TurnBound:
        """The most a turn on ``messages`` under ``settings`` can spend: the input estimated
        (:mod:`corral.models.estimate`), the output at its cap (``max_output_tokens``, else
        :attr:`default_output_tokens`, else :data:`DEFAULT_OUTPUT_TOKENS`), at no cost
        (:class:`~corral.models.gateway.PricedModel` prices it). Providers that count input
        tokens, or write past the cap, say so by overriding it."""
        cap = settings.max_output_tokens or self.default_output_tokens or DEFAULT_OUTPUT_TOKENS
        return TurnBound(estimate_input_tokens(messages, tools), cap)

    async def embed(self, texts: Sequence[str], *, dimensions: int | None = None) -> Embeddings:
        """The embedding of each of ``texts`` (one batch, one request).

        ``dimensions`` is the vector length the caller fixed: an answer of another
        length is an :class:`~corral.core.errors.EmbeddingDimensionsError`. The default
        refuses: this provider has no embeddings.
        """
        raise ConfigurationError(
            f"model endpoint {self.name!r}: its provider has no embeddings "
            f"(providers that embed: {', '.join(sorted(EMBEDDING_PROVIDERS))})"
        )

    def credentials(self) -> list[str]:
        """What this model sends to authenticate, when it found it itself (a key a provider
        SDK read from its environment): the agent's redactor learns these too."""
        return []

    async def prepare(self) -> None:  # noqa: B027 - optional hook
        """Load weights or open connections ahead of the first request (may take long)."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release connections or loaded weights."""
