"""Hostile input to Memory: what an attacker or a careless caller sends to the store and
to ``/v1/memories``. Every answer is a stable error code, never a 500, and the server
goes on serving."""

from __future__ import annotations

import httpx
import pytest

from corral.core.memory import MemoryEntry, MemoryInputError, MemoryPlace
from corral.store import Store
from server_harness import apply
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
