"""Remote A2A agents for the ``a2a`` tool tests, built with the official ``a2a-sdk``.

:func:`serving` runs one uvicorn server on 127.0.0.1 (in a thread) with these agents,
each at ``/NAME`` (card at ``/NAME/.well-known/agent-card.json``), made of the SDK's
``DefaultRequestHandler``, ``InMemoryTaskStore``, card and JSON-RPC routes:

echo    a Message with a data part: {text, idempotency_key} of the request
slow    a Task, completed after the JSON text's ``seconds``
flood   a Message of ``size`` (the JSON text's) bytes of "x"
fail    a Task that fails, its status message the request's text
hang    a Task that never finishes (asleep)
tasker  a Task completed with an artifact "done: TEXT" (headers of the call recorded)
resty   tasker over HTTP+JSON only (its card names no JSON-RPC interface)

and, hand-written (the SDK would never answer so), ``/liar`` (a valid card, then a
JSON-RPC answer that is not A2A), ``/huge`` (a card, then 5 MiB of JSON) and
``/moved`` (the card redirects to a metadata address); the hostile remotes of
tests/test_a2a_hostile.py: ``/deep`` (a card nested 100 000 levels deep), ``/hugecard``
(a card of 5 MiB),
``/deepanswer`` (a valid card, then a JSON-RPC answer nested as deep), ``/deepdataN``
(a valid card, then a message whose data part nests N levels), ``/metadata``
(a card naming a cloud metadata address as its interface) and ``/endless`` (a valid
card, then an answer that never ends: an SSE comment every 50 ms).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from a2a.helpers.proto_helpers import new_task_from_user_message, new_text_artifact
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events.event_queue_v2 import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import (
    create_agent_card_routes,
    create_jsonrpc_routes,
    create_rest_routes,
)
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    Message,
    Part,
    Role,
)
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Value
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

CARD = "/.well-known/agent-card.json"


@dataclass
class Remote:
    """The running server: its URL, and the headers each call to ``tasker`` carried."""

    port: int = 0
    headers: list[dict[str, str]] = field(default_factory=list)

    def url(self, agent: str) -> str:
        return f"http://127.0.0.1:{self.port}/{agent}"

    def card(self, agent: str) -> str:
        return self.url(agent) + CARD


#: the agents served over HTTP+JSON only
REST_ONLY = ("resty",)


def _card(remote: Remote, name: str) -> AgentCard:
    binding = "HTTP+JSON" if name in REST_ONLY else "JSONRPC"
    return AgentCard(
        name=name,
        description=f"test agent {name}",
        version="1.0",
        supported_interfaces=[
            AgentInterface(url=remote.url(name), protocol_binding=binding, protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
    )


def _reply(context: RequestContext, *parts: Part) -> Message:
    return Message(
        message_id=f"reply-{time.monotonic_ns()}",
        role=Role.ROLE_AGENT,
        context_id=context.context_id or "",
        parts=list(parts),
    )


class Scripted(AgentExecutor):
    """One of the agents of the module docstring, by name."""

    def __init__(self, name: str, remote: Remote) -> None:
        self.name, self.remote = name, remote

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        text = context.get_user_input()
        message = context.message
        assert message is not None
        if self.name == "echo":
            value = Value()
            value.struct_value.update(
                {
                    "text": text,
                    "idempotency_key": message.message_id,
                    "metadata": MessageToDict(message.metadata),
                }
            )
            await event_queue.enqueue_event(_reply(context, Part(data=value)))
            return
        if self.name == "flood":
            size = json.loads(text)["size"]
            await event_queue.enqueue_event(_reply(context, Part(text="x" * size)))
            return
        task = context.current_task or new_task_from_user_message(message)
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work()
        if self.name == "slow":
            await asyncio.sleep(float(json.loads(text)["seconds"]))
        elif self.name == "hang":
            await asyncio.sleep(3600)
        elif self.name == "fail":
            await updater.failed(updater.new_agent_message([Part(text=text)]))
            return
        if self.name in ("tasker", "resty"):
            headers = context.call_context.state.get("headers", {})
            self.remote.headers.append(dict(headers))
        artifact = new_text_artifact(name="answer", text=f"done: {text}")
        await updater.add_artifact(list(artifact.parts), name="answer")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


AGENTS = ("echo", "slow", "flood", "fail", "hang", "tasker", "resty")


def _liars(remote: Remote) -> list[BaseRoute]:
    async def card(request: Request) -> Response:
        name = request.path_params["name"]
        return JSONResponse(agent_card_to_dict(_card(remote, name)))

    async def liar(request: Request) -> Response:
        body = await request.json()
        return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": {"task": "nope"}})

    async def huge(request: Request) -> Response:
        body = await request.json()
        blob = "y" * (5 * 1024 * 1024)
        return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": {"message": blob}})

    async def moved(request: Request) -> Response:
        return RedirectResponse("http://169.254.169.254/latest/meta-data", status_code=302)

    deep = "[" * 100_000 + "]" * 100_000

    async def deep_data(request: Request) -> Response:
        body = await request.json()
        depth = int(request.path_params["depth"])
        data = json.loads('{"a": ' * depth + "{}" + "}" * depth)
        part = {"data": data, "mediaType": "application/json"}
        answer = {"messageId": "r", "role": "ROLE_AGENT", "parts": [part]}
        return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": {"message": answer}})

    async def huge_card(request: Request) -> Response:
        card = agent_card_to_dict(_card(remote, "hugecard"))
        return JSONResponse({**card, "description": "z" * (5 * 1024 * 1024)})

    async def deep_card(request: Request) -> Response:
        return Response(deep, media_type="application/json")

    async def deep_answer(request: Request) -> Response:
        return Response(deep, media_type="application/json")

    async def metadata_card(request: Request) -> Response:
        card = _card(remote, "metadata")
        card.supported_interfaces[0].url = "http://169.254.169.254/latest/meta-data"
        return JSONResponse(agent_card_to_dict(card))

    async def endless(request: Request) -> Response:
        async def comments() -> Any:
            while True:
                yield b": still here\n"
                await asyncio.sleep(0.05)

        return StreamingResponse(comments(), media_type="text/event-stream")

    return [
        Route("/moved" + CARD, moved, methods=["GET"]),
        Route("/deep" + CARD, deep_card, methods=["GET"]),
        Route("/hugecard" + CARD, huge_card, methods=["GET"]),
        Route("/metadata" + CARD, metadata_card, methods=["GET"]),
        Route("/deepanswer", deep_answer, methods=["POST"]),
        Route("/deepdata{depth:int}", deep_data, methods=["POST"]),
        Route("/endless", endless, methods=["POST"]),
        Route("/{name:str}" + CARD, card, methods=["GET"]),
        Route("/liar", liar, methods=["POST"]),
        Route("/huge", huge, methods=["POST"]),
    ]


def _current_card(remote: Remote, name: str) -> Any:
    """The card with the port the server listens on (known once it listens)."""

    async def modifier(card: AgentCard) -> AgentCard:
        return _card(remote, name)

    return modifier


def _app(remote: Remote) -> Starlette:
    routes: list[BaseRoute] = []
    for name in AGENTS:
        card = _card(remote, name)
        handler = DefaultRequestHandler(
            agent_executor=Scripted(name, remote), task_store=InMemoryTaskStore(), agent_card=card
        )
        routes += create_agent_card_routes(
            card, card_modifier=_current_card(remote, name), card_url=f"/{name}{CARD}"
        )
        if name in REST_ONLY:
            # (not its tenant Mount of "/{tenant}", which would shadow the routes after it)
            rest = create_rest_routes(handler, path_prefix=f"/{name}")
            routes += [route for route in rest if isinstance(route, Route)]
        else:
            routes += create_jsonrpc_routes(handler, rpc_url=f"/{name}")
    return Starlette(routes=routes + _liars(remote))


@contextmanager
def serving() -> Iterator[Remote]:
    """The agents on a free port until the end of the block."""
    remote = Remote()
    config = uvicorn.Config(
        _app(remote), host="127.0.0.1", port=0, log_level="warning", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the A2A remote did not start"
        time.sleep(0.02)
    remote.port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield remote
    finally:
        server.should_exit = True
        thread.join(10)


def json_of(value: Any) -> Any:
    """``value`` through JSON (what a tool result looks like to the model)."""
    return json.loads(json.dumps(value))
