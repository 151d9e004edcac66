"""The one interface every model provider implements.

A provider adapter translates :mod:`corral.core.messages` to and from its wire
format and converts its SDK's exceptions into :class:`~corral.core.errors.ModelError`
(``retryable`` set for 429, 5xx, connection errors and timeouts; ``retry_after``
from the server's header when it sent one). Retries, fallbacks and pricing are
wrappers around a model (:mod:`corral.models.gateway`), never flags inside one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal

from corral.core.messages import Message, ModelResponse, StreamItem, TextDelta, ToolSpec


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

    def credentials(self) -> list[str]:
        """What this model sends to authenticate, when it found it itself (a key a provider
        SDK read from its environment): the agent's redactor learns these too."""
        return []

    async def prepare(self) -> None:  # noqa: B027 - optional hook
        """Load weights or open connections ahead of the first request (may take long)."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release connections or loaded weights."""
