"""The floor: a hand-written tool loop over one shared ``openai.AsyncOpenAI`` client.

Nothing persisted, nothing validated beyond what the SDK does: the loop a user
writes from the SDK's documentation. Every other row is divided by it.

:class:`BarePost` is the same loop sending its requests as Corral's OpenAI adapter
does: ``client.post("/chat/completions", ...)``, which skips the transform that
``chat.completions.create`` runs over every message (it changes nothing in a chat
request, and costs about a third of the SDK's CPU per call here). It is the least
client CPU for the same HTTP calls, shown beside the floor so that a Corral row
under 1x reads for what it is.
"""

from __future__ import annotations

import json
from typing import Any

import openai
from bench_tools import add
from openai.types.chat import ChatCompletion

from peers._base import API_KEY, INSTRUCTIONS, MODEL, Framework, Setup, prompt

#: ``add`` as Chat Completions declares it (the frameworks derive the same from the signature).
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "The first number."},
                    "b": {"type": "integer", "description": "The second number."},
                },
                "required": ["a", "b"],
            },
        },
    }
]


class BareOpenAI(Framework):
    """A plain ``while`` loop: model call, run the tool calls, repeat until text."""

    async def start(self, setup: Setup) -> None:
        await super().start(setup)
        self.client = openai.AsyncOpenAI(base_url=setup.base_url, api_key=API_KEY, max_retries=0)

    async def run_one(self, index: int) -> str:
        messages: list[Any] = [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": prompt(index)},
        ]
        while True:
            response = await self.complete(messages)
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return message.content or ""
            for call in message.tool_calls:
                assert call.type == "function"
                output = add(**json.loads(call.function.arguments))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": str(output)})

    async def complete(self, messages: list[Any]) -> ChatCompletion:
        return await self.client.chat.completions.create(
            model=MODEL, messages=messages, tools=TOOLS
        )

    async def stop(self) -> None:
        await self.client.close()


class BarePost(BareOpenAI):
    """The floor's loop, posting each request as it is (no request transform)."""

    async def complete(self, messages: list[Any]) -> ChatCompletion:
        body = {"model": MODEL, "messages": messages, "tools": TOOLS}
        return await self.client.post("/chat/completions", body=body, cast_to=ChatCompletion)
