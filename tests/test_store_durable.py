"""Durable runs in the store: submits, claims, leases and fencing, approvals, sessions.

Run against every store URL of ``store_url`` (SQLite, both paths, and PostgreSQL),
with several store instances on one database where a race is the point.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from corral.core.errors import ConflictError, LeaseLostError, NotFoundError
from corral.core.events import Event, EventType, RunFinishData, RunStartData, StepStartData
from corral.core.messages import Message
from corral.core.runs import Approval, ApprovalState, Lease, RunRecord, RunState
from corral.resources.loader import load_text
from corral.resources.secrets import SecretCipher
from corral.store import Store, open_store
from corral.store.schema import LATEST_REVISION
from corral.store.sql import MIGRATIONS_DIR
from databases import on_database, rows_of
from store_helpers import append_session_messages, create_run
from test_store import (  # noqa: F401 - fixtures
    SRC,
    a_run,
    cipher_fixture,
    sqlite_path,
    store_fixture,
    store_url_fixture,
)


@pytest.fixture(name="other_store")
async def other_store_fixture(store_url: str, cipher: SecretCipher) -> AsyncIterator[Store]:
    """A second, independent store instance on the same database."""
    async with await open_store(store_url, cipher=cipher) as opened:
        yield opened


def a_task(
    run_id: str,
    *,
    key: str | None = None,
    priority: int = 0,
    created_at: float = 1000.0,
    not_before: float = 0.0,
) -> RunRecord:
    return RunRecord(
        id=run_id,
        namespace="default",
        agent="assistant",
        input=f"input of {run_id}",
        idempotency_key=key,
        priority=priority,
        created_at=created_at,
        not_before=not_before,
    )


def an_approval(
    approval_id: str, run_id: str, *, call_id: str = "c1", expires_at: float | None = None
) -> Approval:
    return Approval(
        id=approval_id,
        run_id=run_id,
        namespace="default",
        agent="assistant",
        call_id=call_id,
        tool="delete_everything",
        arguments='{"really": true}',
        reason="destructive",
        requested_at=time.time(),
        expires_at=expires_at,
    )


async def claim_one(store: Store, owner: str = "w1", **kwargs: float) -> tuple[RunRecord, Lease]:
    [(record, lease)] = await store.claim_runs(owner, 30.0, **kwargs)
    return record, lease


def child_env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
        "CORRAL_HOME": str(tmp_path / "home"),
    }


# --------------------------------------------------------------------------- submit


async def test_submit_stores_a_queued_run_and_keys_deduplicate(store: Store) -> None:
    record, created = await store.submit_run(a_task("run_1", key="k"))
    assert created and record.id == "run_1"
    again, created = await store.submit_run(a_task("run_2", key="k"))
    assert not created
    assert again == await store.get_run("run_1")
    assert again.input == "input of run_1"

    # Keys are scoped by namespace and agent; runs without a key never collide.
    other = a_task("run_3", key="k")
    other.agent = "other"
    assert (await store.submit_run(other))[1]
    assert (await store.submit_run(a_task("run_4")))[1]
    assert (await store.submit_run(a_task("run_5")))[1]
    with pytest.raises(ConflictError):
        await store.submit_run(a_task("run_4", key="fresh"))  # a clashing id still conflicts
    assert await store.get_run("run_2") is None


SCRIPT_ENDPOINT = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: script}
spec: {provider: scripted}
"""

AGENTS = (
    SCRIPT_ENDPOINT
    + """---
apiVersion: corral/v1
kind: Agent
metadata: {name: assistant}
spec: {model: script, max_attempts: 7}
"""
)


async def test_submit_agent_run_takes_the_agents_max_attempts_and_can_claim_at_once(
    store: Store,
) -> None:
    with pytest.raises(NotFoundError, match="Agent 'assistant' not found"):
        await store.submit_agent_run(a_task("run_0"))
    assert await store.get_run("run_0") is None
    await store.apply(load_text(AGENTS, "agents.yaml"))

    queued = await store.submit_agent_run(a_task("run_1", key="k"))
    assert queued.created and queued.lease is None
    assert (await store.get_run("run_1")) == queued.record
    assert queued.record.max_attempts == 7 and queued.record.state is RunState.QUEUED

    claimed = await store.submit_agent_run(a_task("run_2"), claim_for=("me", 30.0))
    assert claimed.created and claimed.lease is not None
    assert claimed.lease.owner == "me" and claimed.lease.token == 1
    assert claimed.record == await store.get_run("run_2")
    assert claimed.record.state is RunState.RUNNING and claimed.record.attempts == 1
    assert claimed.record.lease_owner == "me" and claimed.record.max_attempts == 7
    await store.append_events(
        [Event("run_2", 1, RunStartData(agent="a", input="x"))], claimed.lease
    )
    assert [r.id for r, _ in await store.claim_runs("w1", 30.0, 10)] == ["run_1"]

    # A key seen before: the earlier run, not claimed; a run not due yet: not claimed.
    again = await store.submit_agent_run(a_task("run_3", key="k"), claim_for=("me", 30.0))
    assert not again.created and again.lease is None and again.record.id == "run_1"
    later = await store.submit_agent_run(
        a_task("run_4", not_before=time.time() + 60), claim_for=("me", 30.0)
    )
    assert later.created and later.lease is None
    assert (await store.get_run("run_4")).state is RunState.QUEUED  # type: ignore[union-attr]


