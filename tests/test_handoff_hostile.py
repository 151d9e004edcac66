"""Hostile ``handoff`` situations on real workers: the target changed or deleted while the
run waits for a human, a handoff to the agent itself, ping-pong at ``max_handoffs``.

Every test runs twice (:mod:`backends`): on the embedded SQLite store, and on
PostgreSQL + NATS JetStream.
"""

from __future__ import annotations

import json
import signal

import pytest

from backends import Backend, backend_fixture, deployment_fixture
from corral.core.errors import ResourceError
from corral.core.events import EventType
from corral.core.runs import RunState
from corral.resources.loader import load_text
from corral.runtime.operations import submit as submit_run
from corral.testing.fake_openai import FakeReply
from fixtures_models import fake_openai_fixture, openai_server_fixture
from nats_servers import nats_prefix_fixture, nats_server_url_fixture
from server_harness import TESTS
from systems_helpers import agent, apply, call, get, model, tool_results
from test_durability import SLOW, Cluster, check_journal, cluster
from test_durability import call as durable_call

__all__ = [
    "backend_fixture",
    "cluster",
    "deployment_fixture",
    "fake_openai_fixture",
    "nats_prefix_fixture",
    "nats_server_url_fixture",
    "openai_server_fixture",
]

BY_RISK = {"policy": "by_risk", "min_risk": "high"}
RISKY = json.dumps(
    {
        "apiVersion": "corral/v1",
        "kind": "Tool",
        "metadata": {"name": "risky"},
        "spec": {
            "type": "python",
            "python": {"function": "server_tools:slow_echo", "path": str(TESTS)},
            "risk": "high",
        },
    }
)


def calls(*pairs: tuple[str, dict[str, object]]) -> dict[str, object]:
    return {"tool_calls": [{"name": n, "arguments": a} for n, a in pairs]}


async def test_a_handoff_whose_target_is_deleted_while_the_turn_waits_for_approval(
    backend: Backend,
) -> None:
    # the handoff (medium risk) runs at once; the risky call of the same turn waits for a
    # human; meanwhile triage is changed not to link billing and billing is deleted
    store = backend.store
    triage_model = model(
        "triage-model",
        calls(("handoff", {"agent": "billing"}), ("risky", {"text": "hi"})),
        {"text": "triage goes on"},
    )
    await apply(
        store,
        RISKY,
        triage_model,
        model("billing-model", {"text": "-"}, {"text": "billing answers"}),
        agent("billing", "billing-model"),
        agent(
            "triage",
            "triage-model",
            tools=["risky"],
            links=["billing"],
            approval={"policy": "by_risk", "min_risk": "high"},
        ),
    )
    run, _ = await backend.submit("triage", "go")
    await backend.drain()
    parked = await get(store, run)
    assert parked.state is RunState.WAITING_APPROVAL
    (approval,) = await store.list_approvals(run_id=run.id)
    assert approval.tool == "risky"

    await apply(
        store,
        agent(
            "triage",
            "triage-model",
            tools=["risky"],
            approval={"policy": "by_risk", "min_risk": "high"},
        ),
    )
    await store.delete_resource("default", "Agent", "billing")
    await backend.decide(approval.id, True, by="tester")
    await backend.drain()

    done = await get(store, run)
    events = await store.list_events(run.id)
    # the switch cannot be made (deleting billing took unlinking it first): the run
    # fails with the stable code naming the target, after the approved call's result was
    # kept; nothing runs under a deleted agent
    assert done.state is RunState.FAILED
    assert done.error is not None and done.error["code"] == "permission_denied"
    assert "billing" in done.error["message"]
    assert not [e for e in events if e.type is EventType.HANDOFF]
    assert [r["tool"] for r in tool_results(events)] == ["handoff", "risky"]
    assert tool_results(events)[-1]["output"] == "hi"


async def test_a_handoff_whose_link_is_revoked_while_the_turn_waits_is_not_made(
    backend: Backend,
) -> None:
    # as above, but billing stays: an admin only removed triage's link to it, which
    # must stop the switch the handoff call asked for before the change
    store = backend.store
    await apply(
        store,
        RISKY,
        model(
            "triage-model",
            calls(("handoff", {"agent": "billing"}), ("risky", {"text": "hi"})),
            {"text": "triage goes on"},
        ),
        model("billing-model", {"text": "-"}, {"text": "billing answers"}),
        agent("billing", "billing-model"),
        agent("triage", "triage-model", tools=["risky"], links=["billing"], approval=BY_RISK),
    )
    run, _ = await backend.submit("triage", "go")
    await backend.drain()
    (approval,) = await store.list_approvals(run_id=run.id)
    await apply(store, agent("triage", "triage-model", tools=["risky"], approval=BY_RISK))
    await backend.decide(approval.id, True, by="tester")
    await backend.drain()

    done = await get(store, run)
    assert done.state is RunState.FAILED
    assert done.error is not None and done.error["code"] == "permission_denied", done.error
    assert "billing" in done.error["message"]
    assert done.active_agent in (None, "triage")
    events = await store.list_events(run.id)
    assert not [e for e in events if e.type is EventType.HANDOFF]
    assert tool_results(events)[-1]["output"] == "hi"


async def test_a_handoff_to_the_agent_itself_cannot_be_linked(backend: Backend) -> None:
    with pytest.raises(ResourceError, match="cannot link to itself"):
        await apply(
            backend.store,
            model("loop-model", call("handoff", agent="looper")),
            agent("looper", "loop-model", links=["looper"]),
        )


TRIAGE = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: triage-model}
spec:
  provider: scripted
  script:
    - tool_calls: [{name: handoff, arguments: {agent: clerk, reason: "work to do"}}]
---
apiVersion: corral/v1
kind: Agent
metadata: {name: triage}
spec:
  model: triage-model
  links: [{agent: clerk, description: "does the work"}]
"""


async def test_sigkill_after_a_handoff_resumes_under_the_target_once(cluster: Cluster) -> None:
    # a real ``corral worker`` dies (SIGKILL) in the target's slow tool call, after the
    # switch: the next worker goes on under the target, hands off no second time, and the
    # tool's effect happens once
    await cluster.store.apply(load_text(TRIAGE, "triage.yaml"))
    cluster.model.add_reply(durable_call("perform", "first", SLOW), FakeReply(text="work done"))
    run, _ = await submit_run(cluster.store, "triage", "get the work done", bus=cluster.bus)
    a = cluster.start_worker("a", lease=2.0)
    await cluster.wait_for_effect("first")
    a.signal(signal.SIGKILL)
    assert await a.exited() == -signal.SIGKILL

    cluster.start_worker("b")
    record = await cluster.wait_for_state(run.id, RunState.SUCCEEDED)

    assert (record.output, record.agent, record.active_agent) == ("work done", "triage", "clerk")
    assert sorted(cluster.effects().values()) == ["first"]
    events = await cluster.events(run.id)
    check_journal(events)
    assert [e.type for e in events].count(EventType.HANDOFF) == 1
