"""What an agent's memory calls pay their embedding model is the run's spend: the
``memory.write``/``memory.search`` events carry it (``usage``, ``cost_usd``), the
budget counts it (``max_tokens``, ``max_cost_usd`` stop the run), a resumed run counts
it from the journal once, and the stored run (``tasks get``) shows it.

The embedding model is the ``openai`` provider against the fake OpenAI server's
``/v1/embeddings`` (real HTTP), priced on its endpoint; the agent's turns are scripted
(free), so every token and cent of these runs is an embedding's.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from backends import Backend, backend_fixture, deployment_fixture
from corral.cli.events_view import memory_search_line, memory_write_line
from corral.core.events import Event, EventType, MemorySearchData, MemoryWriteData
from corral.core.memory import MemoryPlace
from corral.core.redaction import Redactor
from corral.core.runs import RunState
from corral.core.settings import Settings
from corral.engine.loop import AgentLoop
from corral.engine.replay import replay
from corral.models.registry import build_model
from corral.resources.kinds import Limits, Pricing
from corral.resources.memory import MemorySpec
from corral.store import Store
from corral.testing.fake_openai import FakeOpenAIServer, hashed_embedding
from corral.tools.memory import MemoryBinding, MemoryTool
from corral.tools.memory_backend import EMBED_BATCH, StoreMemoryBackend
from fixtures_models import endpoint
from nats_servers import nats_prefix_fixture, nats_server_url_fixture
from test_engine import Harness, turn
from test_memory_tools import DONE, apply, call, doc, scripted

__all__ = [
    "backend_fixture",
    "deployment_fixture",
    "nats_prefix_fixture",
    "nats_server_url_fixture",
]

DIMENSIONS = 8
#: a dollar per thousand tokens: one word's embedding costs a tenth of a cent
PRICE = Pricing(input_per_million=1000.0)
TEXT = "the launch code word is pineapple"  # 6 tokens on the fake server
QUERY = "launch code"  # 2 tokens


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(embedding_dimensions=DIMENSIONS) as fake:
        yield fake


@pytest.fixture
def fake(server: FakeOpenAIServer) -> FakeOpenAIServer:
    server.reset()
    return server


def embedded(server: FakeOpenAIServer) -> list[list[str]]:
    return [r.json["input"] for r in server.requests if r.path.endswith("/embeddings")]


class Tools:
    """Memory tools over the test's store, embedding on the fake server (priced)."""

    def __init__(self, store: Store, server: FakeOpenAIServer, stack: AsyncExitStack) -> None:
        self.store, self.server, self.stack = store, server, stack

    def __call__(self, *ops: str, **spec: Any) -> list[MemoryTool]:
        model = build_model(
            "embedder", endpoint("openai", self.server.base_url, pricing=PRICE), "sk-t"
        )
        self.stack.push_async_callback(model.aclose)
        memory = MemorySpec(embedding={"model": "embedder", "dimensions": DIMENSIONS}, **spec)  # type: ignore[arg-type]
        binding = MemoryBinding(
            "notes", memory, "write", StoreMemoryBackend(self.store, memory, model)
        )
        return [MemoryTool(op, [binding], self.store, Redactor) for op in ops]  # type: ignore[arg-type]


@pytest.fixture
async def tools(env: tuple[Store, Settings], fake: FakeOpenAIServer) -> AsyncIterator[Tools]:
    async with AsyncExitStack() as stack:
        yield Tools(env[0], fake, stack)


SCRIPT = [
    turn("", ("memory_write", {"text": TEXT})),
    turn("", ("memory_search", {"query": QUERY})),
    turn("done"),
]


def charged(events: list[Event]) -> list[tuple[str, int, float]]:
    """The memory events' charges: (type, tokens, cost), of those that carry one."""
    return [
        (e.type.value, e.data.usage["input_tokens"], e.data.cost_usd)
        for e in events
        if e.type in (EventType.MEMORY_WRITE, EventType.MEMORY_SEARCH) and e.data.usage is not None
    ]


async def test_a_run_is_charged_what_its_memory_calls_embed(tools: Tools, tmp_path: Path) -> None:
    harness = Harness(list(SCRIPT), list(tools("write", "search")), tmp_path)
    result = await harness.run("remember")
    assert result.state is RunState.SUCCEEDED
    assert charged(harness.events) == [
        ("memory.write", 6, pytest.approx(0.006)),
        ("memory.search", 2, pytest.approx(0.002)),
    ]
    assert result.cost_usd == pytest.approx(0.008)
    assert result.usage.input_tokens == 8 and result.usage.requests == 3 + 2
    finish = harness.events[-1]
    assert finish.type is EventType.RUN_FINISH and finish.data.cost_usd == pytest.approx(0.008)


