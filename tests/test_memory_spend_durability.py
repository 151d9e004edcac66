"""A run whose memory write was embedded and charged survives a real worker death
(SIGKILL) without losing or doubling that charge: the resumed run counts it from the
journal, embeds nothing again, and ``corral tasks get`` shows it once.

The setting of :mod:`test_durability`: ``corral worker`` subprocesses on one SQLite
``CORRAL_HOME``, the fake OpenAI server as chat model and (``/v1/embeddings``) as the
Memory's embedding model, priced on its endpoint.
"""

from __future__ import annotations

import json
import signal

import pytest

from corral.core.events import EventType
from corral.core.runs import RunState
from corral.resources.loader import load_text
from corral.testing.fake_openai import FakeReply, FakeToolCall
from fixtures_models import fake_openai_fixture, openai_server_fixture
from test_durability import SLOW, Cluster, call, check_journal, cluster, submit

__all__ = ["cluster", "fake_openai_fixture", "openai_server_fixture"]

TEXT = "the otters sleep by the weir"  # 6 tokens on the fake server: $0.006 at this price


def memory_resources(base_url: str) -> str:
    return f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: embedder}}
spec:
  provider: openai
  model: embed-model
  base_url: {base_url}
  retry: {{max_attempts: 1}}
  pricing: {{input_per_million: 1000}}
---
apiVersion: corral/v1
kind: Memory
metadata: {{name: notes}}
spec: {{embedding: {{model: embedder, dimensions: 16}}}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: clerk}}
spec:
  model: fake
  tools: [perform]
  memory: [{{ref: notes, access: write}}]
"""


def embeddings(cluster: Cluster) -> list[list[str]]:
    return [r.json["input"] for r in cluster.model.requests if r.path.endswith("/embeddings")]


async def test_sigkill_after_a_charged_memory_write_charges_it_once(cluster: Cluster) -> None:
    await cluster.store.apply(load_text(memory_resources(cluster.model.base_url), "mem.yaml"))
    write = FakeToolCall("memory_write", {"text": TEXT, "key": "otters"})
    cluster.model.add_reply(
        FakeReply(tool_calls=[write]), call("perform", "slow", SLOW), FakeReply(text="all done")
    )
    run_id = await submit(cluster, "remember, then work")
    a = cluster.start_worker("a", lease=2.0)
    await cluster.wait_for_effect("slow")  # the second step's call is in its slow part
    await cluster.wait_for_event(run_id, EventType.TOOL_CALL)
    journaled = [e for e in await cluster.events(run_id) if e.type is EventType.MEMORY_WRITE]
    a.signal(signal.SIGKILL)
    assert await a.exited() == -signal.SIGKILL
    assert [e.data.cost_usd for e in journaled] == [pytest.approx(0.006)]

    cluster.start_worker("b")
    record = await cluster.wait_for_state(run_id, RunState.SUCCEEDED)

    assert record.output == "all done" and record.attempts == 2
    assert embeddings(cluster) == [[TEXT]]  # embedded once, before the kill
    events = await cluster.events(run_id)
    check_journal(events)
    writes = [e for e in events if e.type is EventType.MEMORY_WRITE]
    assert len(writes) == 1 and writes[0].data.usage["input_tokens"] == 6
    # the chat model has no prices: the run's whole cost is the one embedding
    assert record.cost_usd == pytest.approx(0.006)
    shown = json.loads(await cluster.corral("tasks", "get", run_id, "-o", "json"))
    assert shown["cost_usd"] == pytest.approx(0.006)
    chat = sum(
        e.data.usage["input_tokens"]
        for e in events
        if e.type is EventType.MESSAGE_CREATE and e.data.usage is not None
    )
    assert shown["usage"]["input_tokens"] == chat + 6
