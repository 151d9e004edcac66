"""The memory tools of an Agent with ``spec.memory``, end to end on real workers.

The run tests go twice (:mod:`backends`): on the embedded SQLite store, and on
PostgreSQL + NATS JetStream. Agents run on the scripted model; what they wrote is
read back from the store and from the runs' ``tool.result`` events.
"""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from backends import Backend, backend_fixture, deployment_fixture
from corral.core.errors import ConfigurationError, ResourceError
from corral.core.events import EventType
from corral.core.memory import MemoryEntry, MemoryPlace
from corral.core.redaction import Redactor
from corral.core.runs import RunRecord, RunState
from corral.core.settings import Settings
from corral.resources.loader import load_text
from corral.resources.memory import MemorySpec, Retention
from corral.runtime.builder import AgentBuilder
from corral.store import Store
from corral.tools.base import ToolContext
from corral.tools.memory import MemoryBinding, MemoryTool
from corral.tools.memory_backend import StoreMemoryBackend
from nats_servers import nats_prefix_fixture, nats_server_url_fixture

__all__ = [
    "backend_fixture",
    "deployment_fixture",
    "nats_prefix_fixture",
    "nats_server_url_fixture",
]


def doc(kind: str, name: str, spec: dict[str, Any], namespace: str = "default") -> str:
    return json.dumps(
        {
            "apiVersion": "corral/v1",
            "kind": kind,
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
    )


def scripted(name: str, *turns: dict[str, Any], namespace: str = "default") -> str:
    return doc("ModelEndpoint", name, {"provider": "scripted", "script": list(turns)}, namespace)


def call(tool: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": tool, "arguments": arguments}]}


DONE = {"text": "done"}


async def apply(store: Store, *docs: str) -> None:
    await store.apply(load_text("\n---\n".join(docs), "t.yaml"))


async def results(store: Store, run: RunRecord) -> list[dict[str, Any]]:
    """The run's tool results: the output as JSON, or the error."""
    stored = await store.get_run(run.id)
    assert stored is not None and stored.state is RunState.SUCCEEDED, stored
    found = []
    for event in await store.list_events(run.id):
        if event.type is EventType.TOOL_RESULT:
            error = event.data.to_dict().get("error")
            found.append({"error": error} if error else json.loads(event.data.output))
    return found


async def test_an_agent_finds_what_another_agent_wrote_in_a_shared_memory(
    backend: Backend,
) -> None:
    store = backend.store
    await apply(
        store,
        doc("Memory", "notes", {"scope": "namespace"}),
        scripted(
            "w",
            call(
                "memory_write",
                text="The launch code word is pineapple",
                key="launch",
                metadata={"team": "ops"},
            ),
            DONE,
        ),
        scripted("r", call("memory_search", query="what is the code WORD?", top_k=3), DONE),
        doc("Agent", "writer", {"model": "w", "memory": [{"ref": "notes", "access": "write"}]}),
        doc("Agent", "reader", {"model": "r", "memory": [{"ref": "notes"}]}),
    )
    wrote, _ = await backend.submit("writer", "remember the code word")
    await backend.drain()
    searched, _ = await backend.submit("reader", "what was the code word?")
    await backend.drain()

    assert await results(store, wrote) == [{"memory": "notes", "key": "launch", "stored": True}]
    [found] = await results(store, searched)
    [hit] = found["results"]
    assert hit["key"] == "launch" and hit["score"] > 0
    assert hit["preview"] == "The launch code word is pineapple"
    assert hit["metadata"] == {"team": "ops"}


async def test_an_agent_scoped_memory_is_each_agents_own(backend: Backend) -> None:
    store = backend.store
    access = [{"ref": "diary", "access": "write"}]
    await apply(
        store,
        doc("Memory", "diary", {"scope": "agent"}),
        scripted(
            "a",
            call("memory_write", text="alice met the zebra", key="z"),
            call("memory_search", query="zebra"),
            DONE,
        ),
        scripted("b", call("memory_search", query="zebra"), call("memory_read", key="z"), DONE),
        doc("Agent", "alice", {"model": "a", "memory": access}),
        doc("Agent", "bob", {"model": "b", "memory": access}),
    )
    run_a, _ = await backend.submit("alice", "write and look")
    await backend.drain()
    run_b, _ = await backend.submit("bob", "look")
    await backend.drain()

    _, alice_search = await results(store, run_a)
    assert [r["key"] for r in alice_search["results"]] == ["z"]
    assert await results(store, run_b) == [
        {"memory": "diary", "results": []},
        {"memory": "diary", "key": "z", "found": False},
    ]
    assert await store.read_memory(MemoryPlace("default", "diary", "alice"), "z") is not None


async def test_a_foreign_namespace_sees_nothing_of_another_namespaces_memory(
    backend: Backend,
) -> None:
    store = backend.store
    await apply(
        store,
        doc("Memory", "notes", {}),
        doc("Memory", "notes", {}, "team"),
        scripted("w", call("memory_write", text="default's secret plan", key="plan"), DONE),
        scripted(
            "r",
            call("memory_search", query="secret plan"),
            call("memory_read", key="plan"),
            DONE,
            namespace="team",
        ),
        doc("Agent", "writer", {"model": "w", "memory": [{"ref": "notes", "access": "write"}]}),
        doc("Agent", "reader", {"model": "r", "memory": [{"ref": "notes"}]}, "team"),
    )
    await backend.submit("writer", "write")
    await backend.drain()
    run, _ = await backend.submit("reader", "look", namespace="team")
    await backend.drain()
    assert await results(store, run) == [
        {"memory": "notes", "results": []},
        {"memory": "notes", "key": "plan", "found": False},
    ]


async def test_read_access_has_no_write_tool_and_a_denied_memory_is_refused(
    backend: Backend,
) -> None:
    store = backend.store
    await apply(
        store,
        doc("Memory", "notes", {}),
        doc("Memory", "scratch", {}),
        # read-only: the model calls a tool the agent does not have
        scripted("r", call("memory_write", text="sneaky"), DONE),
        # write access, but a role denies memory:notes/*
        scripted(
            "d",
            call("memory_write", memory="notes", text="denied"),
            call("memory_search", memory="notes", query="denied"),
            call("memory_write", memory="scratch", text="allowed words", key="ok"),
            DONE,
        ),
        doc("ToolPermission", "all-memory", {"tools": ["memory:*"]}),
        doc("ToolPermission", "no-notes", {"tools": ["memory:notes/*"], "effect": "deny"}),
        doc("AgentRole", "scribe", {"permissions": ["all-memory", "no-notes"]}),
        doc("Agent", "reader", {"model": "r", "memory": [{"ref": "notes", "access": "read"}]}),
        doc(
            "Agent",
            "scribe",
            {
                "model": "d",
                "roles": ["scribe"],
                "memory": [
                    {"ref": "notes", "access": "write"},
                    {"ref": "scratch", "access": "write"},
                ],
            },
        ),
    )
    read_only, _ = await backend.submit("reader", "try to write")
    await backend.drain()
    denied, _ = await backend.submit("scribe", "try")
    await backend.drain()

    [unsupported] = await results(store, read_only)
    assert unsupported["error"]["code"] == "unsupported_tool"
    write, search, allowed = await results(store, denied)
    assert write["error"]["code"] == search["error"]["code"] == "permission_denied"
    assert "memory:notes/write" in write["error"]["reason"]
    assert allowed == {"memory": "scratch", "key": "ok", "stored": True}
    assert await store.list_memory(MemoryPlace("default", "notes")) == []


async def test_a_session_scoped_memory_is_shared_by_the_runs_of_one_session(
    backend: Backend,
) -> None:
    store = backend.store
    access = [{"ref": "scratch", "access": "write"}]
    await apply(
        store,
        doc("Memory", "scratch", {"scope": "session"}),
        # the scripted model answers by the turns in the conversation: a session's
        # second run starts where its first ended
        scripted(
            "m",
            call("memory_write", text="the session's own note", key="n"),
            DONE,
            call("memory_read", key="n"),
            DONE,
        ),
        scripted("o", call("memory_read", key="n"), DONE),
        doc("Agent", "a", {"model": "m", "memory": access}),
        doc("Agent", "b", {"model": "o", "memory": access}),
    )
    first, _ = await backend.submit("a", "go", session="s1")
    await backend.drain()
    same, _ = await backend.submit("a", "again", session="s1")
    await backend.drain()
    other, _ = await backend.submit("b", "look", session="s2")
    await backend.drain()
    no_session, _ = await backend.submit("b", "look")
    await backend.drain()

    assert await results(store, first) == [{"memory": "scratch", "key": "n", "stored": True}]
    [read] = await results(store, same)
    assert read["found"] and read["text"] == "the session's own note"
    assert await results(store, other) == [{"memory": "scratch", "key": "n", "found": False}]
    [refused] = await results(store, no_session)
    assert refused["error"]["code"] == "invalid_input"
    assert "this run has no session" in refused["error"]["reason"]


# --------------------------------------------------------------------------- the tools alone


def context(run_id: str = "run_1", key: str = "run_1:1:0") -> ToolContext:
    return ToolContext(run_id, "writer", "default", "call_1", key, Path("."))


def tool(store: Store, op: str, **spec: Any) -> MemoryTool:
    memory = MemorySpec(**spec)
    binding = MemoryBinding("notes", memory, "write", StoreMemoryBackend(store, memory))
    redactor = Redactor({"api-key": "sk-live-0123456789"})
    return MemoryTool(op, [binding], store, lambda: redactor)  # type: ignore[arg-type]


async def test_a_replayed_write_stores_once_and_a_secret_is_never_written(
    env: tuple[Store, Settings],
) -> None:
    store, _ = env
    write = tool(store, "write")
    arguments = {
        "text": "the key is sk-live-0123456789, keep it",
        "metadata": {"k": "sk-live-0123456789"},
    }
    first = await write.call(arguments, context())
    replayed = await write.call(arguments, context())
    assert first == replayed
    [stored] = await store.list_memory(MemoryPlace("default", "notes"))
    assert stored.key == first["key"]
    assert stored.text == "the key is [REDACTED:api-key], keep it"
    assert stored.metadata == {"k": "[REDACTED:api-key]"}
    # the same call position answered differently after a crash is written
    await write.call({"text": "another answer"}, context())
    assert len(await store.list_memory(MemoryPlace("default", "notes"))) == 2


async def test_a_huge_text_is_refused_with_a_clear_reason(env: tuple[Store, Settings]) -> None:
    from corral.core.errors import ToolError

    store, _ = env
    with pytest.raises(ToolError) as refused:
        await tool(store, "write").call({"text": "x" * 20_000}, context())
    assert refused.value.info.code == "invalid_input"
    assert "at most 16000 characters" in refused.value.info.reason


async def test_retention_applies_on_every_write(env: tuple[Store, Settings]) -> None:
    store, _ = env
    write = tool(store, "write", retention=Retention(max_entries=2))
    for i in range(4):
        await write.call({"text": f"note {i}", "key": f"k{i}"}, context(key=f"run_1:{i}:0"))
    kept = await store.list_memory(MemoryPlace("default", "notes"))
    assert [e.key for e in kept] == ["k2", "k3"]


MEMORY_AGENTS = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: script}
spec: {provider: scripted}
---
apiVersion: corral/v1
kind: Memory
metadata: {name: notes}
spec: {}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: reader}
spec: {model: script, memory: [{ref: notes}]}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: writer}
spec: {model: script, memory: [{ref: notes, access: write}]}
"""


async def test_the_tools_an_agent_gets_follow_its_access(env: tuple[Store, Settings]) -> None:
    store, settings = env
    await store.apply(load_text(MEMORY_AGENTS, "m.yaml"))
    async with AsyncExitStack() as stack:
        reader = await AgentBuilder(store, settings).build("reader", stack)
        writer = await AgentBuilder(store, settings).build("writer", stack)
    assert sorted(reader.toolset.by_name) == ["memory_list", "memory_read", "memory_search"]
    assert sorted(writer.toolset.by_name) == [
        "memory_delete",
        "memory_ingest",
        "memory_list",
        "memory_read",
        "memory_search",
        "memory_write",
    ]
    # one memory: the argument naming it is optional
    assert "memory" not in writer.toolset.by_name["memory_write"].spec.parameters["required"]


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"backend": "http"}, "backend 'http' needs an 'http' block"),
        ({"embedding": {"model": "nowhere", "dimensions": 8}}, "ModelEndpoint 'nowhere'"),
        (
            {"backend": "http", "embedding": {"model": "e", "dimensions": 8}},
            "'embedding' is for backend 'store'",
        ),
        ({"chunking": {"size": 500, "overlap": 500}}, "'overlap' must be smaller"),
    ],
)
async def test_memory_features_not_built_yet_are_refused_at_apply(
    env: tuple[Store, Settings], spec: dict[str, Any], reason: str
) -> None:
    store, _ = env
    with pytest.raises(ResourceError, match=reason):
        await store.apply(load_text(doc("Memory", "m", spec), "m.yaml"))


async def test_an_agent_naming_a_missing_memory_is_refused_at_apply(
    env: tuple[Store, Settings],
) -> None:
    store, _ = env
    agent = doc("Agent", "a", {"model": "m", "memory": [{"ref": "nowhere"}]})
    with pytest.raises(ResourceError, match=r"Memory 'nowhere' not found"):
        await store.apply(load_text(scripted("m") + "\n---\n" + agent, "a.yaml"))
    twice = doc("Agent", "a", {"model": "m", "memory": [{"ref": "n"}, {"ref": "n"}]})
    with pytest.raises(ResourceError, match="named twice"):
        await store.apply(load_text(scripted("m") + "\n---\n" + twice, "a.yaml"))


def test_an_entry_preview_is_short() -> None:
    entry = MemoryEntry("default", "notes", "", "k", "word " * 200)
    assert len(entry.preview()) == 240 and entry.preview().endswith("\u2026")


async def test_a_run_resumed_after_a_crash_mid_write_writes_once(
    env: tuple[Store, Settings], tmp_path: Path
) -> None:
    from corral.core.events import Event
    from corral.engine.loop import AgentLoop
    from test_engine import Harness, turn

    store, _ = env
    script = [
        # no key: a second write would be a second entry under a new key
        turn("", ("memory_write", {"text": "written exactly once"})),
        turn("", ("memory_search", {"query": "once"})),
        turn("done"),
    ]
    full = Harness(list(script), [tool(store, "write"), tool(store, "search")], tmp_path)
    assert (await full.run("remember")).state is RunState.SUCCEEDED
    # The process died after the write, before its result was journaled: the journal
    # ends with the model's message asking for it.
    first = next(i for i, e in enumerate(full.events) if e.type is EventType.MESSAGE_CREATE)
    journal: list[Event] = full.events[: first + 1]

    resumed = Harness([], [tool(store, "write"), tool(store, "search")], tmp_path)
    resumed.model.turns, resumed.events = list(script), list(journal)
    result = await AgentLoop(resumed.agent, "run_test", resumed.sink).resume(journal)

    assert result.state is RunState.SUCCEEDED
    [stored] = await store.list_memory(MemoryPlace("default", "notes"))
    assert stored.text == "written exactly once"
    # the resumed run ran the write again (its result is new) and found the first one's entry
    outputs = [e.data.output for e in resumed.events if e.type is EventType.TOOL_RESULT]
    assert json.loads(outputs[0]) == {"memory": "notes", "key": stored.key, "stored": True}
    assert [r["key"] for r in json.loads(outputs[1])["results"]] == [stored.key]


async def test_agents_with_an_embedding_memory_embed_writes_and_searches_once_each(
    backend: Backend,
) -> None:
    """The builder gives the Memory its ModelEndpoint's model: the writer's entry is
    embedded once (a replayed write would be answered before embedding), the reader's
    query once, and the hit says both signals found it."""
    from corral.testing.fake_openai import FakeOpenAIServer

    store = backend.store
    with FakeOpenAIServer(embedding_dimensions=8) as fake:
        await apply(
            store,
            doc(
                "ModelEndpoint",
                "embedder",
                {
                    "provider": "openai",
                    "model": "e",
                    "base_url": fake.base_url,
                },
            ),
            doc("Memory", "facts", {"embedding": {"model": "embedder", "dimensions": 8}}),
            scripted("w", call("memory_write", text="The launch code word is pineapple"), DONE),
            scripted("r", call("memory_search", query="launch code", top_k=3), DONE),
            doc("Agent", "writer", {"model": "w", "memory": [{"ref": "facts", "access": "write"}]}),
            doc("Agent", "reader", {"model": "r", "memory": [{"ref": "facts"}]}),
        )
        wrote, _ = await backend.submit("writer", "remember")
        await backend.drain()
        searched, _ = await backend.submit("reader", "recall")
        await backend.drain()
        inputs = [r.json["input"] for r in fake.requests if r.path.endswith("/embeddings")]
    [written] = await results(store, wrote)
    assert written["stored"] is True
    [found] = await results(store, searched)
    [hit] = found["results"]
    assert hit["signals"] == ["fulltext", "vector"]
    assert inputs == [["The launch code word is pineapple"], ["launch code"]]


async def test_a_memory_whose_embedding_model_cannot_embed_fails_the_agent_build(
    env: tuple[Store, Settings],
) -> None:
    store, settings = env
    await apply(
        store,
        doc("ModelEndpoint", "chat", {"provider": "anthropic", "model": "claude"}),
        doc("Memory", "facts", {"embedding": {"model": "chat", "dimensions": 8}}),
        scripted("m", DONE),
        doc("Agent", "a", {"model": "m", "memory": [{"ref": "facts"}]}),
    )
    async with AsyncExitStack() as stack:
        with pytest.raises(ConfigurationError, match="provider 'anthropic' has no embeddings"):
            await AgentBuilder(store, settings).build("a", stack)
