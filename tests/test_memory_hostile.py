"""Hostile input to Memory: what an attacker or a careless caller sends to the store and
to ``/v1/memories``. Every answer is a stable error code, never a 500, and the server
goes on serving."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

import httpx
import pytest

from cli_harness import invoke
from corral.core.errors import CorralError
from corral.core.memory import MemoryEntry, MemoryInputError, MemoryPlace
from corral.core.redaction import Redactor
from corral.core.settings import Settings
from corral.resources.memory import MemorySpec
from corral.runtime.memory_files import MAX_DEPTH, MAX_FILE_BYTES, read_documents
from corral.store import Store
from corral.tools.base import ToolContext
from corral.tools.memory import MemoryBinding, MemoryTool
from corral.tools.memory_backend import StoreMemoryBackend
from server_harness import LiveServer, apply
from test_store import (  # noqa: F401 - fixtures
    cipher_fixture,
    store_fixture,
    store_url_fixture,
)

NOTES = MemoryPlace("default", "notes")
MEMORY = """
apiVersion: corral/v1
kind: Memory
metadata: {name: hostile-notes}
spec: {}
"""
DIARY = """
apiVersion: corral/v1
kind: Memory
metadata: {name: hostile-diary}
spec: {scope: agent}
"""


@pytest.mark.parametrize("number", [2**63, -(2**63) - 1, 10**30])
async def test_an_integer_no_database_column_holds_is_refused_in_metadata_and_filters(
    store: Store, number: int
) -> None:
    await store.write_memory(MemoryEntry("default", "notes", "", "k", "tea", {"n": 1}))
    with pytest.raises(MemoryInputError, match="64-bit"):
        await store.search_memory(NOTES, "tea", filters={"n": number})
    with pytest.raises(MemoryInputError, match="64-bit"):
        await store.write_memory(MemoryEntry("default", "notes", "", "k2", "tea", {"n": number}))
    # the largest that fits is fine
    edge = 2**63 - 1
    await store.write_memory(MemoryEntry("default", "notes", "", "k3", "tea", {"n": edge}))
    assert [h.entry.key for h in await store.search_memory(NOTES, "tea", filters={"n": edge})] == [
        "k3"
    ]


def test_a_huge_integer_filter_is_400_and_the_server_goes_on(client: httpx.Client) -> None:
    apply(client, MEMORY)
    base = "/v1/memories/hostile-notes"
    assert client.post(f"{base}/entries", json={"text": "tea", "key": "k"}).status_code == 201
    for number in (10**30, 2**63, -(2**64)):
        answer = client.post(f"{base}/search", json={"query": "tea", "filter": {"n": number}})
        assert answer.status_code == 400, answer.text
        assert answer.json()["code"] == "invalid_memory_input"
        written = client.post(f"{base}/entries", json={"text": "x", "metadata": {"n": number}})
        assert written.status_code == 400 and written.json()["code"] == "invalid_memory_input"
    assert client.get(base).json()["entries"] == 1


def _cli(home: Path, *args: str, input: bytes | None = None) -> tuple[int, str]:
    result = invoke(args, {"CORRAL_HOME": str(home), "PATH": "/usr/bin:/bin"}, input=input)
    return result.returncode, result.stdout + result.stderr


def test_the_cli_refuses_stdin_that_is_not_utf8_with_a_message(tmp_path: Path) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(MEMORY)
    assert _cli(tmp_path / "home", "apply", "-f", str(manifest))[0] == 0
    for command in ("write", "ingest"):
        code, said = _cli(
            tmp_path / "home", "memory", command, "hostile-notes", "-", input=b"\xff\xfe tea"
        )
        assert code == 2, said
        assert "stdin is not UTF-8 text" in said and "Traceback" not in said


def test_the_cli_ingests_a_directory_skipping_binary_files_and_symlink_loops(
    tmp_path: Path,
) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(MEMORY)
    home = tmp_path / "home"
    assert _cli(home, "apply", "-f", str(manifest))[0] == 0
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("green tea notes")
    (docs / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (docs / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    os.symlink(docs, docs / "loop")
    os.symlink(docs / "nowhere", docs / "dangling")
    os.mkfifo(docs / "fifo")
    code, said = _cli(home, "memory", "ingest", "hostile-notes", str(docs))
    assert code == 0, said
    assert "1 document(s), 1 chunks, 1 written" in said
    assert "skipped" in said and "image.png" in said and "latin1.txt" in said
    big = tmp_path / "big.txt"
    big.write_text("word " * 1_200_000)
    code, said = _cli(home, "memory", "ingest", "hostile-notes", str(big))
    assert code == 2 and "at most 5000000 characters" in said


PLANTED = """
apiVersion: corral/v1
kind: Memory
metadata: {name: planted-notes}
spec: {}
"""


def planted_directory(root: Path, secret: Path) -> Path:
    """What a sandboxed tool can leave in its workspace for someone to ingest: links to
    the server's key and to /etc/shadow, to a directory outside, a FIFO, a device."""
    docs = root / "docs"
    (docs / "deeper").mkdir(parents=True)
    (docs / "a.md").write_text("green tea notes")
    (docs / "deeper" / "b.md").write_text("oolong notes")
    (docs / ".hidden.md").write_text("not for memory")
    outside = root / "outside"
    outside.mkdir()
    (outside / "c.md").write_text("outside notes")
    os.symlink(secret, docs / "key.md")
    os.symlink("/etc/shadow", docs / "shadow.md")
    os.symlink(outside, docs / "linked-dir")
    os.symlink(outside / "c.md", docs / "deeper" / "c.md")
    os.mkfifo(docs / "fifo.md")
    if os.geteuid() == 0:  # a device node (only root makes one): /dev/zero's numbers
        os.mknod(docs / "zero.md", 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    return docs


@pytest.mark.parametrize("mode", ["local", "remote"])
def test_ingesting_a_directory_reads_only_the_regular_files_inside_it(
    server: LiveServer, client: httpx.Client, tmp_path: Path, mode: str
) -> None:
    home = tmp_path / "home"
    secret = home / "secret.key"
    home.mkdir()
    secret.write_text("MASTER-KEY-never-in-memory")
    docs = planted_directory(tmp_path, secret)
    env = {"CORRAL_HOME": str(home), "PATH": "/usr/bin:/bin"}
    if mode == "remote":  # the CLI reads the files, the API takes their text
        env |= {"CORRAL_URL": server.url, "CORRAL_TOKEN": server.admin}
        apply(client, PLANTED)
    else:
        manifest = tmp_path / "m.yaml"
        manifest.write_text(PLANTED)
        assert _cli(home, "apply", "-f", str(manifest))[0] == 0
    result = invoke(["memory", "ingest", "planted-notes", str(docs)], env)

    assert result.returncode == 0, result.stderr
    assert "2 document(s), 2 chunks" in result.stdout and "path(s) skipped" in result.stdout
    skipped = dict(
        line.removeprefix("skipped ").split(": ", 1)
        for line in result.stderr.splitlines()
        if line.startswith("skipped ")
    )
    link = "a symbolic link (not followed)"
    assert skipped == {
        f"{docs}/deeper/c.md": link,
        f"{docs}/fifo.md": "a FIFO, not a regular file",
        f"{docs}/key.md": link,
        f"{docs}/linked-dir": link,
        f"{docs}/shadow.md": link,
    } | ({f"{docs}/zero.md": "a device, not a regular file"} if os.geteuid() == 0 else {})
    listed = invoke(["memory", "list", "planted-notes", "-o", "json"], env)
    texts = [entry["text"] for entry in json.loads(listed.stdout)]
    assert sorted(texts) == ["green tea notes", "oolong notes"]


def test_a_symbolic_link_named_for_ingest_is_refused_with_its_target(tmp_path: Path) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(MEMORY)
    home = tmp_path / "home"
    assert _cli(home, "apply", "-f", str(manifest))[0] == 0
    (tmp_path / "real.md").write_text("tea")
    os.symlink(tmp_path / "real.md", tmp_path / "link.md")
    os.mkfifo(tmp_path / "fifo")
    code, said = _cli(home, "memory", "ingest", "hostile-notes", str(tmp_path / "link.md"))
    assert code == 2 and f"link.md is a symbolic link (to {tmp_path}/real.md)" in said, said
    code, said = _cli(home, "memory", "ingest", "hostile-notes", str(tmp_path / "fifo"))
    assert code == 2 and "a FIFO, not a regular file" in said, said  # and did not block
    assert "Traceback" not in said


def test_a_file_past_the_size_cap_is_skipped_unread_and_a_deep_tree_stops(
    tmp_path: Path,
) -> None:
    docs = tmp_path / "docs"
    deep = docs.joinpath(*["d"] * (MAX_DEPTH + 3))
    deep.mkdir(parents=True)
    (deep / "far.md").write_text("too far down")
    (docs / "d" / "near.md").write_text("near")
    with (docs / "huge.md").open("wb") as huge:  # sparse: its size alone says enough
        huge.truncate(MAX_FILE_BYTES + 1)
    found, skipped = read_documents(docs)
    assert [d.path for d in found] == [f"{docs}/d/near.md"]
    reasons = {Path(s.path).name: s.reason for s in skipped}
    assert reasons["huge.md"].startswith(f"larger than {MAX_FILE_BYTES} bytes")
    assert reasons["d"] == f"deeper than {MAX_DEPTH} directories"


def test_the_same_document_ingested_for_two_agents_is_kept_for_each(client: httpx.Client) -> None:
    apply(client, DIARY)
    base = "/v1/memories/hostile-diary"
    text = "the blue door is open " * 10
    for agent in ("alice", "bob"):
        done = client.post(f"{base}/ingest", json={"text": text, "source": "doc", "agent": agent})
        assert done.status_code == 200, done.text
        assert done.json()["written"] == done.json()["chunks"] == 1, (agent, done.json())
        listed = client.get(f"{base}/entries", params={"agent": agent}).json()["items"]
        assert [e["key"] for e in listed] == ["doc#0"] and listed[0]["scope_key"] == agent
    again = client.post(f"{base}/ingest", json={"text": text, "source": "doc", "agent": "bob"})
    assert again.json()["written"] == 0  # a replay in one scope still writes nothing twice


async def test_a_secret_in_a_key_or_key_prefix_an_agent_writes_is_never_stored(
    env: tuple[Store, Settings],
) -> None:
    store, _ = env
    memory = MemorySpec()
    binding = MemoryBinding("notes", memory, "write", StoreMemoryBackend(store, memory))
    redactor = Redactor({"api-key": "sk-live-0123456789"})

    def tool(op: str) -> MemoryTool:
        return MemoryTool(op, [binding], store, lambda: redactor)  # type: ignore[arg-type]

    def context(key: str) -> ToolContext:
        return ToolContext("run_1", "writer", "default", "call_1", key, Path("."))

    written = await tool("write").call(
        {"text": "a note", "key": "creds/sk-live-0123456789"}, context("run_1:1:0")
    )
    ingested = await tool("ingest").call(
        {"text": "a long note " * 20, "key_prefix": "doc-sk-live-0123456789"},
        context("run_1:2:0"),
    )
    stored = await store.list_memory(NOTES, limit=100)
    assert stored and all("sk-live" not in e.key for e in stored), [e.key for e in stored]
    assert "sk-live" not in json.dumps([written, ingested])


async def test_a_write_storm_on_one_key_loses_nothing_and_duplicates_nothing(store: Store) -> None:
    async def write(i: int) -> None:
        await store.write_memory(
            MemoryEntry("default", "notes", "", "hot", f"version {i}", {"i": i}), max_entries=3
        )

    async def other(i: int) -> None:
        await store.write_memory(
            MemoryEntry("default", "notes", "", f"other-{i}", "cold"), max_entries=3
        )

    await asyncio.gather(*(write(i) for i in range(40)), *(other(i) for i in range(10)))
    entries = await store.list_memory(NOTES, limit=100)
    assert len({e.key for e in entries}) == len(entries)
    # (racing writers may each keep 3 of what their transaction saw: on PostgreSQL a
    # scope can hold a few more than max_entries until its next write)
    await write(99)
    assert len(await store.list_memory(NOTES, limit=100)) <= 3
    [hot] = [e for e in await store.list_memory(NOTES, prefix="hot") if e.key == "hot"]
    assert hot.text == "version 99" and hot.metadata == {"i": 99}


async def test_concurrent_replays_of_one_call_write_once(store: Store) -> None:
    """The same idempotency key (a replayed tool call) racing itself, under other keys."""

    async def write(key: str) -> tuple[MemoryEntry, bool]:
        entry = MemoryEntry("default", "notes", "", key, "once", idempotency_key="run:1:0")
        return await store.write_memory(entry)

    done = await asyncio.gather(*(write(f"k{i % 2}") for i in range(20)), return_exceptions=True)
    failures = [d for d in done if isinstance(d, BaseException)]
    assert all(isinstance(f, CorralError) for f in failures), failures
    assert len(await store.list_memory(NOTES)) == 1


HOSTILE_QUERIES = [
    'tea" OR "x',
    "NEAR(tea coffee, 2)",
    "text: tea",
    "key:tea OR metadata:tea",
    "te* AND -coffee",
    "((tea",
    "tea)))",
    "^tea",
    "'tea' & !coffee | <-> :*",
    "tea:* & coffee:A",
    '"""',
    "*",
    "\u202etea\u202c",
    "te\u0301a",
    "🍵 tea",
    "a" * 5000,
    " ".join(f"w{i}" for i in range(10_000)),
    "\x00tea",
    "tea\ud800",
]


@pytest.mark.parametrize("query", HOSTILE_QUERIES, ids=range(len(HOSTILE_QUERIES)))
async def test_no_query_is_read_as_full_text_syntax(store: Store, query: str) -> None:
    await store.write_memory(MemoryEntry("default", "notes", "", "k", "green tea at five"))
    hits = await store.search_memory(NOTES, query, top_k=5)
    assert all(h.entry.key == "k" for h in hits)
    if "tea" in query:
        assert [h.entry.key for h in hits] == ["k"], query


async def test_a_query_typed_decomposed_finds_the_composed_text(store: Store) -> None:
    """An accent typed as a combining mark (NFD, as some keyboards and file systems
    send it) is the same word as its precomposed form (NFC)."""
    await store.write_memory(
        MemoryEntry("default", "notes", "", "k", "cr\u00e8me br\u00fbl\u00e9e")
    )
    hits = await store.search_memory(NOTES, "cre\u0300me", top_k=5)
    assert [h.entry.key for h in hits] == ["k"]


@pytest.mark.parametrize("days", [1e308, 1e-300, 1.7976931348623157e308])
async def test_extreme_retention_ages_are_applied_without_an_error(
    store: Store, days: float
) -> None:
    entry = MemoryEntry("default", "notes", "", "k", "green tea")
    await store.write_memory(entry, max_entries=2**62, max_age_days=days)
    kept = await store.list_memory(NOTES)
    removed = await store.prune_memory(NOTES, max_entries=1, max_age_days=days)
    # an age past any clock keeps everything; an age of almost nothing, nothing older
    assert [e.key for e in kept] == ["k"]
    assert removed == (1 if days < 1 else 0)


def test_an_overlap_that_would_repeat_a_text_many_times_is_refused(client: httpx.Client) -> None:
    """size 100, overlap 99: each chunk would start a word or two after the previous one,
    and a 1 MiB request would write some 350,000 entries (35 MB). Refused at once."""
    apply(
        client,
        "apiVersion: corral/v1\nkind: Memory\nmetadata: {name: hostile-overlap}\n"
        "spec: {chunking: {size: 100, overlap: 99}}\n",
    )
    base = "/v1/memories/hostile-overlap"
    refused = client.post(f"{base}/ingest", json={"text": "ab " * 100_000})
    assert refused.status_code == 400, refused.text[:300]
    assert refused.json()["code"] == "invalid_memory_input"
    assert "overlap" in refused.json()["detail"]
    assert client.get(base).json()["entries"] == 0
    # a short text (a few chunks) still goes in
    done = client.post(f"{base}/ingest", json={"text": "green tea " * 15})
    assert done.status_code == 200 and done.json()["chunks"] >= 2


def test_a_listing_prefix_with_control_characters_is_422_as_a_key_would_be(
    client: httpx.Client,
) -> None:
    # PostgreSQL keeps no NUL in text: such a prefix reached the store and failed there
    apply(client, MEMORY)
    for prefix in ("a\x00b", "a\nb"):
        answer = client.get("/v1/memories/hostile-notes/entries", params={"prefix": prefix})
        assert (answer.status_code, answer.json()["code"]) == (422, "invalid_request")
    assert client.get("/v1/memories/hostile-notes/entries", params={"prefix": "a b"}).is_success