async def test_a_memory_without_embedding_charges_nothing(
    env: tuple[Store, Settings], tmp_path: Path
) -> None:
    store, _ = env
    spec = MemorySpec()
    binding = MemoryBinding("notes", spec, "write", StoreMemoryBackend(store, spec))
    tools = [MemoryTool(op, [binding], store, Redactor) for op in ("write", "search")]  # type: ignore[arg-type]
    harness = Harness(list(SCRIPT), list(tools), tmp_path)
    result = await harness.run("remember")
    assert result.state is RunState.SUCCEEDED and result.cost_usd == 0
    memory = [e for e in harness.events if e.type.value.startswith("memory.")]
    assert len(memory) == 2 and all("usage" not in e.data.to_dict() for e in memory)


@pytest.mark.parametrize(
    ("limits", "limit"),
    [(Limits(max_cost_usd=0.005), "max_cost_usd"), (Limits(max_tokens=5), "max_tokens")],
)
async def test_memory_writes_past_a_limit_stop_the_run_with_budget_exceeded(
    tools: Tools, tmp_path: Path, limits: Limits, limit: str
) -> None:
    script = [
        turn("", ("memory_write", {"text": "one two three"})),
        turn("", ("memory_write", {"text": "four"}), ("memory_write", {"text": "five six seven"})),
        turn("never reached"),
    ]
    harness = Harness(script, list(tools("write")), tmp_path, limits=limits)
    result = await harness.run("remember")
    assert result.state is RunState.FAILED
    assert result.error is not None
    assert result.error["code"] == "budget_exceeded" and result.error["limit"] == limit
    # both calls of the second step were written, recorded and charged before the run stopped
    results = [e for e in harness.events if e.type is EventType.TOOL_RESULT]
    assert len(results) == 3 and not any(e.data.error for e in results)
    assert sorted(map(tuple, embedded(tools.server))) == [
        ("five six seven",),
        ("four",),
        ("one two three",),
    ]
    assert result.cost_usd == pytest.approx(0.007) and result.usage.input_tokens == 7
    finish = harness.events[-1]
    assert finish.type is EventType.RUN_FINISH and finish.data.cost_usd == pytest.approx(0.007)


async def test_a_resumed_run_counts_what_was_embedded_once(tools: Tools, tmp_path: Path) -> None:
    live = Harness(list(SCRIPT), list(tools("write", "search")), tmp_path)
    whole = await live.run("remember")
    # The process died after the write's result was journaled, before the search.
    cut = next(i for i, e in enumerate(live.events) if e.type is EventType.TOOL_RESULT)
    journal = live.events[: cut + 1]
    assert charged(journal) == [("memory.write", 6, pytest.approx(0.006))]

    resumed = Harness(list(SCRIPT), list(tools("write", "search")), tmp_path)
    resumed.events = list(journal)
    result = await AgentLoop(resumed.agent, "run_test", resumed.sink).resume(journal)

    assert result.state is RunState.SUCCEEDED
    assert result.cost_usd == pytest.approx(whole.cost_usd)
    assert result.usage == whole.usage
    # the resumed run embedded only its search (the live one's was lost with the crash)
    assert embedded(tools.server) == [[TEXT], [QUERY], [QUERY]]
    assert charged(resumed.events) == charged(live.events)


async def test_a_write_resumed_after_its_result_was_lost_embeds_and_charges_nothing_again(
    tools: Tools, tmp_path: Path
) -> None:
    """The crash came after the entry was stored and before its event was journaled: the
    replayed write finds the entry by its idempotency key, embeds nothing and charges
    nothing (that first embedding is not charged: the window a model turn has too)."""
    live = Harness(list(SCRIPT), list(tools("write", "search")), tmp_path)
    await live.run("remember")
    cut = next(i for i, e in enumerate(live.events) if e.type is EventType.MESSAGE_CREATE)
    journal = live.events[: cut + 1]
    resumed = Harness(list(SCRIPT), list(tools("write", "search")), tmp_path)
    result = await AgentLoop(resumed.agent, "run_test", resumed.sink).resume(journal)
    assert result.state is RunState.SUCCEEDED
    assert embedded(tools.server) == [[TEXT], [QUERY], [QUERY]]
    assert charged(resumed.events) == [("memory.search", 2, pytest.approx(0.002))]
    [write] = [e for e in resumed.events if e.type is EventType.MEMORY_WRITE]
    assert write.data.written is False and "usage" not in write.data.to_dict()


async def test_the_stored_run_shows_its_embeddings_spend_and_stops_at_its_limit(
    backend: Backend, fake: FakeOpenAIServer
) -> None:
    """On a real worker (SQLite; PostgreSQL + NATS): ``tasks get`` shows the embeddings'
    tokens and cost in the run's usage, and an agent with ``max_cost_usd`` stops."""
    store = backend.store
    priced = {"input_per_million": PRICE.input_per_million}
    await apply(
        store,
        doc(
            "ModelEndpoint",
            "embedder",
            {"provider": "openai", "model": "e", "base_url": fake.base_url, "pricing": priced},
        ),
        doc("Memory", "facts", {"embedding": {"model": "embedder", "dimensions": DIMENSIONS}}),
        scripted("w", call("memory_write", text=TEXT), call("memory_search", query=QUERY), DONE),
        doc("Agent", "writer", {"model": "w", "memory": [{"ref": "facts", "access": "write"}]}),
        doc(
            "Agent",
            "frugal",
            {
                "model": "w",
                "memory": [{"ref": "facts", "access": "write"}],
                "limits": {"max_cost_usd": 0.001},
            },
        ),
    )
    run, _ = await backend.submit("writer", "remember")
    await backend.drain()
    stored = await store.get_run(run.id)
    assert stored is not None and stored.state is RunState.SUCCEEDED
    assert stored.usage.input_tokens == 8 and stored.cost_usd == pytest.approx(0.008)

    stopped, _ = await backend.submit("frugal", "remember")
    await backend.drain()
    failed = await store.get_run(stopped.id)
    assert failed is not None and failed.state is RunState.FAILED, failed
    assert failed.error is not None and failed.error["code"] == "budget_exceeded"
    assert failed.error["limit"] == "max_cost_usd"
    assert failed.cost_usd == pytest.approx(0.006)