async def test_submit_agent_run_keeps_an_agents_max_concurrent_runs(store: Store) -> None:
    await store.apply(load_text(LIMITED % 1, "limits.yaml"))
    first = await store.submit_agent_run(agent_task("lim_1", "limited"), claim_for=("me", 30.0))
    second = await store.submit_agent_run(agent_task("lim_2", "limited"), claim_for=("me", 30.0))
    assert first.lease is not None and second.lease is None  # the agent runs one at a time
    assert (await store.get_run("lim_2")).state is RunState.QUEUED  # type: ignore[union-attr]


async def test_a_limit_applied_after_claims_is_kept_by_the_next_ones(store: Store) -> None:
    # (the SQLite fast path keeps "no agent is limited" between commits of other
    # connections: an apply is one)
    unlimited = (LIMITED % 1).replace(", max_concurrent_runs: 1", "")
    await store.apply(load_text(unlimited, "limits.yaml"))
    first = await store.submit_agent_run(agent_task("lim_1", "limited"), claim_for=("me", 30.0))
    assert first.lease is not None
    await store.apply(load_text(LIMITED % 1, "limits.yaml"))
    second = await store.submit_agent_run(agent_task("lim_2", "limited"), claim_for=("me", 30.0))
    assert second.lease is None  # lim_1 still runs: the agent runs one at a time now
    assert await store.claim_runs("w", 30.0, 5) == []


