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

It also serves ``POST /v1/embeddings`` (and Azure's deployment path): each input
gets :func:`hashed_embedding` (words hashed into ``embedding_dimensions`` buckets, so
texts sharing words are close), or what :meth:`FakeOpenAIServer.embed_with` sets;
the faults apply to it as to chat requests, the queued replies do not.

The protocol-neutral machinery (:class:`FakeModelServer`, the reply and fault
types, and what a server answers in which order) lives in
:mod:`corral.testing._fake_http`; its public names are re-exported here (the
``import X as X`` lines), so a test imports everything from this module.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.testing._fake_http import FakeModelServer as FakeModelServer
from corral.testing._fake_http import FakeReply as FakeReply
from corral.testing._fake_http import FakeToolCall as FakeToolCall
from corral.testing._fake_http import Fault as Fault
from corral.testing._fake_http import Plan, record, split_text
from corral.testing._fake_http import RecordedRequest as RecordedRequest
from corral.testing._fake_http import ToolLoop as ToolLoop

_WORD = re.compile(r"[^\W_]+")

#: how the fake server embeds one text into a vector of a given length
Embedder = Callable[[str, int], list[float]]


def hashed_embedding(text: str, dimensions: int) -> list[float]:
    """A deterministic unit vector for ``text``: each lower-cased word adds +1 or -1 to a
    bucket chosen by its hash, so texts sharing words point alike (no meaning beyond that)."""
    vector = [0.0] * dimensions
    for word in _WORD.findall(text.lower()):
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        bucket = int.from_bytes(digest[:4], "little") % dimensions
        vector[bucket] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector))
    if norm == 0:
        vector[0] = 1.0
        return vector
    return [x / norm for x in vector]


class FakeOpenAIServer(FakeModelServer):
    """A fake Chat Completions and Embeddings server; ``base_url`` ends in ``/v1`` as
    the SDK expects.

    For ``azure-openai`` give the SDK ``root_url`` as the Azure endpoint.
    ``stream_usage=False`` ignores ``stream_options.include_usage``: a streamed answer
    reports no usage, as llama.cpp's server does.
    """

    def __init__(
        self, *, embedding_dimensions: int = 16, stream_usage: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.stream_usage = stream_usage
        self.embedding_dimensions = embedding_dimensions
        self._initial_dimensions = embedding_dimensions
        self.embedder: Embedder = hashed_embedding

    def embed_with(
        self, embedder: Embedder | None = None, *, dimensions: int | None = None
    ) -> None:
        """Embed with ``embedder`` (``None``: :func:`hashed_embedding`) and/or answer vectors of
        ``dimensions``, until :meth:`reset`."""
        self.embedder = embedder or hashed_embedding
        if dimensions is not None:
            self.embedding_dimensions = dimensions

    def reset(self) -> None:
        super().reset()
        self.embedder = hashed_embedding
        self.embedding_dimensions = self._initial_dimensions

    async def handle_embeddings(self, request: Request) -> Response:
        """Answer an Embeddings request (after the next fault, if any)."""
        recorded = await record(request)
        plan = self.plan_without_reply(recorded)
        failed = await self.fault_response(plan)
        if failed is not None:
            return failed
        raw = recorded.json.get("input")
        texts = [raw] if isinstance(raw, str) else raw
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            message = "fake server: 'input' must be a string or a list of strings"
            return JSONResponse(self.error_body(400, message), status_code=400)
        tokens = sum(len(_WORD.findall(t)) or 1 for t in texts)
        body = {
            "object": "list",
            "model": str(recorded.json.get("model") or self.model),
            "data": [
                {
                    "object": "embedding",
                    "index": index,
                    "embedding": self.embedder(text, self.embedding_dimensions),
                }
                for index, text in enumerate(texts)
            ],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        return plan.json_response(body)

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    def routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions", self.handle, methods=["POST"]),
            Route(
                "/openai/deployments/{deployment}/chat/completions", self.handle, methods=["POST"]
            ),
            Route("/v1/embeddings", self.handle_embeddings, methods=["POST"]),
            Route(
                "/openai/deployments/{deployment}/embeddings",
                self.handle_embeddings,
                methods=["POST"],
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
            asked = bool((body.get("stream_options") or {}).get("include_usage"))
            usage = asked and self.stream_usage
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