async def test_an_ingest_failing_midway_is_charged_what_it_embedded(
    tools: Tools, tmp_path: Path
) -> None:
    """The embedding model dies on the ingest's second batch: the call fails, the first
    batch stays written, and what its embeddings cost is charged all the same (a failed
    ``memory.write`` carries it)."""

    def poisoned(text: str, dimensions: int) -> list[float]:
        if "poison" in text:
            raise RuntimeError("the embedding model died")
        return hashed_embedding(text, dimensions)

    tools.server.embed_with(poisoned)
    text = " ".join(f"Sentence {n} is here." for n in range(400)) + " poison."
    script = [turn("", ("memory_ingest", {"text": text, "key_prefix": "doc"})), turn("done")]
    chunked = tools("ingest", chunking={"size": 100, "overlap": 0})
    harness = Harness(script, list(chunked), tmp_path)
    result = await harness.run("remember")
    assert result.state is RunState.SUCCEEDED  # the model saw the tool error, and ended
    [outcome] = [e for e in harness.events if e.type is EventType.TOOL_RESULT]
    assert outcome.data.error["code"] == "unavailable", outcome.data.error
    first, second = embedded(tools.server)
    assert len(first) == EMBED_BATCH and "poison" in second[-1]
    tokens = sum(len(re.findall(r"[^\W_]+", chunk)) for chunk in first)
    [failed] = [e for e in harness.events if e.type is EventType.MEMORY_WRITE]
    assert failed.data.failed == "memory_backend_unavailable"
    assert charged(harness.events) == [("memory.write", tokens, pytest.approx(tokens / 1000))]
    assert result.cost_usd == pytest.approx(tokens / 1000)
    written = await tools.store.list_memory(MemoryPlace("default", "notes"), limit=100)
    assert len(written) == EMBED_BATCH
    # the journal counts it once (everything before run.finish: a resumed run's start)
    assert replay(harness.events[:-1]).cost_usd == pytest.approx(tokens / 1000)


@pytest.mark.parametrize("operation", ["write", "search"])
async def test_an_answer_of_other_dimensions_is_refused_and_charged_all_the_same(
    tools: Tools, tmp_path: Path, operation: str
) -> None:
    """The provider billed the answer before the model adapter refused its vectors
    (``EmbeddingDimensionsError``): the failed call's event carries the cost, and the run
    counts it."""
    tools.server.embed_with(dimensions=DIMENSIONS * 2)
    arguments = {"text": TEXT} if operation == "write" else {"query": TEXT}
    script = [turn("", (f"memory_{operation}", arguments)), turn("done")]
    harness = Harness(script, list(tools(operation)), tmp_path)
    result = await harness.run("remember")
    assert result.state is RunState.SUCCEEDED  # the model saw the tool error, and ended
    [outcome] = [e for e in harness.events if e.type is EventType.TOOL_RESULT]
    assert f"{DIMENSIONS * 2} dimensions, not the {DIMENSIONS}" in outcome.data.error["reason"]
    [failed] = [e for e in harness.events if e.type.value == f"memory.{operation}"]
    assert failed.data.failed == "memory_backend_bad_answer"
    assert charged(harness.events) == [(f"memory.{operation}", 6, pytest.approx(0.006))]
    assert result.cost_usd == pytest.approx(0.006) and result.usage.input_tokens == 6
    assert replay(harness.events[:-1]).cost_usd == pytest.approx(0.006)
    assert await tools.store.list_memory(MemoryPlace("default", "notes"), limit=10) == []


def test_the_event_lines_show_what_a_memory_call_embedded() -> None:
    charged_write = MemoryWriteData(
        memory="notes", key="k", preview="p", chars=1, usage={"input_tokens": 6}, cost_usd=0.006
    )
    assert "embedded 6 tokens, $0.006000" in memory_write_line(charged_write)
    failed = MemorySearchData(
        memory="notes",
        failed="memory_backend_bad_answer",
        usage={"input_tokens": 1},
        cost_usd=0.001,
    )
    assert "failed (memory_backend_bad_answer)" in memory_search_line(failed)
    assert "embedded" not in memory_search_line(MemorySearchData(memory="n", query="q", hits=0))
