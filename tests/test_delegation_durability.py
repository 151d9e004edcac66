"""Delegation survives real worker deaths: a ``corral worker`` SIGKILLed while a child runs.

The cluster of :mod:`test_durability` (``corral worker`` subprocesses on one
SQLite ``CORRAL_HOME``, the fake OpenAI server driving the ``clerk`` agent, the
side-effect tools of :mod:`durable_tools`), with a ``boss`` agent on the
scripted model that hands the work to the clerk through ``agents_exec``.
"""

from __future__ import annotations

import json
import signal
from collections import Counter

from corral.core.events import EventType
from corral.core.runs import RunState
from corral.resources.loader import load_text
from corral.runtime.operations import submit as submit_run
from corral.testing.fake_openai import FakeReply
from fixtures_models import fake_openai_fixture, openai_server_fixture
from test_durability import SLOW, Cluster, call, check_journal, cluster

__all__ = ["cluster", "fake_openai_fixture", "openai_server_fixture"]

BOSS = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: boss-model}
spec:
  provider: scripted
  script:
    - tool_calls: [{name: agents_exec, arguments: {agent: clerk, input: "do the work"}}]
    - text: "the clerk reported back"
---
apiVersion: corral/v1
kind: Agent
metadata: {name: boss}
spec:
  model: boss-model
  links: [{agent: clerk, description: "does the work"}]
"""


async def test_sigkill_while_a_child_runs_resumes_one_child_and_finishes_the_parent_once(
    cluster: Cluster,
) -> None:
    await cluster.store.apply(load_text(BOSS, "boss.yaml"))
    cluster.model.add_reply(call("perform", "first", SLOW), FakeReply(text="work done"))
    parent, _ = await submit_run(cluster.store, "boss", "get the work done", bus=cluster.bus)
    a = cluster.start_worker("a", lease=2.0)
    await cluster.wait_for_state(parent.id, RunState.WAITING_CHILDREN)
    await cluster.wait_for_effect("first")  # the child is in its slow tool call
    a.signal(signal.SIGKILL)
    assert await a.exited() == -signal.SIGKILL

    cluster.start_worker("b")
    record = await cluster.wait_for_state(parent.id, RunState.SUCCEEDED)
    assert record.output == "the clerk reported back"

    children = await cluster.store.list_children(parent.id)
    assert len(children) == 1  # the parent's replay found its child, and started no other
    (child,) = children
    assert (child.state, child.output, child.attempts) == (RunState.SUCCEEDED, "work done", 2)
    assert sorted(cluster.effects().values()) == ["first"]  # the child's effect happened once
    check_journal(await cluster.events(child.id))
    events = await cluster.events(parent.id)
    check_journal(events)  # one run.start, one run.finish
    kinds = Counter(e.type for e in events)
    assert kinds[EventType.CHILD_START] == kinds[EventType.CHILD_FINISH] == 1
    (result,) = [e.data.to_dict() for e in events if e.type is EventType.TOOL_RESULT]
    assert result["output"] == "work done"
    tree = json.loads(await cluster.corral("tasks", "get", child.id, "-o", "json"))
    assert tree["state"] == "succeeded"
