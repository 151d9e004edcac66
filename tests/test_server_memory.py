"""``/v1/memories/{name}/...``: a Memory's entries over the HTTP API."""

from __future__ import annotations

from typing import Any

import httpx

from corral.testing.fake_openai import FakeOpenAIServer
from server_harness import LiveServer, apply, wait_for

MEMORY = """
apiVersion: corral/v1
kind: Memory
metadata: {name: api-notes}
spec: {}
---
apiVersion: corral/v1
kind: Memory
metadata: {name: api-diary}
spec: {scope: agent}
"""


def test_entries_are_written_listed_read_searched_and_deleted(client: httpx.Client) -> None:
    apply(client, MEMORY)
    base = "/v1/memories/api-notes"
    for key, text in [("user/1", "likes green tea"), ("user/2", "likes black coffee")]:
        written = client.post(f"{base}/entries", json={"text": text, "key": key})
        assert written.status_code == 201, written.text
        assert written.json()["key"] == key and written.json()["scope_key"] == ""
    tagged = client.post(f"{base}/entries", json={"text": "tea at five", "metadata": {"t": 1}})
    generated = tagged.json()["key"]
    assert generated.startswith("mem_")

    first = client.get(f"{base}/entries", params={"prefix": "user/", "limit": 1}).json()
    assert [e["key"] for e in first["items"]] == ["user/1"]
    rest = client.get(
        f"{base}/entries", params={"prefix": "user/", "limit": 1, "cursor": first["next_cursor"]}
    ).json()
    assert [e["key"] for e in rest["items"]] == ["user/2"] and rest["next_cursor"] is None

    read = client.get(f"{base}/entries/user/1")
    assert read.status_code == 200 and read.json()["text"] == "likes green tea"

    found = client.post(f"{base}/search", json={"query": 'TEA" NEAR(*'}).json()["items"]
    assert sorted(h["key"] for h in found) == sorted(["user/1", generated])
    assert all(h["score"] > 0 and h["preview"] for h in found)
    filtered = client.post(f"{base}/search", json={"query": "tea", "filter": {"t": 1}}).json()
    assert [h["key"] for h in filtered["items"]] == [generated]

    stats = client.get(base).json()
    assert (stats["entries"], stats["scopes"]) == (3, 1) and "BM25" in stats["index"]
    assert client.get("/v1/memories/nowhere").status_code == 404
    assert client.delete(f"{base}/entries/user/1").status_code == 204
    # no such entry, and no such Memory: two codes
    missing = client.get(f"{base}/entries/user/1")
    assert missing.status_code == 404 and missing.json()["code"] == "memory_entry_not_found"
    gone = client.delete(f"{base}/entries/user/1")
    assert gone.status_code == 404 and gone.json()["code"] == "memory_entry_not_found"
    for answer in (
        client.get("/v1/memories/nowhere/entries/user/1"),
        client.delete("/v1/memories/nowhere/entries/user/1"),
    ):
        assert answer.status_code == 404 and answer.json()["code"] == "not_found"


def test_bad_writes_and_unknown_memories_get_stable_codes(client: httpx.Client) -> None:
    apply(client, MEMORY)
    huge = client.post("/v1/memories/api-notes/entries", json={"text": "x" * 20_000})
    assert huge.status_code == 400 and huge.json()["code"] == "invalid_memory_input"
    assert "at most 16000 characters" in huge.json()["detail"]
    nested = client.post(
        "/v1/memories/api-notes/entries", json={"text": "x", "metadata": {"a": {"b": 1}}}
    )
    assert nested.status_code == 400 and nested.json()["code"] == "invalid_memory_input"
    unknown = client.post("/v1/memories/nowhere/search", json={"query": "x"})
    assert unknown.status_code == 404 and unknown.json()["code"] == "not_found"
    no_agent = client.post("/v1/memories/api-diary/entries", json={"text": "x"})
    assert no_agent.status_code == 400 and "no agent was given" in no_agent.json()["detail"]
    mine = client.post(
        "/v1/memories/api-diary/entries", json={"text": "alice's day", "agent": "alice"}
    )
    assert mine.status_code == 201 and mine.json()["scope_key"] == "alice"
    bobs = client.post("/v1/memories/api-diary/search", json={"query": "day", "agent": "bob"})
    assert bobs.json()["items"] == []


