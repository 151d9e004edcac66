"""``/v1/memories/{name}/...``: a Memory's entries over the HTTP API."""

from __future__ import annotations

import httpx

from server_harness import apply

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
    assert (stats["entries"], stats["scopes"]) == (3, 1) and "FTS5" in stats["index"]
    assert client.get("/v1/memories/nowhere").status_code == 404
    assert client.delete(f"{base}/entries/user/1").status_code == 204
    missing = client.get(f"{base}/entries/user/1")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"


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
