"""Keyset pages of the approvals, sessions, resources and tokens lists, on every backend of
``store_url``: walking pages lists every row once in the list's order, a page after the
last row is empty, and a namespace's pages never show another namespace's rows."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from corral.core.tokens import ApiToken, Role, mint_token
from corral.resources.loader import load_text
from corral.store import Store
from test_store import cipher_fixture, store_fixture, store_url_fixture
from test_store_durable import an_approval, park_for_approval

__all__ = ["cipher_fixture", "store_fixture", "store_url_fixture"]

T = TypeVar("T")
Lister = Callable[[int, Any], Awaitable[list[T]]]


async def walk(listing: Lister[T], key: Callable[[T], Sequence[Any]], size: int) -> list[T]:
    """Every item of a listing, a page of ``size`` at a time from the last key of the previous
    page; checks that the page after the last item is empty (a cursor at the end)."""
    seen: list[T] = []
    after: Any = None
    while True:
        page = await listing(size, after)
        assert len(page) <= size
        seen += page
        if not page:
            return seen
        after = tuple(key(page[-1]))


async def test_approvals_page_oldest_first_with_ties_broken_by_id(store: Store) -> None:
    # Three approvals share a timestamp: the id orders them, so a page boundary between
    # them neither repeats nor skips one.
    times = {"apr_a": 1.0, "apr_b": 2.0, "apr_c": 2.0, "apr_d": 2.0, "apr_e": 3.0}
    approvals = [
        dataclasses.replace(an_approval(a, "run_1", call_id=a), requested_at=at)
        for a, at in times.items()
    ]
    await park_for_approval(store, "run_1", *reversed(approvals))
    elsewhere = dataclasses.replace(an_approval("apr_x", "run_2"), namespace="team")
    await park_for_approval(store, "run_2", elsewhere)

    def listing(limit: int, after: Any) -> Awaitable[list[Any]]:
        return store.list_approvals("default", limit=limit, after=after)

    seen = await walk(listing, lambda a: (a.requested_at, a.id), 2)
    assert [a.id for a in seen] == list(times)
    assert [a.id for a in await store.list_approvals("default")] == list(times)
    assert await store.list_approvals("default", after=(3.0, "apr_e")) == []
    # filters and keyset together; a position between rows (one deleted meanwhile)
    pending = await store.list_approvals(
        run_id="run_1", states=["pending"], limit=2, after=(2.0, "apr_bb")
    )
    assert [a.id for a in pending] == ["apr_c", "apr_d"]
    assert [a.id for a in await store.list_approvals("team", limit=5)] == ["apr_x"]


async def test_sessions_page_most_recent_first(store: Store) -> None:
    for n in range(5):
        await store.get_or_create_session("default", f"ses_{n}", "assistant")
    await store.get_or_create_session("team", "ses_t", "assistant")
    every = await store.list_sessions("default")
    assert {s.id for s in every} == {f"ses_{n}" for n in range(5)}
    assert [(s.updated_at, s.id) for s in every] == sorted(
        ((s.updated_at, s.id) for s in every), reverse=True
    )

    def listing(limit: int, after: Any) -> Awaitable[list[Any]]:
        return store.list_sessions("default", limit=limit, after=after)

    assert await walk(listing, lambda s: (s.updated_at, s.id), 2) == every
    last = every[-1]
    assert await store.list_sessions("default", after=(last.updated_at, last.id)) == []
    assert [s.id for s in await store.list_sessions("team", limit=10)] == ["ses_t"]
    assert await store.list_sessions("default", "nobody", limit=2) == []


async def test_resources_page_by_kind_and_name(store: Store) -> None:
    documents = "---\n".join(
        f"apiVersion: corral/v1\nkind: Secret\nmetadata: {{name: key-{n}, namespace: {ns}}}\n"
        "spec: {value: x-secret-value}\n"
        for ns, n in [("default", 3), ("default", 1), ("team", 0), ("default", 2)]
    )
    await store.apply(load_text(documents))
    every = await store.list_resources("default")
    keys = [(s.resource.kind, s.resource.name) for s in every]
    assert keys == [("Secret", "key-1"), ("Secret", "key-2"), ("Secret", "key-3")]

    def listing(limit: int, after: Any) -> Awaitable[list[Any]]:
        return store.list_resources("default", limit=limit, after=after)

    assert await walk(listing, lambda s: (s.resource.kind, s.resource.name), 2) == every
    after_agents = await store.list_resources("default", "Secret", after=("Agent", "zz"))
    assert after_agents == every
    assert await store.list_resources("default", after=("Secret", "key-3")) == []
    assert [s.resource.name for s in await store.list_resources("team", limit=9)] == ["key-0"]


async def test_tokens_page_oldest_first_with_ties_broken_by_id(store: Store) -> None:
    made: list[ApiToken] = []
    for created_at in [5.0, 5.0, 5.0, 6.0, 4.0]:
        token = dataclasses.replace(mint_token("team-a", Role.VIEWER)[0], created_at=created_at)
        await store.create_token(token)
        made.append(token)
    await store.create_token(mint_token("team-b", Role.ADMIN)[0])
    expected = [t.id for t in sorted(made, key=lambda t: (t.created_at, t.id))]

    def listing(limit: int, after: Any) -> Awaitable[list[Any]]:
        return store.list_tokens("team-a", limit=limit, after=after)

    seen = await walk(listing, lambda t: (t.created_at, t.id), 2)
    assert [t.id for t in seen] == expected
    assert await store.list_tokens("team-a", after=(6.0, expected[-1])) == []
    assert len(await store.list_tokens(limit=1)) == 1
    assert len(await store.list_tokens()) == 6
