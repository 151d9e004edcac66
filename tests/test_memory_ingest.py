"""``memory_ingest``: a long text cut by the Memory's chunking, each chunk one entry,
written once however often the ingest is replayed. The run test goes on SQLite and on
PostgreSQL + NATS (:mod:`backends`); the tool-alone tests on the embedded store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from backends import Backend, backend_fixture, deployment_fixture
from corral.core.errors import ToolError
from corral.core.events import EventType, MemorySearchData, MemoryWriteData
from corral.core.memory import MemoryPlace
from corral.core.redaction import Redactor
from corral.core.runs import RunState
from corral.core.settings import Settings
from corral.resources.loader import load_text
from corral.resources.memory import Chunking, MemorySpec
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

NOTES = MemoryPlace("default", "notes")
DOCUMENT = "\n\n".join(
    f"Paragraph {p} tells of the river{' and a kingfisher' if p == 4 else ''}. "
    + " ".join(f"Sentence {p}.{s} flows on." for s in range(8))
    for p in range(6)
)


def doc(kind: str, name: str, spec: dict[str, Any]) -> str:
    return json.dumps(
        {"apiVersion": "corral/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}
    )


def context(key: str = "run_1:1:0") -> ToolContext:
    return ToolContext("run_1", "writer", "default", "call_1", key, Path("."))


def ingest_tool(store: Store, access: str = "write") -> MemoryTool:
    spec = MemorySpec(chunking=Chunking(size=200, overlap=40))
    binding = MemoryBinding("notes", spec, access, StoreMemoryBackend(store, spec))  # type: ignore[arg-type]
    redactor = Redactor({"api-key": "sk-live-0123456789"})
    return MemoryTool("ingest", [binding], store, lambda: redactor)  # type: ignore[arg-type]


async def test_an_ingest_writes_each_chunk_once_with_its_metadata(
    env: tuple[Store, Settings],
) -> None:
    store, _ = env
    tool = ingest_tool(store)
    arguments = {"text": DOCUMENT, "key_prefix": "river", "metadata": {"source": "river.md"}}
    first = await tool.call(arguments, context())
    replayed = await tool.call(arguments, context())
    assert first == replayed
    entries = await store.list_memory(NOTES, limit=100)
    assert len(entries) == first["chunks"] > 5
    by_key = {e.key: e for e in entries}
    for index in range(first["chunks"]):
        entry = by_key[f"river#{index}"]
        assert len(entry.text) <= 200
        assert entry.metadata == {"source": "river.md", "chunk": index, "chunks": first["chunks"]}
    # overlap: each chunk after the first starts with words the one before ended with
    second = by_key["river#1"].text.split()[0]
    assert second in by_key["river#0"].text[-60:]


async def test_a_replayed_ingest_without_a_prefix_gets_the_same_keys_and_secrets_are_redacted(
    env: tuple[Store, Settings],
) -> None:
    store, _ = env
    tool = ingest_tool(store)
    arguments = {"text": "The token sk-live-0123456789 opens the gate. " * 10}
    first = await tool.call(arguments, context())
    assert await tool.call(arguments, context()) == first
    entries = await store.list_memory(NOTES, limit=100)
    assert [e.key for e in entries] == sorted(first["keys"])
    assert all("sk-live" not in e.text and "[REDACTED:api-key]" in e.text for e in entries)
    assert entries[0].metadata["source"] == "run run_1"
    # another call (another idempotency key) is another ingest
    other = await tool.call(arguments, context(key="run_1:2:0"))
    assert other["key_prefix"] != first["key_prefix"]


async def test_a_read_only_memory_refuses_ingest_and_bad_input_is_clear(
    env: tuple[Store, Settings],
) -> None:
    store, _ = env
    with pytest.raises(ToolError) as refused:
        ingest_tool(store, access="read").targets({"text": "x"})
    assert refused.value.info.code == "permission_denied"
    assert ingest_tool(store).targets({"text": "x"}) == ("memory:notes/ingest",)
    with pytest.raises(ToolError) as blank:
        await ingest_tool(store).call({"text": "   "}, context())
    assert blank.value.info.code == "invalid_input"
    assert "empty" in blank.value.info.reason


async def test_an_agent_ingests_a_document_and_finds_it(backend: Backend) -> None:
    store = backend.store
    turns = [
        {"tool_calls": [{"name": "memory_ingest", "arguments": {"text": DOCUMENT}}]},
        {"tool_calls": [{"name": "memory_search", "arguments": {"query": "kingfisher"}}]},
        {"text": "done"},
    ]
    docs = [
        doc("Memory", "notes", {"chunking": {"size": 300, "overlap": 50}}),
        doc("ModelEndpoint", "script", {"provider": "scripted", "script": turns}),
        doc(
            "Agent", "writer", {"model": "script", "memory": [{"ref": "notes", "access": "write"}]}
        ),
    ]
    await store.apply(load_text("\n---\n".join(docs), "t.yaml"))
    run, _ = await backend.submit("writer", "read this")
    await backend.drain()
    stored = await store.get_run(run.id)
    assert stored is not None and stored.state is RunState.SUCCEEDED, stored
    outputs = [
        json.loads(e.data.output)
        for e in await store.list_events(run.id)
        if e.type is EventType.TOOL_RESULT
    ]
    ingested, found = outputs
    entries = await store.list_memory(NOTES, limit=100)
    assert len(entries) == ingested["chunks"] > 3
    assert all(len(e.text) <= 300 for e in entries)
    [hit] = found["results"]
    assert "kingfisher" in hit["preview"]
    assert hit["metadata"]["chunk"] > 0
    # the journal says what was written and searched, with previews only
    events = await store.list_events(run.id)
    kinds = [e.type for e in events]
    write = next(e for e in events if e.type is EventType.MEMORY_WRITE)
    search = next(e for e in events if e.type is EventType.MEMORY_SEARCH)
    assert kinds.index(EventType.MEMORY_WRITE) < kinds.index(EventType.TOOL_RESULT)
    assert write.data.memory == "notes" and write.data.tool == "memory_ingest"
    assert write.data.chunks == write.data.written == ingested["chunks"]
    assert write.data.chars == len(DOCUMENT)
    assert len(write.data.preview) <= 80 and DOCUMENT[:40] in write.data.preview
    assert search.data.to_dict() == {
        "step": 2,
        "call_id": search.data.call_id,
        "tool": "memory_search",
        "memory": "notes",
        "query": "kingfisher",
        "hits": 1,
    }


async def test_write_and_search_events_are_redacted_previews(
    env: tuple[Store, Settings],
) -> None:
    store, _ = env
    spec = MemorySpec()
    redactor = Redactor({"api-key": "sk-live-0123456789"})
    binding = MemoryBinding("notes", spec, "write", StoreMemoryBackend(store, spec))
    write = MemoryTool("write", [binding], store, lambda: redactor)
    search = MemoryTool("search", [binding], store, lambda: redactor)
    long_text = "The vault code is sk-live-0123456789. " + "Padding words go on and on. " * 20
    ctx = context()
    await write.call({"text": long_text, "key": "v"}, ctx)
    replay = context()
    await write.call({"text": long_text, "key": "v"}, replay)
    [written] = ctx.journal
    assert isinstance(written, MemoryWriteData)
    assert written.key == "v" and written.written is True and (written.chars or 0) > 80
    assert "sk-live" not in json.dumps(written.to_dict())
    preview = written.preview or ""
    assert preview.startswith("The vault code is [REDACTED:api-key]")
    assert len(preview) <= 80 and preview.endswith("\u2026")
    [again] = replay.journal
    assert again.to_dict()["written"] is False  # a replay writes nothing, and says so
    searched = context(key="run_1:2:0")
    await search.call({"query": "vault   code\n" + "x" * 200}, searched)
    [found] = searched.journal
    assert isinstance(found, MemorySearchData)
    assert found.hits == 1 and found.memory == "notes"
    assert (found.query or "").startswith("vault code x") and len(found.query or "") <= 80
