"""A fake Anthropic Messages API server over real HTTP, for tests and benchmarks.

It serves ``POST /v1/messages``, streaming (server-sent events) and not, and is
scripted exactly like :class:`~corral.testing.fake_openai.FakeOpenAIServer`
(replies, faults, tool loop, recorded requests); the protocol-neutral names of
:mod:`corral.testing._fake_http` are re-exported here::

    with FakeAnthropicServer() as server:
        server.add_reply(FakeReply(text="hello"))
        client = anthropic.AsyncAnthropic(base_url=server.base_url, api_key="test")
        ...

A :class:`ToolLoop` counts the ``tool_result``
blocks of the conversation to decide which turn it is in.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from starlette.responses import Response
from starlette.routing import Route

from corral.testing._fake_http import FakeModelServer as FakeModelServer
from corral.testing._fake_http import FakeReply as FakeReply
from corral.testing._fake_http import FakeToolCall as FakeToolCall
from corral.testing._fake_http import Fault as Fault
from corral.testing._fake_http import Plan, split_text
from corral.testing._fake_http import RecordedRequest as RecordedRequest
from corral.testing._fake_http import ToolLoop as ToolLoop


def count_tool_results(messages: object) -> int:
    """How many ``tool_result`` blocks a Messages API conversation holds."""
    if not isinstance(messages, list):
        return 0
    count = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            count += sum(
                1 for b in content if isinstance(b, dict) and b.get("type") == "tool_result"
            )
    return count


class FakeAnthropicServer(FakeModelServer):
    """A fake Messages API server; ``base_url`` is the root the SDK appends ``/v1/messages`` to."""

    @property
    def base_url(self) -> str:
        return self.root_url

    def routes(self) -> list[Route]:
        return [Route("/v1/messages", self.handle, methods=["POST"])]

    def tool_results(self, body: dict[str, Any]) -> int:
        return count_tool_results(body.get("messages"))

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": _error_type(status), "message": message}}

    def answer(self, body: dict[str, Any], reply: FakeReply, model: str, plan: Plan) -> Response:
        message = self._message(reply, model, self.next_id("msg_"))
        if body.get("stream"):
            events = [
                f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
                for event in self._events(message, reply)
            ]
            return plan.event_stream(events)
        return plan.json_response(message)

    def _blocks(self, reply: FakeReply) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if reply.text:
            blocks.append({"type": "text", "text": reply.text})
        for call in reply.tool_calls:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call.id or self.next_id("toolu_"),
                    "name": call.name,
                    "input": json.loads(call.arguments_json()),
                }
            )
        return blocks

    def _message(self, reply: FakeReply, model: str, message_id: str) -> dict[str, Any]:
        return {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": self._blocks(reply),
            "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens},
        }

    @staticmethod
    def _events(message: dict[str, Any], reply: FakeReply) -> Iterator[dict[str, Any]]:
        start = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": reply.input_tokens, "output_tokens": 1},
        }
        yield {"type": "message_start", "message": start}
        for index, block in enumerate(message["content"]):
            if block["type"] == "text":
                yield {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                }
                for piece in split_text(block["text"]):
                    yield {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "text_delta", "text": piece},
                    }
            else:
                yield {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {**block, "input": {}},
                }
                for piece in split_text(json.dumps(block["input"]), 2):
                    yield {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": piece},
                    }
            yield {"type": "content_block_stop", "index": index}
        yield {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": reply.output_tokens},
        }
        yield {"type": "message_stop"}


def _error_type(status: int) -> str:
    if status == 429:
        return "rate_limit_error"
    if status == 529:
        return "overloaded_error"
    return "api_error" if status >= 500 else "invalid_request_error"