SUBMIT_CHILD = """\
import asyncio, json, sys
from corral.core.runs import RunRecord
from corral.store import open_store

async def main(url, tag):
    store = await open_store(url)
    try:
        results = await asyncio.gather(*(
            store.submit_run(RunRecord(id=f"run_{tag}_{i}", namespace="default",
                                       agent="assistant", input=tag, idempotency_key="once"))
            for i in range(10)
        ))
    finally:
        await store.close()
    print(json.dumps([[r.id, created] for r, created in results]))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_racing_submits_with_one_key_create_exactly_one_run(
    store: Store, store_url: str, cipher: SecretCipher, tmp_path: Path
) -> None:
    def in_thread(tag: str) -> list[tuple[str, bool]]:
        async def main() -> list[tuple[str, bool]]:
            async with await open_store(store_url, cipher=cipher) as own:
                results = await asyncio.gather(
                    *(own.submit_run(a_task(f"run_{tag}_{i}", key="once")) for i in range(10))
                )
            return [(r.id, created) for r, created in results]

        return asyncio.run(main())

    async def in_process(tag: str) -> list[tuple[str, bool]]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            SUBMIT_CHILD,
            store_url,
            tag,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=child_env(tmp_path),
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        return [(run_id, created) for run_id, created in json.loads(out)]

    async def in_task(i: int) -> list[tuple[str, bool]]:
        record, created = await store.submit_run(a_task(f"run_task_{i}", key="once"))
        return [(record.id, created)]

    batches = await asyncio.gather(
        *(in_task(i) for i in range(50)),
        *(asyncio.to_thread(in_thread, f"thread{t}") for t in range(4)),
        *(in_process(f"proc{p}") for p in range(2)),
    )
    results = [result for batch in batches for result in batch]
    assert len(results) == 50 + 4 * 10 + 2 * 10
    winners = [run_id for run_id, created in results if created]
    assert len(winners) == 1
    assert {run_id for run_id, _ in results} == set(winners)
    assert [r.id for r in await store.list_runs("default", limit=1000)] == winners


# --------------------------------------------------------------------------- claims


async def test_claims_from_two_store_instances_never_overlap(
    store: Store, other_store: Store
) -> None:
    total = 300
    for i in range(total):
        await store.submit_run(a_task(f"run_{i:03}", priority=i % 3, created_at=1000.0 + i))
    claimed: list[tuple[str, str, int]] = []

    async def claimer(instance: Store, name: str) -> None:
        rng = random.Random(name)
        while True:
            batch = await instance.claim_runs(name, 60.0, limit=rng.randint(1, 7))
            if not batch:
                return
            claimed.extend((record.id, name, lease.token) for record, lease in batch)

    await asyncio.gather(
        *(claimer(store, f"a{i}") for i in range(4)),
        *(claimer(other_store, f"b{i}") for i in range(4)),
    )
    ids = [run_id for run_id, _, _ in claimed]
    assert len(ids) == len(set(ids)) == total
    assert {token for _, _, token in claimed} == {1}
    for run_id, owner, _ in random.Random(0).sample(claimed, 20):
        stored = await store.get_run(run_id)
        assert stored is not None
        assert (stored.state, stored.lease_owner, stored.attempts) == (RunState.RUNNING, owner, 1)


async def test_claims_go_by_priority_then_age_and_respect_not_before(store: Store) -> None:
    now = time.time()
    await store.submit_run(a_task("old_low", priority=0, created_at=1.0))
    await store.submit_run(a_task("new_high", priority=5, created_at=3.0))
    await store.submit_run(a_task("old_high", priority=5, created_at=2.0))
    await store.submit_run(a_task("later_top", priority=9, created_at=0.5, not_before=now + 60))
    await store.submit_run(a_task("mid", priority=1, created_at=9.0))

    hour = 3600.0  # leases outlive the test's clock: nothing expires and gets reclaimed
    first = await store.claim_runs("w", hour, limit=2, now=now)
    assert [record.id for record, _ in first] == ["old_high", "new_high"]
    rest = await store.claim_runs("w", hour, limit=10, now=now)
    assert [record.id for record, _ in rest] == ["mid", "old_low"]
    assert await store.claim_runs("w", hour, now=now + 59) == []
    [(late, lease)] = await store.claim_runs("w", 30.0, now=now + 61)
    assert late.id == "later_top"
    assert lease == Lease("later_top", "w", 1, now + 61 + 30.0)
    assert (late.state, late.lease_owner, late.lease_expires_at) == (
        RunState.RUNNING,
        "w",
        now + 61 + 30.0,
    )
    assert (late.attempts, late.fencing_token, late.started_at) == (1, 1, now + 61)
    assert await store.claim_runs("w", 30.0, limit=0, now=now + 61) == []


async def test_a_claim_of_given_runs_lets_more_urgent_runs_go_first(store: Store) -> None:
    now, hour = time.time(), 3600.0
    await store.submit_run(a_task("given_low", priority=0, created_at=1.0))
    await store.submit_run(a_task("given_mid", priority=2, created_at=2.0))
    await store.submit_run(a_task("urgent", priority=5, created_at=9.0))
    await store.submit_run(a_task("older_equal", priority=0, created_at=0.5))
    await store.submit_run(a_task("not_due", priority=9, created_at=0.1, not_before=now + 60))

    plain = await store.claim_runs("w", hour, 1, now=now, run_ids=["given_mid"])
    assert [r.id for r, _ in plain] == ["given_mid"]  # only the given ones compete
    either = await store.claim_runs(
        "w", hour, 2, now=now, run_ids=["given_low"], or_higher_priority=True
    )
    # More urgent than the given run goes first; an older run of the same priority does
    # not (its own delivery comes), nor does one that is not due.
    assert [r.id for r, _ in either] == ["urgent", "given_low"]
    # None of the given runs claimable: nothing is claimed, however urgent the rest.
    await store.submit_run(a_task("urgent_too", priority=7, created_at=10.0))
    assert (
        await store.claim_runs(
            "w", hour, 2, now=now, run_ids=["given_low", "gone"], or_higher_priority=True
        )
        == []
    )
    queued = {r.id for r in await store.list_runs("default", states=[RunState.QUEUED])}
    assert queued == {"older_equal", "not_due", "urgent_too"}


async def test_an_expired_only_claim_takes_over_dead_leases_and_leaves_the_queue(
    store: Store,
) -> None:
    now, hour = time.time(), 3600.0
    await store.submit_run(a_task("held", priority=0, created_at=1.0))
    await store.submit_run(a_task("dropped", priority=0, created_at=2.0))
    [(_, old)] = await store.claim_runs("dead", 30.0, 1, now=now, run_ids=["held"])
    await store.claim_runs("alive", hour, 1, now=now, run_ids=["dropped"])
    await store.submit_run(a_task("queued", priority=9, created_at=0.5))

    assert await store.claim_runs("w", hour, 5, now=now + 29, expired_only=True) == []
    [(taken, lease)] = await store.claim_runs("w", hour, 5, now=now + 31, expired_only=True)
    assert (taken.id, taken.attempts, lease.token) == ("held", 2, old.token + 1)
    assert [r.id for r, _ in await store.claim_runs("w", hour, 5, now=now + 31)] == ["queued"]


async def test_an_expired_only_claim_of_a_limited_agent(store: Store) -> None:
    # Agents with max_concurrent_runs go through the SQLAlchemy claim on every store.
    await store.apply(load_text(LIMITED % 1, "limits.yaml"))
    await store.submit_run(agent_task("lim_old", "limited"))
    await store.claim_runs("dead", 30.0, 1)
    await store.submit_run(agent_task("lim_new", "limited"))
    later = time.time() + 60
    retaken = await store.claim_runs("w", 30.0, 5, now=later, expired_only=True)
    assert [r.id for r, _ in retaken] == ["lim_old"]
    queued = {r.id for r in await store.list_runs("default", states=[RunState.QUEUED])}
    assert queued == {"lim_new"}


async def test_unleased_running_runs_are_never_claimed(store: Store) -> None:
    running = a_run("run_local")
    running.state = RunState.RUNNING  # as the local runtime stores it: no lease at all
    await create_run(store, running)
    assert await store.claim_runs("w", 30.0, now=time.time() + 10_000) == []


# --------------------------------------------------------------------------- leases and fencing


async def test_an_expired_lease_is_reclaimed_and_the_old_holder_is_fenced_off(
    store: Store, other_store: Store
) -> None:
    now = time.time()
    await store.submit_run(a_task("run_1"))
    session = await store.get_or_create_session("default", "ses_1", "assistant")
    record, old = await claim_one(store, "w1", now=now)
    assert old.token == 1
    await store.append_events(
        [Event("run_1", 1, RunStartData(agent="a", input="x"), ts=1.0)], lease=old
    )

    assert await other_store.claim_runs("w2", 30.0, now=now + 29) == []  # not expired yet
    [(reclaimed, new)] = await other_store.claim_runs("w2", 30.0, now=now + 31)
    assert new == Lease("run_1", "w2", 2, now + 61)
    assert (reclaimed.attempts, reclaimed.lease_owner, reclaimed.started_at) == (2, "w2", now)

    record.state, record.output, record.finished_at = RunState.SUCCEEDED, "stale", now
    with pytest.raises(LeaseLostError, match="run_1"):
        await store.save_run(record, lease=old, approvals=[an_approval("apr_1", "run_1")])
    with pytest.raises(LeaseLostError):
        await store.append_events([Event("run_1", 2, RunFinishData(state="succeeded"))], lease=old)
    with pytest.raises(LeaseLostError):
        await store.release_run(old, not_before=now + 999)
    with pytest.raises(LeaseLostError):
        await append_session_messages(
            store, "default", session.id, [Message.user("stale")], lease=old
        )
    with pytest.raises(LeaseLostError):
        await store.renew_lease(old, 30.0)

    # Nothing of the stale holder's writes landed.
    assert await store.get_run("run_1") == reclaimed
    assert [e.seq for e in await store.list_events("run_1")] == [1]
    assert await store.list_approvals() == []
    assert await store.session_messages("default", session.id, include_hidden=True) == []

    # The new holder writes freely.
    await other_store.append_events(
        [Event("run_1", 2, RunFinishData(state="succeeded"))], lease=new
    )
    [stored] = await append_session_messages(
        other_store, "default", session.id, [Message.assistant("fresh")], lease=new
    )
    assert stored.run_id == "run_1"
    reclaimed.state, reclaimed.output = RunState.SUCCEEDED, "fresh"
    await other_store.save_run(reclaimed, lease=new)
    finished = await store.get_run("run_1")
    assert finished is not None
    assert (finished.state, finished.output) == (RunState.SUCCEEDED, "fresh")
    assert (finished.lease_owner, finished.lease_expires_at, finished.fencing_token) == (
        None,
        None,
        2,
    )


async def test_expiry_alone_does_not_refuse_a_fenced_write(store: Store) -> None:
    await store.submit_run(a_task("run_1"))
    record, lease = await claim_one(store, now=time.time() - 3600)  # expired an hour ago
    record.steps = 3
    await store.save_run(record, lease=lease)
    await store.append_events([Event("run_1", 1, RunStartData(agent="a", input="x"))], lease=lease)
    renewed, cancel = await store.renew_lease(lease, 30.0)
    assert not cancel and renewed.token == lease.token
    assert renewed.expires_at > time.time() + 20
    stored = await store.get_run("run_1")
    assert stored is not None
    assert (stored.steps, stored.state, stored.lease_expires_at) == (
        3,
        RunState.RUNNING,
        renewed.expires_at,
    )


async def test_fenced_writes_check_the_lease_belongs_to_the_run(store: Store) -> None:
    await store.submit_run(a_task("run_1"))
    await create_run(store, a_run("run_2"))
    _, lease = await claim_one(store)
    with pytest.raises(ConflictError):
        await store.append_events(
            [Event("run_2", 1, RunStartData(agent="a", input="x"))], lease=lease
        )
    other = await store.get_run("run_2")
    assert other is not None
    with pytest.raises(ConflictError):
        await store.save_run(other, lease=lease)
    ghost = Lease("run_ghost", "w1", 1, 0.0)
    with pytest.raises(NotFoundError):
        await store.renew_lease(ghost, 30.0)
    with pytest.raises(NotFoundError):
        await store.release_run(ghost)


async def test_save_run_ignores_the_lease_columns_of_the_record(store: Store) -> None:
    await store.submit_run(a_task("run_1"))
    record, lease = await claim_one(store)
    record.lease_owner, record.fencing_token, record.lease_expires_at = "forged", 99, 1.0
    await store.save_run(record, lease=lease)
    stored = await store.get_run("run_1")
    assert stored is not None
    assert (stored.lease_owner, stored.fencing_token) == ("w1", 1)
    assert stored.lease_expires_at == lease.expires_at


async def test_renew_reports_a_cancel_request_that_a_save_cannot_undo(store: Store) -> None:
    await store.submit_run(a_task("run_1"))
    record, lease = await claim_one(store)
    assert (await store.renew_lease(lease, 30.0))[1] is False
    cancelled = await store.request_cancel("run_1")
    assert (cancelled.state, cancelled.cancel_requested) == (RunState.RUNNING, True)
    record.steps = 1  # the worker's copy predates the request
    await store.save_run(record, lease=lease)
    renewed, cancel = await store.renew_lease(lease, 30.0)
    assert cancel is True and renewed.token == lease.token
    stored = await store.get_run("run_1")
    assert stored is not None and stored.cancel_requested and stored.steps == 1


async def test_release_with_not_before_delays_the_next_claim(store: Store) -> None:
    now = time.time()
    await store.submit_run(a_task("run_1"))
    _, lease = await claim_one(store, now=now)
    await store.release_run(lease, not_before=now + 30)
    released = await store.get_run("run_1")
    assert released is not None
    assert (released.state, released.lease_owner, released.lease_expires_at) == (
        RunState.QUEUED,
        None,
        None,
    )
    assert released.not_before == now + 30 and released.attempts == 1
    assert await store.claim_runs("w2", 30.0, now=now + 10) == []
    record, again = await claim_one(store, "w2", now=now + 31)
    assert (record.attempts, again.token) == (2, 2)
    with pytest.raises(LeaseLostError):
        await store.release_run(lease)


async def test_a_shutdown_release_gives_the_claims_attempt_back(store: Store) -> None:
    task = a_task("run_1")
    task.max_attempts = 2
    await store.submit_run(task)
    for _ in range(5):  # rolling restarts during one long run, more than max_attempts
        record, lease = await claim_one(store)
        assert (record.attempts, lease.exhausted) == (1, False)
        await store.release_run(lease, refund_attempt=True)
        released = await store.get_run("run_1")
        assert released is not None
        assert (released.state, released.attempts) == (RunState.QUEUED, 0)
    # a retry with backoff counts its attempt: the next claim is the last one, and runs
    _, lease = await claim_one(store)
    await store.release_run(lease)
    record, lease = await claim_one(store)
    assert (record.attempts, lease.exhausted) == (2, False)
    # never below 0: a run whose attempts restarted (an approval) under this lease
    record.attempts = 0
    await store.save_run(record, lease=lease)
    await store.release_run(lease, refund_attempt=True)
    released = await store.get_run("run_1")
    assert released is not None and released.attempts == 0


async def test_the_claim_that_only_ends_a_run_counts_no_attempt(store: Store) -> None:
    task = a_task("run_1")
    task.max_attempts = 2
    await store.submit_run(task)
    now = time.time()
    # Its workers die: each lease (30 s) expires unreleased.
    first, first_lease = await claim_one(store, now=now)
    last, last_lease = await claim_one(store, "w2", now=now + 31)
    assert (first.attempts, first_lease.exhausted) == (1, False)
    assert (last.attempts, last_lease.exhausted) == (2, False)  # the last attempt still runs
    for owner, at in (("w3", now + 62), ("w4", now + 93)):
        # a claim that only ends the run, and its worker dies right after it too
        record, lease = await claim_one(store, owner, now=at)
        stored = await store.get_run("run_1")
        assert stored is not None
        assert (stored.state, stored.lease_owner, stored.attempts) == (RunState.RUNNING, owner, 2)
        assert (record.attempts, lease.exhausted) == (2, True)


async def test_releasing_a_run_already_saved_as_finished_changes_nothing(store: Store) -> None:
    await store.submit_run(a_task("run_1"))
    record, lease = await claim_one(store)
    record.state = RunState.SUCCEEDED
    await store.save_run(record, lease=lease)
    await store.release_run(lease)  # e.g. a shutdown path that releases unconditionally
    stored = await store.get_run("run_1")
    assert stored is not None and stored.state is RunState.SUCCEEDED
    with pytest.raises(LeaseLostError):
        await store.renew_lease(lease, 30.0)


async def test_request_cancel_by_state(store: Store) -> None:
    await store.submit_run(a_task("queued"))
    cancelled = await store.request_cancel("queued")
    assert cancelled.state is RunState.CANCELLED and cancelled.finished_at is not None
    assert await store.claim_runs("w", 30.0) == []

    done = a_run("done")
    done.state = RunState.FAILED
    await create_run(store, done)
    assert await store.request_cancel("done") == done
    with pytest.raises(NotFoundError, match="ghost"):
        await store.request_cancel("ghost")


async def test_appends_of_one_run_are_stored_in_call_order_for_a_follower(
    store: Store, other_store: Store
) -> None:
    """Batches handed over at once (parallel tool calls flush them so) commit in the
    order they were handed over: a reader following with a cursor never skips one."""
    await store.submit_run(a_task("run_1"))
    _, lease = await claim_one(store)
    total = 60
    seen: list[int] = []
    done = asyncio.Event()

    async def follow() -> None:
        cursor = 0
        while True:
            finished = done.is_set()
            for event in await other_store.list_events("run_1", after_seq=cursor):
                assert event.seq == cursor + 1, f"the follower skipped from {cursor} to {event.seq}"
                cursor = event.seq
                seen.append(cursor)
            if finished:
                return
            await asyncio.sleep(0)

    follower = asyncio.ensure_future(follow())
    await asyncio.gather(
        *(
            store.append_events([Event("run_1", seq, StepStartData(step=1))], lease=lease)
            for seq in range(1, total + 1)
        )
    )
    done.set()
    await follower
    assert seen == list(range(1, total + 1))


# --------------------------------------------------------------------------- approvals


async def park_for_approval(store: Store, run_id: str, *approvals: Approval) -> RunRecord:
    """Claim ``run_id`` and save it as waiting for ``approvals``, as a worker would."""
    await store.submit_run(a_task(run_id))
    record, lease = await claim_one(store)
    record.state = RunState.WAITING_APPROVAL
    await store.save_run(record, lease=lease, approvals=approvals)
    return record


async def test_approvals_are_stored_with_the_run_and_requeue_it_once_all_are_decided(
    store: Store,
) -> None:
    await park_for_approval(
        store, "run_1", an_approval("apr_1", "run_1"), an_approval("apr_2", "run_1", call_id="c2")
    )
    waiting = await store.get_run("run_1")
    assert waiting is not None
    assert (waiting.state, waiting.lease_owner, waiting.lease_expires_at) == (
        RunState.WAITING_APPROVAL,
        None,
        None,
    )
    assert [a.id for a in await store.list_approvals("default", states=["pending"])] == [
        "apr_1",
        "apr_2",
    ]
    assert await store.list_approvals("elsewhere") == []

    approved = await store.decide_approval("apr_1", True, by="alice", reason="fine")
    assert (approved.state, approved.decided_by, approved.decision_reason) == (
        ApprovalState.APPROVED,
        "alice",
        "fine",
    )
    assert approved.decided_at is not None
    assert await store.get_approval("apr_1") == approved
    still = await store.get_run("run_1")
    assert still is not None and still.state is RunState.WAITING_APPROVAL
    assert await store.claim_runs("w2", 30.0) == []

    with pytest.raises(ConflictError, match="already approved"):
        await store.decide_approval("apr_1", False)
    with pytest.raises(NotFoundError):
        await store.decide_approval("apr_ghost", True)

    rejected = await store.decide_approval("apr_2", False, by="bob")
    assert rejected.state is ApprovalState.REJECTED
    requeued = await store.get_run("run_1")
    assert requeued is not None and requeued.state is RunState.QUEUED
    assert requeued.not_before <= time.time()
    [(resumed, lease)] = await store.claim_runs("w2", 30.0)
    assert (resumed.id, lease.token, resumed.attempts) == ("run_1", 2, 2)
    assert [a.state for a in await store.list_approvals(run_id="run_1")] == [
        ApprovalState.APPROVED,
        ApprovalState.REJECTED,
    ]


async def test_a_failed_save_stores_neither_the_run_nor_its_approvals(store: Store) -> None:
    await park_for_approval(store, "run_0", an_approval("apr_1", "run_0"))
    await store.submit_run(a_task("run_1"))
    record, lease = await claim_one(store)
    record.state = RunState.WAITING_APPROVAL
    with pytest.raises(ConflictError):  # apr_1 exists: the whole save is refused
        await store.save_run(
            record,
            lease=lease,
            approvals=[an_approval("apr_2", "run_1"), an_approval("apr_1", "run_1")],
        )
    stored = await store.get_run("run_1")
    assert stored is not None and stored.state is RunState.RUNNING
    assert await store.list_approvals(run_id="run_1") == []


async def test_expired_approvals_requeue_their_runs(store: Store) -> None:
    now = time.time()
    await park_for_approval(store, "run_1", an_approval("apr_1", "run_1", expires_at=now + 60))
    await park_for_approval(store, "run_2", an_approval("apr_2", "run_2"))  # never expires
    assert await store.expire_approvals(now=now + 59) == []

    [expired] = await store.expire_approvals(now=now + 61)
    assert (expired.id, expired.state, expired.decided_at) == (
        "apr_1",
        ApprovalState.EXPIRED,
        now + 61,
    )
    run_1, run_2 = await store.get_run("run_1"), await store.get_run("run_2")
    assert run_1 is not None and run_1.state is RunState.QUEUED
    assert run_2 is not None and run_2.state is RunState.WAITING_APPROVAL
    with pytest.raises(ConflictError, match="already expired"):
        await store.decide_approval("apr_1", True)
    assert await store.expire_approvals(now=now + 1000) == []


async def test_deciding_an_approval_past_its_deadline_expires_it(store: Store) -> None:
    await park_for_approval(
        store, "run_1", an_approval("apr_1", "run_1", expires_at=time.time() - 1)
    )
    with pytest.raises(ConflictError, match="expired"):
        await store.decide_approval("apr_1", True, by="late")
    approval = await store.get_approval("apr_1")
    assert approval is not None
    assert (approval.state, approval.decided_by) == (ApprovalState.EXPIRED, None)
    run = await store.get_run("run_1")
    assert run is not None and run.state is RunState.QUEUED


async def test_cancelling_a_waiting_run_expires_its_approvals(store: Store) -> None:
    await park_for_approval(store, "run_1", an_approval("apr_1", "run_1"))
    cancelled = await store.request_cancel("run_1")
    assert (cancelled.state, cancelled.cancel_requested) == (RunState.CANCELLED, True)
    [approval] = await store.list_approvals(run_id="run_1")
    assert approval.state is ApprovalState.EXPIRED
    with pytest.raises(ConflictError):
        await store.decide_approval("apr_1", True)
    after = await store.get_run("run_1")
    assert after is not None and after.state is RunState.CANCELLED


async def test_list_runs_filters_by_state(store: Store) -> None:
    await park_for_approval(store, "run_1", an_approval("apr_1", "run_1"))
    await store.submit_run(a_task("run_2", created_at=2000.0))
    waiting = await store.list_runs("default", states=[RunState.WAITING_APPROVAL])
    assert [r.id for r in waiting] == ["run_1"]
    both = await store.list_runs("default", states=[RunState.WAITING_APPROVAL, RunState.QUEUED])
    assert [r.id for r in both] == ["run_2", "run_1"]


# --------------------------------------------------------------------------- migration


@pytest.mark.empty_database
async def test_a_0001_database_with_a_run_upgrades_cleanly(
    store_url: str, cipher: SecretCipher
) -> None:
    from alembic import command
    from alembic.config import Config

    if store_url.startswith("sqlite"):
        sqlite_path(store_url).parent.mkdir(parents=True)

    def at_0001_with_a_run(conn: sa.Connection) -> None:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        config.attributes["connection"] = conn
        command.upgrade(config, "0001")
        conn.execute(
            sa.text(
                "INSERT INTO runs (id, namespace, agent, state, input, output, error, usage,"
                " cost_usd, steps, messages, pending, created_at, started_at, finished_at)"
                " VALUES ('run_old', 'default', 'assistant', 'queued', 'hi', 'null', NULL,"
                ' \'{"input_tokens": 1, "output_tokens": 2, "requests": 1}\', 0.5, 0, \'[]\','
                " '[]', 1000.0, NULL, NULL)"
            )
        )

    await on_database(store_url, at_0001_with_a_run)

    store = await open_store(store_url, cipher=cipher)
    try:
        old = await store.get_run("run_old")
        assert old is not None
        assert (old.priority, old.not_before, old.attempts, old.max_attempts) == (0, 0.0, 0, 3)
        assert (old.idempotency_key, old.cancel_requested, old.fencing_token) == (None, False, 0)
        assert old.usage.output_tokens == 2
        [(claimed, lease)] = await store.claim_runs("w", 30.0)
        assert (claimed.id, lease.token) == ("run_old", 1)
        assert (await store.submit_run(a_task("run_new", key="k")))[1]
    finally:
        await store.close()
    revision = await rows_of(store_url, "SELECT version_num FROM alembic_version")
    assert revision == [(LATEST_REVISION,)]


async def test_save_run_writes_the_last_events_with_the_outcome_or_nothing(store: Store) -> None:
    """The executor stores ``run.finish`` and the final state in one commit."""
    await store.submit_run(a_task("run_1"))
    record, lease = await claim_one(store)
    await store.append_events([Event("run_1", 1, RunStartData(agent="a", input="x"))], lease=lease)
    # A stale holder (its lease was taken over) writes neither the events nor the state.
    [(_, newer)] = await store.claim_runs("w2", 30.0, now=time.time() + 60)
    record.state = RunState.FAILED
    with pytest.raises(LeaseLostError):
        await store.save_run(
            record, lease, events=[Event("run_1", 2, RunFinishData(state="succeeded"))]
        )
    assert [e.seq for e in await store.list_events("run_1")] == [1]
    stored = await store.get_run("run_1")
    assert stored is not None and stored.state is RunState.RUNNING

    record.state = RunState.SUCCEEDED
    finish = Event("run_1", 2, RunFinishData(state="succeeded"))
    await store.save_run(record, newer, events=[finish])
    events = await store.list_events("run_1")
    assert [(e.seq, e.type, e.data) for e in events][-1] == (2, EventType.RUN_FINISH, finish.data)
    stored = await store.get_run("run_1")
    assert stored is not None and stored.state is RunState.SUCCEEDED
    with pytest.raises(ConflictError):
        await store.save_run(record, events=[Event("run_2", 1, RunStartData(agent="a", input="x"))])


LIMITED = (
    SCRIPT_ENDPOINT
    + """---
