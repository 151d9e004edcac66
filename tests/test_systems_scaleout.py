"""An agent system on PostgreSQL + NATS with two ``corral worker`` processes, one
SIGKILLed while both branches of the fan-out run: every node run executes once, the
join happens once, each idempotent side effect happens once. Node runs are created by
the workers' inbox consumers from the agent messages NATS delivers (the cluster of
:mod:`test_scaleout`, the system of :mod:`test_systems_durability`)."""

from __future__ import annotations

import json
import signal
from collections import Counter

from corral.core.events import EventType
from corral.core.runs import RunState
from corral.resources.loader import load_text
from corral.runtime.system_runs import submit_system
from nats_servers import nats_prefix_fixture, nats_server_url_fixture
from test_durability import check_journal, eventually, fake_openai_fixture, openai_server_fixture
from test_scaleout import ScaleOutCluster, cluster
from test_systems_durability import SYSTEM

__all__ = [
    "cluster",
    "fake_openai_fixture",
    "nats_prefix_fixture",
    "nats_server_url_fixture",
    "openai_server_fixture",
]


async def test_two_workers_one_killed_while_both_branches_run_each_node_once(
    cluster: ScaleOutCluster,
) -> None:
    await cluster.store.apply(load_text("\n---\n".join(map(json.dumps, SYSTEM)), "team.yaml"))
    run, _ = await submit_system(cluster.store, "team", "write about otters", bus=cluster.bus)
    a = cluster.start_worker("a", lease=2.0, concurrency=2)
    cluster.start_worker("b", lease=2.0, concurrency=2)

    async def both_branches() -> bool | None:
        return len(cluster.effects()) == 2 or None

    await eventually(both_branches, "both branches in their slow tool calls")
    a.signal(signal.SIGKILL)
    assert await a.exited() == -signal.SIGKILL

    record = await cluster.wait_for_state(run.id, RunState.SUCCEEDED)
    assert record.output == "the report"
    children = await cluster.store.list_children(run.id)
    assert Counter(c.agent for c in children) == {
        "planner": 1,
        "researcher": 1,
        "critic": 1,
        "writer": 1,
    }
    assert sorted(cluster.effects().values()) == ["doubt", "research"]
    (writer,) = [c for c in children if c.agent == "writer"]
    assert [i["from"] for i in json.loads(writer.input)["inputs"]] == ["critic", "researcher"]
    events = await cluster.events(run.id)
    check_journal(events)
    kinds = Counter(e.type for e in events)
    assert kinds[EventType.BRANCH_JOIN] == 1
    assert kinds[EventType.CHILD_START] == kinds[EventType.CHILD_FINISH] == 4
    messages = await cluster.store.list_agent_messages(run.id)
    assert len(messages) == 6
    # the node runs came from NATS deliveries taken by the workers' inbox consumers
    assert any(m.attempt >= 1 for m in messages), [(m.to_agent, m.attempt) for m in messages]
