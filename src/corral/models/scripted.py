"""The ``scripted`` provider: canned turns for tests and demos.

The script is the whole conversation: a request with N assistant messages
already in it gets turn N + 1. So a resumed run (another process, the journal
replayed) continues the script where it left off, and a session's earlier turns
count too. A request past the end of the script is an error, so a test notices
when the engine calls the model more often than it meant to.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import anyio

from corral.core.errors import ModelError
from corral.core.messages import Message, ModelResponse, ToolCall, ToolSpec, Usage
from corral.models.base import Model, ModelSettings, TurnBound
from corral.resources.kinds import ModelEndpointSpec, ScriptedTurn

#: How many of the latest requests a scripted model keeps for tests to inspect.
KEPT_REQUESTS = 256


class ScriptedModel(Model):
    """Answers from a fixed list of turns, in order."""

    def __init__(self, turns: Sequence[ScriptedTurn], name: str = "scripted") -> None:
        self.name = name
        self.turns = list(turns)
        self.requests: list[list[Message]] = []

    def turn_bound(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> TurnBound:
        """Exactly what the next turn will report (nothing past the end of the script:
        that request fails)."""
        index = sum(1 for m in messages if m.role == "assistant")
        if index >= len(self.turns):
            return TurnBound(0, 0)
        turn = self.turns[index]
        return TurnBound(turn.input_tokens, turn.output_tokens)

    async def request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> ModelResponse:
        index = sum(1 for m in messages if m.role == "assistant")
        self.requests.append(list(messages))
        del self.requests[:-KEPT_REQUESTS]  # a long-lived worker shares one model per agent
        if index >= len(self.turns):
            raise ModelError(
                f"scripted model {self.name!r} has {len(self.turns)} turns and was asked for turn "
                f"{index + 1}",
                endpoint=self.name,
            )
        turn = self.turns[index]
        if turn.latency_seconds:
            await anyio.sleep(turn.latency_seconds)
        calls = tuple(
            ToolCall(
                id=f"call_{index + 1}_{n + 1}",
                name=c.name,
                arguments=c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments),
            )
            for n, c in enumerate(turn.tool_calls)
        )
        return ModelResponse(
            message=Message.assistant(turn.text, calls),
            usage=Usage(turn.input_tokens, turn.output_tokens, 1),
            model="scripted",
            endpoint=self.name,
            finish_reason="tool_calls" if calls else "stop",
        )


def create(name: str, spec: ModelEndpointSpec, api_key: str | None) -> Model:
    """Provider factory (see :mod:`corral.models.registry`)."""
    return ScriptedModel(spec.script, name=name)