apiVersion: corral/v1
kind: Agent
metadata: {name: limited}
spec: {model: script, max_concurrent_runs: %d}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: free}
spec: {model: script}
"""
)


def agent_task(run_id: str, agent: str, priority: int = 0) -> RunRecord:
    record = a_task(run_id, priority=priority)
    record.agent = agent
    return record


async def test_claims_keep_an_agent_within_its_max_concurrent_runs(store: Store) -> None:
    await store.apply(load_text(LIMITED % 2, "limits.yaml"))
    for i in range(5):  # ahead of the others in claim order
        await store.submit_run(agent_task(f"lim_{i}", "limited", priority=9))
    for i in range(3):
        await store.submit_run(agent_task(f"free_{i}", "free"))

    first = await store.claim_runs("w1", 30.0, 10)
    agents = sorted(record.agent for record, _ in first)
    assert agents == ["free"] * 3 + ["limited"] * 2  # its backlog hides no one else's runs
    assert await store.claim_runs("w1", 30.0, 10) == []

    done, lease = next(claim for claim in first if claim[0].agent == "limited")
    done.state = RunState.SUCCEEDED
    await store.save_run(done, lease)
    [(record, _)] = await store.claim_runs("w1", 30.0, 10)
    assert record.agent == "limited"

    # Expired leases are taken over without taking new slots.
    later = time.time() + 60
    retaken = await store.claim_runs("w2", 30.0, 10, now=later)
    assert sorted(r.agent for r, _ in retaken) == ["free"] * 3 + ["limited"] * 2

    await store.apply(load_text(LIMITED % 4, "limits.yaml"))  # raised: applies to the queue
    raised = await store.claim_runs("w2", 30.0, 10, now=later)
    assert [r.agent for r, _ in raised] == ["limited", "limited"]


async def test_concurrent_claimers_never_exceed_an_agents_limit(
    store: Store, other_store: Store
) -> None:
    await store.apply(load_text(LIMITED % 3, "limits.yaml"))
    for i in range(12):
        await store.submit_run(agent_task(f"lim_{i:02}", "limited"))
    claims = await asyncio.gather(
        *(
            claimer.claim_runs(f"w{n}", 30.0, 2)
            for n, claimer in enumerate([store, other_store] * 4)
        )
    )
    assert sum(len(c) for c in claims) == 3
    running = await store.list_runs("default", states=[RunState.RUNNING])
    assert len(running) == 3


async def test_list_events_pages_with_a_limit(store: Store) -> None:
    await store.submit_run(a_task("run_1"))
    _, lease = await claim_one(store)
    await store.append_events(
        [Event("run_1", seq, StepStartData(step=1)) for seq in range(1, 8)], lease=lease
    )
    assert [e.seq for e in await store.list_events("run_1", 2, limit=3)] == [3, 4, 5]
    assert [e.seq for e in await store.list_events("run_1", 5, limit=10)] == [6, 7]
    assert [e.seq for e in await store.list_events("run_1", limit=None)] == list(range(1, 8))
