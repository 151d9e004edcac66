"""A fake OpenAI-compatible server over real HTTP, for tests and benchmarks.

:class:`FakeOpenAIServer` serves ``POST /v1/chat/completions`` (and Azure's
``/openai/deployments/{deployment}/chat/completions``), streaming and not::

    with FakeOpenAIServer() as server:
        server.add_reply(FakeReply(tool_calls=[FakeToolCall("lookup", {"q": "x"})]))
        server.add_reply(FakeReply(text="done"))
        server.fail(429, times=1, retry_after="0.1")    # the first call is rate limited
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test")
        ...
        assert len(server.requests) == 3

The protocol-neutral machinery (:class:`FakeModelServer`, the reply and fault
types, and what a server answers in which order) lives in
:mod:`corral.testing._fake_http`; its public names are re-exported here (the
``import X as X`` lines), so a test imports everything from this module.
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


class FakeOpenAIServer(FakeModelServer):
    """A fake Chat Completions server; ``base_url`` ends in ``/v1`` as the SDK expects.

    For ``azure-openai`` give the SDK ``root_url`` as the Azure endpoint.
    """

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    def routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions", self.handle, methods=["POST"]),
            Route(
                "/openai/deployments/{deployment}/chat/completions", self.handle, methods=["POST"]
            ),
        ]

    def tool_results(self, body: dict[str, Any]) -> int:
        messages = body.get("messages") or []
        return sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "tool")

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": _error_type(status), "code": None}}

    def answer(self, body: dict[str, Any], reply: FakeReply, model: str, plan: Plan) -> Response:
        completion_id = self.next_id("chatcmpl-")
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            events = [
                f"data: {json.dumps(chunk)}\n\n"
                for chunk in self._chunks(reply, model, completion_id, usage)
            ]
            events.append("data: [DONE]\n\n")
            return plan.event_stream(events)
        return plan.json_response(self._completion(reply, model, completion_id))

    def _calls(self, reply: FakeReply) -> list[tuple[str, FakeToolCall]]:
        return [(call.id or self.next_id("call_"), call) for call in reply.tool_calls]

    @staticmethod
    def _usage(reply: FakeReply) -> dict[str, int]:
        return {
            "prompt_tokens": reply.input_tokens,
            "completion_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
        }

    def _completion(self, reply: FakeReply, model: str, completion_id: str) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        calls = self._calls(reply)
        if calls:
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments_json()},
                }
                for call_id, call in calls
            ]
        return {
            "id": completion_id,
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if calls else "stop",
                    "logprobs": None,
                }
            ],
            "usage": self._usage(reply),
        }

    def _chunks(
        self, reply: FakeReply, model: str, completion_id: str, include_usage: bool
    ) -> Iterator[dict[str, Any]]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        yield chunk({"role": "assistant", "content": ""})
        for piece in split_text(reply.text):
            yield chunk({"content": piece})
        calls = self._calls(reply)
        for index, (call_id, call) in enumerate(calls):
            # like the real API: id and name first, then the arguments in pieces
            yield chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call_id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": ""},
                        }
                    ]
                }
            )
            for piece in split_text(call.arguments_json(), 2):
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        yield chunk({}, "tool_calls" if calls else "stop")
        if include_usage:
            yield {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [],
                "usage": self._usage(reply),
            }


def _error_type(status: int) -> str:
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"
