"""The store methods the HTTP server adds, on every backend of ``store_url``: API tokens,
keyset pages of runs, and run counts for metrics."""

from __future__ import annotations

import time

import pytest

from corral.core.errors import ConflictError, NotFoundError
from corral.core.runs import RunRecord, RunState
from corral.core.tokens import Role, mint_token, parse_token
from corral.store import Store
from store_helpers import create_run
from test_store import cipher_fixture, store_fixture, store_url_fixture

__all__ = ["cipher_fixture", "store_fixture", "store_url_fixture"]


async def test_a_token_is_stored_hashed_listed_and_revoked_once(store: Store) -> None:
    token, plain = mint_token("team-a", Role.OPERATOR, name="ci", description="the CI job")
    await store.create_token(token)
    token_id, secret = parse_token(plain) or ("", "")
    assert token_id == token.id and secret not in token.secret_hash

    stored = await store.get_token(token.id)
    assert stored is not None
    assert (stored.namespace, stored.role, stored.name) == ("team-a", Role.OPERATOR, "ci")
    wrong = secret[:-1] + ("1" if secret.endswith("0") else "0")
    assert stored.matches(secret) and not stored.matches(wrong)
    assert await store.get_token("tok_absent") is None

    other, _ = mint_token("team-b", Role.VIEWER)
    await store.create_token(other)
    assert [t.id for t in await store.list_tokens("team-a")] == [token.id]
    assert {t.id for t in await store.list_tokens()} == {token.id, other.id}
    with pytest.raises(ConflictError):
        await store.create_token(token)

    first = await store.revoke_token(token.id)
    again = await store.revoke_token(token.id)
    assert first.revoked and again.revoked_at == first.revoked_at
    with pytest.raises(NotFoundError):
        await store.revoke_token("tok_absent")


async def test_touching_a_token_only_moves_last_used_forward(store: Store) -> None:
    token, _ = mint_token("default", Role.VIEWER)
    await store.create_token(token)
    await store.touch_token(token.id, 200.0)
    await store.touch_token(token.id, 100.0)  # a late write from another process
    stored = await store.get_token(token.id)
    assert stored is not None and stored.last_used_at == 200.0


def run(run_id: str, created_at: float, state: RunState = RunState.QUEUED) -> RunRecord:
    return RunRecord(
        id=run_id, namespace="default", agent="a", input="x", state=state, created_at=created_at
    )


async def test_runs_page_by_keyset_without_gaps_or_repeats(store: Store) -> None:
    # Three runs share a timestamp: the id breaks the tie, so a page boundary between
    # them neither skips nor repeats one.
    for run_id, created_at in [("run_a", 1.0), ("run_b", 2.0), ("run_c", 2.0), ("run_d", 2.0)]:
        await create_run(store, run(run_id, created_at))
    await create_run(store, run("run_e", 3.0, RunState.SUCCEEDED))
    seen: list[str] = []
    before: tuple[float, str] | None = None
    while True:
        page = await store.list_runs("default", limit=2, before=before)
        seen += [r.id for r in page]
        if len(page) < 2:
            break
        before = (page[-1].created_at, page[-1].id)
    assert seen == ["run_e", "run_d", "run_c", "run_b", "run_a"]
    queued = await store.list_runs("default", states=[RunState.QUEUED], before=(2.0, "run_c"))
    assert [r.id for r in queued] == ["run_b", "run_a"]


async def test_run_counts_by_state_and_the_due_queue(store: Store) -> None:
    now = time.time()
    await create_run(store, run("run_due", now))
    later = run("run_later", now)
    later.not_before = now + 3600
    await create_run(store, later)
    await create_run(store, run("run_done", now, RunState.SUCCEEDED))
    counts = await store.count_runs(now=now)
    assert counts.by_state == {
        ("default", RunState.QUEUED): 2,
        ("default", RunState.SUCCEEDED): 1,
    }
    assert counts.due == 1
