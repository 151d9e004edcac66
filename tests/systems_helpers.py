"""What the tests of agent systems and delegation share: scripted resources as documents,
applying them, reading a run back, and an agent system's input message delivered through
the in-process bus."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corral.bus.local import LocalBus
from corral.core.agent_messages import AgentMessage
from corral.core.events import EventType
from corral.core.runs import RunRecord
from corral.resources.loader import load_text
from corral.runtime.inbox import InboxConsumer
from corral.runtime.system_messages import message_id
from corral.store import Store


def model(name: str, *turns: dict[str, Any]) -> str:
    """A scripted ModelEndpoint: each turn a dict (text, tool_calls, tokens)."""
    return json.dumps(
        {
            "apiVersion": "corral/v1",
            "kind": "ModelEndpoint",
            "metadata": {"name": name},
            "spec": {"provider": "scripted", "script": list(turns)},
        }
    )


def agent(name: str, model_name: str, **spec: Any) -> str:
    return json.dumps(
        {
            "apiVersion": "corral/v1",
            "kind": "Agent",
            "metadata": {"name": name},
            "spec": {"model": model_name, **spec},
        }
    )


def system(name: str, **spec: Any) -> str:
    return json.dumps(
        {
            "apiVersion": "corral/v1",
            "kind": "AgentSystem",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


def answering(name: str, *texts: str, **spec: Any) -> list[str]:
    """An agent on a scripted model of its own that answers ``texts`` in turn."""
    turns = [{"text": t, "input_tokens": 10, "output_tokens": 2} for t in texts]
    return [model(f"{name}-model", *turns), agent(name, f"{name}-model", **spec)]


ROUTER_SCHEMA = {
    "type": "object",
    "properties": {"next": {"type": "string"}, "topic": {"type": "string"}},
    "required": ["next", "topic"],
}


def desk(router_says: str, schema: dict[str, Any] = ROUTER_SCHEMA) -> list[str]:
    """The system ``desk``: its entry ``router`` answers ``router_says`` (under ``schema``)
    and is routed by that output to ``billing`` (which answers "refunded", the system's
    output) or ``support``."""
    return [
        *answering("router", router_says, output_schema=schema),
        *answering("billing", "refunded"),
        *answering("support", "helped"),
        system(
            "desk",
            entry="router",
            graph={"router": {"next": ["billing", "support"], "route": "by_output"}},
            output="billing",
        ),
    ]


def add_tool() -> str:
    """The python Tool ``add`` (tests/agent_tools.py: ``a + b``)."""
    tool = {
        "apiVersion": "corral/v1",
        "kind": "Tool",
        "metadata": {"name": "add"},
        "spec": {
            "type": "python",
            "python": {"function": "agent_tools:add", "path": str(Path(__file__).parent)},
        },
    }
    return json.dumps(tool)


def gated() -> list[str]:
    """The agent ``gated``: it calls the python tool ``add`` (2 + 3), which waits for a
    person's approval every time, then answers "added"."""
    add = {"name": "add", "arguments": {"a": 2, "b": 3}}
    return [
        add_tool(),
        model("gated-model", {"tool_calls": [add]}, {"text": "added"}),
        agent("gated", "gated-model", tools=["add"], approval={"policy": "always"}),
    ]


def role_denying(role: str, permission: str, *tools: str) -> list[str]:
    """The AgentRole ``role``: every tool (the ToolPermission ``everything``) but ``tools``
    (denied by the ToolPermission ``permission``)."""
    documents = [
        ("ToolPermission", "everything", {"tools": ["*"]}),
        ("ToolPermission", permission, {"tools": list(tools), "effect": "deny"}),
        ("AgentRole", role, {"permissions": ["everything", permission]}),
    ]
    return [
        json.dumps(
            {"apiVersion": "corral/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}
        )
        for kind, name, spec in documents
    ]


def call(tool: str, **arguments: Any) -> dict[str, Any]:
    """A scripted turn that calls ``tool`` with ``arguments``."""
    return {"tool_calls": [{"name": tool, "arguments": arguments}]}


async def apply(store: Store, *docs: str) -> None:
    await store.apply(load_text("\n---\n".join(docs), "t.yaml"))


async def get(store: Store, run: RunRecord) -> RunRecord:
    stored = await store.get_run(run.id)
    assert stored is not None
    return stored


def tool_results(events: list[Any]) -> list[dict[str, Any]]:
    return [e.data.to_dict() for e in events if e.type is EventType.TOOL_RESULT]


def input_message(run_id: str, to: str) -> AgentMessage:
    """The system's input message to ``to``, as its coordinator would store it."""
    ident = message_id(run_id, "input", to)
    return AgentMessage(
        id=ident,
        namespace="default",
        system_run_id=run_id,
        from_agent=None,
        to_agent=to,
        branch_id="1",
        parent_branch_id=None,
        type="input",
        payload="hello",
        idempotency_key=ident,
    )


async def deliver_all(bus: LocalBus, consumer: InboxConsumer) -> None:
    """Hand every delivery waiting on ``bus`` to ``consumer``."""
    for delivery in await bus.take_agent_messages(10, 0.5):
        await consumer.handle(delivery)