def test_a_document_is_ingested_in_chunks_once(client: httpx.Client) -> None:
    apply(
        client,
        MEMORY
        + "---\n"
        + "apiVersion: corral/v1\nkind: Memory\nmetadata: {name: api-book}\n"
        + "spec: {chunking: {size: 100, overlap: 20}}\n",
    )
    text = " ".join(f"Line {i} of the book has words." for i in range(40))
    body = {"text": text, "source": "book.txt", "metadata": {"shelf": "a"}}
    first = client.post("/v1/memories/api-book/ingest", json=body)
    assert first.status_code == 200, first.text
    done = first.json()
    assert done["key_prefix"] == "book.txt" and done["chunks"] == done["written"] > 5
    assert done["keys"][:2] == ["book.txt#0", "book.txt#1"]
    again = client.post("/v1/memories/api-book/ingest", json=body).json()
    assert again["written"] == 0 and again["keys"] == done["keys"]
    entry = client.get("/v1/memories/api-book/entries/book.txt#1".replace("#", "%23")).json()
    assert entry["metadata"] == {
        "shelf": "a",
        "source": "book.txt",
        "chunk": 1,
        "chunks": done["chunks"],
    }
    assert len(entry["text"]) <= 100
    prefixed = client.post(
        "/v1/memories/api-book/ingest", json={"text": "short", "key_prefix": "p"}
    ).json()
    assert prefixed["keys"] == ["p#0"]
    # errors keep their codes
    assert client.post("/v1/memories/nowhere/ingest", json={"text": "x"}).json()["code"] == (
        "not_found"
    )
    blank = client.post("/v1/memories/api-book/ingest", json={"text": "   "})
    assert blank.status_code == 400 and blank.json()["code"] == "invalid_memory_input"
    huge = client.post("/v1/memories/api-book/ingest", json={"text": "x" * 5_000_001})
    assert huge.status_code in (413, 422), huge.text


def test_a_memory_with_an_embedding_model_answers_hybrid_hits_with_their_signals(
    client: httpx.Client,
) -> None:
    with FakeOpenAIServer(embedding_dimensions=8) as fake:
        apply(
            client,
            f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: api-embedder}}
spec: {{provider: openai, model: embed-small, base_url: "{fake.base_url}"}}
---
apiVersion: corral/v1
kind: Memory
metadata: {{name: api-vectors}}
spec: {{embedding: {{model: api-embedder, dimensions: 8}}}}
""",
        )
        base = "/v1/memories/api-vectors"
        for key, text in [("tea", "likes green tea"), ("coffee", "drinks black coffee")]:
            assert (
                client.post(f"{base}/entries", json={"text": text, "key": key}).status_code == 201
            )
        found = client.post(f"{base}/search", json={"query": "green tea", "top_k": 2})
        assert found.status_code == 200, found.text
        items = found.json()["items"]
        assert [h["key"] for h in items] == ["tea", "coffee"]
        assert items[0]["signals"] == ["fulltext", "vector"] and items[1]["signals"] == ["vector"]
        stats = client.get(base).json()
        assert stats["vectors"] == 2 and "api-embedder" in stats["index"]
        # the model dies: the search is a retryable 503 with a stable code, nothing half done
        fake.fail(500, times=None)
        failed = client.post(f"{base}/search", json={"query": "tea"})
        assert failed.status_code == 503 and failed.json()["code"] == "memory_backend_unavailable"
        refused = client.post(f"{base}/entries", json={"text": "new", "key": "new"})
        assert refused.status_code == 503
        assert client.get(f"{base}/entries/new").status_code == 404


def test_a_memory_naming_a_missing_embedding_model_is_refused_at_apply(
    client: httpx.Client,
) -> None:
    missing = client.post(
        "/v1/resources",
        content="""
