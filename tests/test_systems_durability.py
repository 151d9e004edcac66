"""A system run survives a real worker death: a ``corral worker`` SIGKILLed while a node
run is in its slow tool call, on the cluster of :mod:`test_durability` (``corral worker``
subprocesses on one SQLite ``CORRAL_HOME``, the side-effect tools of :mod:`durable_tools`).

The diamond of :mod:`test_systems` on scripted models: the researcher and the critic
each call the idempotent ``perform`` tool (slow); the writer joins both (``all``).
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from typing import Any

from corral.core.events import EventType
from corral.core.runs import RunState
from corral.resources.loader import load_text
from corral.runtime.system_runs import submit_system
from fixtures_models import fake_openai_fixture, openai_server_fixture
from test_durability import SLOW, Cluster, check_journal, cluster, eventually

__all__ = ["cluster", "fake_openai_fixture", "openai_server_fixture"]


def _scripted(name: str, *turns: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "corral/v1",
            "kind": "ModelEndpoint",
            "metadata": {"name": f"{name}-model"},
            "spec": {"provider": "scripted", "script": list(turns)},
        },
        {
            "apiVersion": "corral/v1",
            "kind": "Agent",
            "metadata": {"name": name},
            "spec": {"model": f"{name}-model", "tools": ["perform"]},
        },
    ]


def _working(name: str, label: str) -> list[dict[str, Any]]:
    """An agent that performs the effect ``label`` (slowly), then answers."""
    perform = {"name": "perform", "arguments": {"label": label, "seconds": SLOW}}
    return _scripted(name, {"tool_calls": [perform]}, {"text": f"{label} finished"})


SYSTEM = [
    *_scripted("planner", {"text": "the plan"}),
    *_working("researcher", "research"),
    *_working("critic", "doubt"),
    *_scripted("writer", {"text": "the report"}),
    {
        "apiVersion": "corral/v1",
        "kind": "AgentSystem",
        "metadata": {"name": "team"},
        "spec": {
            "entry": "planner",
            "graph": {
                "planner": {"next": ["researcher", "critic"]},
                "researcher": {"next": ["writer"]},
                "critic": {"next": ["writer"]},
                "writer": {"join": "all"},
            },
        },
    },
]


async def test_sigkill_mid_system_runs_each_node_once_and_joins_once(cluster: Cluster) -> None:
    await cluster.store.apply(load_text("\n---\n".join(map(json.dumps, SYSTEM)), "team.yaml"))
    run, _ = await submit_system(cluster.store, "team", "write about otters", bus=cluster.bus)
    a = cluster.start_worker("a", lease=2.0)

    async def working() -> bool | None:
        return bool(cluster.effects()) or None

    await eventually(working, "a node run in its slow tool call")
    a.signal(signal.SIGKILL)
    assert await a.exited() == -signal.SIGKILL

    cluster.start_worker("b")
    record = await cluster.wait_for_state(run.id, RunState.SUCCEEDED)
    assert record.output == "the report"

    children = await cluster.store.list_children(run.id)
    assert Counter(c.agent for c in children) == {
        "planner": 1,
        "researcher": 1,
        "critic": 1,
        "writer": 1,
    }
    assert all(c.state is RunState.SUCCEEDED for c in children)
    assert sorted(cluster.effects().values()) == ["doubt", "research"]  # each effect once
    (writer,) = [c for c in children if c.agent == "writer"]
    inputs = json.loads(writer.input)["inputs"]
    assert [(i["from"], i["output"]) for i in inputs] == [
        ("critic", "doubt finished"),
        ("researcher", "research finished"),
    ]
    events = await cluster.events(run.id)
    check_journal(events)  # gap-free, one run.start, one run.finish
    kinds = Counter(e.type for e in events)
    assert kinds[EventType.BRANCH_JOIN] == 1
    assert kinds[EventType.CHILD_START] == kinds[EventType.CHILD_FINISH] == 4
    assert kinds[EventType.MESSAGE_SEND] == 6 and kinds[EventType.MESSAGE_DELIVER] == 4
    assert len(await cluster.store.list_agent_messages(run.id)) == 6
