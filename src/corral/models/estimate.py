"""Token counts Corral works out itself: a turn's input before it is sent (for the run's
budget, see :meth:`corral.models.base.Model.turn_bound`), and a whole turn's usage when
its provider reported none (an OpenAI-compatible server that ignores
``stream_options.include_usage``, as llama.cpp's does).

The estimate is by characters, for any model: one token per :data:`BYTES_PER_TOKEN` bytes
of UTF-8 text (rounded up), plus :data:`MESSAGE_TOKENS` per message for its role and
framing. Tokenizers average about four bytes of English per token, so it errs on the
high side for prose; for text a tokenizer splits finer (single characters, rare scripts)
it can be low. A provider whose tokenizer is at hand counts instead (``llama-cpp`` always
reports llama.cpp's own count).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from corral.core.messages import Message, ToolSpec, Usage

#: bytes of UTF-8 text counted as one token
BYTES_PER_TOKEN = 3
#: tokens counted per message (role, separators) over its text
MESSAGE_TOKENS = 4


def estimate_tokens(text: str) -> int:
    """The tokens of ``text`` by :data:`BYTES_PER_TOKEN` (0 for no text)."""
    return -(-len(text.encode("utf-8", "surrogatepass")) // BYTES_PER_TOKEN)


def estimate_message_tokens(message: Message) -> int:
    """The tokens of one message: its text, its tool calls' names and arguments, its framing."""
    tokens = MESSAGE_TOKENS + estimate_tokens(message.content)
    for call in message.tool_calls:
        tokens += estimate_tokens(call.name) + estimate_tokens(call.arguments)
    return tokens


def estimate_input_tokens(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> int:
    """The tokens of a request: its messages and the tools offered (name, description and
    JSON Schema)."""
    tokens = sum(estimate_message_tokens(message) for message in messages)
    for tool in tools:
        schema = json.dumps(tool.parameters, separators=(",", ":"), ensure_ascii=False)
        tokens += estimate_tokens(tool.name) + estimate_tokens(tool.description)
        tokens += estimate_tokens(schema)
    return tokens


def estimated_usage(
    messages: Sequence[Message], tools: Sequence[ToolSpec], answer: Message
) -> Usage:
    """The usage of a turn whose provider reported none, marked ``source: estimated``."""
    return Usage(
        estimate_input_tokens(messages, tools),
        estimate_message_tokens(answer),
        1,
        source="estimated",
    )