apiVersion: corral/v1
kind: Memory
metadata: {name: api-bad}
spec: {embedding: {model: nowhere, dimensions: 8}}
""",
        headers={"content-type": "application/yaml"},
    )
    assert missing.status_code == 422 and "ModelEndpoint 'nowhere'" in missing.text


CREW = """
apiVersion: corral/v1
kind: Memory
metadata: {name: crew}
spec: {scope: system_run}
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: crew-model}
spec:
  provider: scripted
  script:
    - tool_calls: [{name: memory_write, arguments: {text: "the otters sleep by the weir", key: otters}}]
    - text: noted
---
apiVersion: corral/v1
kind: Agent
metadata: {name: crew-scout}
spec: {model: crew-model, memory: [{ref: crew, access: write}]}
---
apiVersion: corral/v1
kind: AgentSystem
metadata: {name: crew-team}
spec: {entry: crew-scout, graph: {crew-scout: {}}}
"""


def test_a_system_run_memory_is_named_by_its_system_run(
    server: LiveServer, client: httpx.Client
) -> None:
    """What the agents of one system run wrote is read, searched and written by the
    system run's id; without one, with a node run's, an unknown one or another
    namespace's, the request is refused with a stable code."""
    apply(client, CREW)
    created = client.post("/v1/systems/crew-team/tasks", json={"input": "scout"})
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]

    def done() -> dict[str, Any] | None:
        task: dict[str, Any] = client.get(f"/v1/tasks/{run_id}").json()
        return task if task["state"] in ("succeeded", "failed", "cancelled") else None

    assert wait_for(done, message="the system run")["state"] == "succeeded"
    scoped = {"system_run": run_id}
    base = "/v1/memories/crew"
    listed = client.get(f"{base}/entries", params=scoped).json()["items"]
    assert [(e["key"], e["scope_key"]) for e in listed] == [("otters", run_id)]
    read = client.get(f"{base}/entries/otters", params=scoped)
    assert read.status_code == 200 and read.json()["text"] == "the otters sleep by the weir"
    found = client.post(f"{base}/search", json={"query": "otters", **scoped}).json()["items"]
    assert [h["key"] for h in found] == ["otters"]
    added = client.post(f"{base}/entries", json={"text": "a heron too", "key": "heron", **scoped})
    assert added.status_code == 201 and added.json()["scope_key"] == run_id
    ingested = client.post(f"{base}/ingest", json={"text": "the weir is old", **scoped})
    assert ingested.status_code == 200, ingested.text
    assert client.delete(f"{base}/entries/heron", params=scoped).status_code == 204

    missing = client.post(f"{base}/entries", json={"text": "x"})
    assert missing.status_code == 400 and missing.json()["code"] == "invalid_memory_input"
    assert "no system_run was given" in missing.json()["detail"]
    [node] = client.get(f"/v1/tasks/{run_id}/children").json()["items"]
    by_node = client.get(f"{base}/entries", params={"system_run": node["id"]})
    assert by_node.status_code == 400 and by_node.json()["code"] == "invalid_memory_input"
    assert run_id in by_node.json()["detail"]
    unknown = client.post(f"{base}/search", json={"query": "x", "system_run": "run_nope"})
    assert unknown.status_code == 404 and unknown.json()["code"] == "not_found"
    hostile = client.get(f"{base}/entries", params={"system_run": "../" + "x" * 100})
    assert hostile.status_code == 422

    # another namespace with a Memory of the same name cannot reach this run's entries
    with server.client(server.mint("crew-other", "admin")) as other:
        apply(other, CREW.split("---")[0])
        foreign = other.get(f"{base}/entries", params=scoped)
        assert foreign.status_code == 404 and foreign.json()["code"] == "not_found"
        write = other.post(f"{base}/entries", json={"text": "planted", **scoped})
        assert write.status_code == 404
    after = client.get(f"{base}/entries", params=scoped).json()["items"]
    assert sorted(e["key"] for e in after) == ["api#0", "otters"]
