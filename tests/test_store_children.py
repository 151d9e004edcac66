"""Child runs in the store, on every backend (the SQLite fast path, SQLite through
SQLAlchemy, PostgreSQL): a child's final save queues its waiting parent, a save into
``waiting_children`` queues itself when its children are done, cancellation cascades
(and no child is stored under a parent that ended or is being cancelled), and pruning
keeps a finished child while its parent is unfinished."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable

import anyio
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from corral.core.errors import BudgetExceededError, ConflictError, NotFoundError
from corral.core.messages import Message, Usage
from corral.core.runs import Lease, RunRecord, RunState
from corral.core.sessions import SessionNotAllowedError
from corral.resources.loader import load_text
from corral.store import Store
from corral.store.base import Allowance, Submitted, WokenRun
from corral.store.sql.agent_limits import ADVISORY_LOCK_KEY
from systems_helpers import agent, apply, model
from test_store import (  # noqa: F401 - fixtures
    cipher_fixture,
    store_fixture,
    store_url_fixture,
)
from test_store_durable import AGENTS


def a_run(run_id: str, parent: str | None = None, depth: int = 0) -> RunRecord:
    return RunRecord(
        id=run_id,
        namespace="default",
        agent="assistant",
        input=f"input of {run_id}",
        parent_run_id=parent,
        depth=depth,
    )


async def claim(store: Store, run_id: str) -> tuple[RunRecord, Lease]:
    [(record, lease)] = await store.claim_runs("w", 30.0, run_ids=[run_id])
    return record, lease


async def save(store: Store, run_id: str, state: RunState) -> None:
    record, lease = await claim(store, run_id)
    record.state = state
    if state.finished:
        record.finished_at = time.time()
    await store.save_run(record, lease)


async def state_of(store: Store, run_id: str) -> RunState:
    record = await store.get_run(run_id)
    assert record is not None
    return record.state


async def family(store: Store, children: int) -> list[str]:
    """A parent parked in waiting_children and its queued children."""
    await store.submit_run(a_run("run_p"))
    ids = [f"run_c{i}" for i in range(children)]
    for child in ids:
        await store.submit_run(a_run(child, "run_p", 1))
    await save(store, "run_p", RunState.WAITING_CHILDREN)
    assert await state_of(store, "run_p") is RunState.WAITING_CHILDREN
    return ids


async def test_a_save_names_the_run_it_queued_and_only_that(store: Store) -> None:
    first, second = await family(store, 2)
    saved: list[WokenRun | None] = []
    for child in (first, second):
        record, lease = await claim(store, child)
        record.state = RunState.SUCCEEDED
        saved.append(await store.save_run(record, lease))
    # the first queued nothing (nobody need be told), the last its parent, not claimed
    assert saved == [None, WokenRun("run_p")]
    assert await state_of(store, "run_p") is RunState.QUEUED


async def test_the_last_child_to_finish_queues_its_parent(store: Store) -> None:
    first, second = await family(store, 2)
    assert [c.id for c in await store.list_children("run_p")] == [first, second]
    await save(store, first, RunState.SUCCEEDED)
    assert await state_of(store, "run_p") is RunState.WAITING_CHILDREN
    await save(store, second, RunState.FAILED)
    assert await state_of(store, "run_p") is RunState.QUEUED
    assert [r.id for r, _ in await store.claim_runs("w", 30.0, 5)] == ["run_p"]


async def test_children_finishing_at_once_queue_their_parent(store: Store) -> None:
    children = await family(store, 6)
    claims = [await claim(store, child) for child in children]

    async def finish(record: RunRecord, lease: Lease) -> None:
        record.state = RunState.SUCCEEDED
        await store.save_run(record, lease)

    async with anyio.create_task_group() as group:
        for record, lease in claims:
            group.start_soon(finish, record, lease)
    assert await state_of(store, "run_p") is RunState.QUEUED


async def test_a_run_parked_after_its_children_finished_is_queued_at_once(store: Store) -> None:
    await store.submit_run(a_run("run_p"))
    record, lease = await claim(store, "run_p")
    await store.submit_run(a_run("run_c", "run_p", 1))
    await save(store, "run_c", RunState.SUCCEEDED)  # before its parent parked
    record.state = RunState.WAITING_CHILDREN
    await store.save_run(record, lease)
    assert await state_of(store, "run_p") is RunState.QUEUED


async def test_cancelling_a_parent_cancels_its_descendants(store: Store) -> None:
    await store.submit_run(a_run("run_p"))
    await store.submit_run(a_run("run_c", "run_p", 1))
    await store.submit_run(a_run("run_g", "run_c", 2))
    await store.submit_run(a_run("run_done", "run_p", 1))
    await save(store, "run_done", RunState.SUCCEEDED)
    await save(store, "run_p", RunState.WAITING_CHILDREN)
    await claim(store, "run_g")  # running: asked to stop
    cancelled = await store.request_cancel("run_p")
    assert cancelled.state is RunState.CANCELLED
    assert await state_of(store, "run_c") is RunState.CANCELLED
    assert await state_of(store, "run_done") is RunState.SUCCEEDED
    grandchild = await store.get_run("run_g")
    assert grandchild is not None
    assert (grandchild.state, grandchild.cancel_requested) == (RunState.RUNNING, True)


async def test_a_child_cancelled_at_once_queues_its_waiting_parent(store: Store) -> None:
    (child,) = await family(store, 1)
    record = await store.request_cancel(child)
    assert record.state is RunState.CANCELLED
    assert await state_of(store, "run_p") is RunState.QUEUED


async def test_pruning_keeps_a_finished_child_while_its_parent_waits(store: Store) -> None:
    first, second = await family(store, 2)
    await save(store, first, RunState.SUCCEEDED)
    assert await store.prune_runs(finished_before=time.time() + 60) == 0
    assert await store.get_run(first) is not None
    await save(store, second, RunState.SUCCEEDED)
    await save(store, "run_p", RunState.SUCCEEDED)
    assert await store.prune_runs(finished_before=time.time() + 60) == 3


async def test_a_last_childs_save_claims_its_parent_for_the_same_owner(store: Store) -> None:
    first, second = await family(store, 2)
    record, lease = await claim(store, first)
    record.state = RunState.SUCCEEDED
    # not the last child: nothing is woken, nothing claimed
    assert await store.save_run(record, lease, claim_woken=("w2", 30.0)) is None
    assert await state_of(store, "run_p") is RunState.WAITING_CHILDREN
    record, lease = await claim(store, second)
    record.state = RunState.FAILED
    woken = await store.save_run(record, lease, claim_woken=("w2", 30.0))
    assert woken is not None and woken.run_id == "run_p"
    parent, parent_lease = woken.record, woken.lease
    assert parent is not None and parent_lease is not None
    assert parent.id == parent_lease.run_id == "run_p"
    assert parent.state is RunState.RUNNING and parent.lease_owner == "w2"
    assert parent_lease.owner == "w2" and parent_lease.token == parent.fencing_token
    assert not parent_lease.exhausted
    # claimed: no other worker finds it, and the lease writes
    assert await store.claim_runs("w3", 30.0, 5) == []
    parent.state = RunState.SUCCEEDED
    await store.save_run(parent, parent_lease)
    assert await state_of(store, "run_p") is RunState.SUCCEEDED


async def test_a_park_after_the_children_finished_claims_the_run_again(store: Store) -> None:
    await store.submit_run(a_run("run_p"))
    await store.submit_run(a_run("run_c", "run_p", 1))
    parent, parent_lease = await claim(store, "run_p")
    await save(store, "run_c", RunState.SUCCEEDED)  # before its parent parked
    parent.state = RunState.WAITING_CHILDREN
    woken = await store.save_run(parent, parent_lease, claim_woken=("w", 30.0))
    assert woken is not None and woken.run_id == "run_p"
    again, again_lease = woken.record, woken.lease
    assert again is not None and again_lease is not None
    assert again.id == "run_p" and again.state is RunState.RUNNING
    assert again_lease.token == parent_lease.token + 1  # a new claim: the old lease is fenced


async def test_a_save_that_wakes_nothing_claims_nothing(store: Store) -> None:
    await store.submit_run(a_run("run_solo"))
    record, lease = await claim(store, "run_solo")
    record.state = RunState.SUCCEEDED
    assert await store.save_run(record, lease, claim_woken=("w", 30.0)) is None
    # a parked parent with an unfinished child: woken by nobody yet
    [child] = await family(store, 1)
    assert await state_of(store, child) is RunState.QUEUED
    assert await store.claim_runs("w", 30.0, 5, run_ids=["run_p"]) == []


async def test_a_child_is_refused_under_a_parent_that_ended_or_is_being_cancelled(
    store: Store,
) -> None:
    await store.apply(load_text(AGENTS, "agents.yaml"))
    await store.submit_run(a_run("run_p"))
    parent, lease = await claim(store, "run_p")
    assert (await store.submit_agent_run(a_run("run_c1", "run_p", 1))).created

    await store.request_cancel("run_p")  # running: asked to stop, not yet stopped
    with pytest.raises(ConflictError, match="run_p is being cancelled"):
        await store.submit_agent_run(a_run("run_c2", "run_p", 1))
    parent.state, parent.finished_at = RunState.CANCELLED, time.time()
    await store.save_run(parent, lease)
    with pytest.raises(ConflictError, match="run_p has ended cancelled"):
        await store.submit_agent_run(a_run("run_c3", "run_p", 1))
    with pytest.raises(NotFoundError, match="'run_gone'"):
        await store.submit_agent_run(a_run("run_c4", "run_gone", 1))
    assert [c.id for c in await store.list_children("run_p")] == ["run_c1"]
    assert await store.get_run("run_c2") is None and await store.get_run("run_c4") is None


async def test_a_child_submitted_while_its_parent_is_cancelled_never_outlives_it(
    store: Store,
) -> None:
    """The cancel's cascade and the child's submit race: either the submit sees the cancel
    (refused) or the cascade sees the child (cancelled); never a live child under a
    cancelled parent."""
    await store.apply(load_text(AGENTS, "agents.yaml"))
    for n in range(20):
        parent = f"run_p{n}"
        await store.submit_run(a_run(parent))
        await save(store, parent, RunState.WAITING_CHILDREN)  # cancelled at once

        async def submit(parent: str = parent, n: int = n) -> None:
            with contextlib.suppress(ConflictError):
                await store.submit_agent_run(a_run(f"run_c{n}", parent, 1))

        async with anyio.create_task_group() as group:
            group.start_soon(submit)
            group.start_soon(store.request_cancel, parent)
        assert await state_of(store, parent) is RunState.CANCELLED
        children = await store.list_children(parent)
        assert all(c.state is RunState.CANCELLED for c in children), children


async def test_a_run_parked_past_its_deadline_is_queued_once(store: Store) -> None:
    now = time.time()
    for run_id, deadline in (("run_late", now - 1), ("run_early", now + 60), ("run_none", None)):
        await store.submit_run(a_run(run_id))
        await store.submit_run(a_run(f"{run_id}_child", run_id, 1))  # (it hangs)
        claimed, lease = await claim(store, run_id)
        claimed.state, claimed.deadline_at = RunState.WAITING_CHILDREN, deadline
        await store.save_run(claimed, lease)
    late = await store.get_run("run_late")
    assert late is not None and late.deadline_at == now - 1

    # two workers' upkeep at once: one of them queues it
    found: list[list[tuple[str, int]]] = []

    async def sweep() -> None:
        found.append(await store.queue_overdue_runs(now=now))

    async with anyio.create_task_group() as group:
        group.start_soon(sweep)
        group.start_soon(sweep)
    assert sorted(found) == [[], [("run_late", late.fencing_token)]]
    assert await state_of(store, "run_late") is RunState.QUEUED
    assert await state_of(store, "run_early") is RunState.WAITING_CHILDREN
    assert await state_of(store, "run_none") is RunState.WAITING_CHILDREN
    assert await store.queue_overdue_runs(now=now) == []
    assert await store.queue_overdue_runs(now=now + 120) == [("run_early", 1)]


async def test_a_save_claiming_a_parent_and_a_submit_claiming_in_its_session_do_not_deadlock(
    store: Store, store_url: str
) -> None:
    # A limited agent makes every claim take the admission lock (store/sql/agent_limits.py).
    # A submit with a claim locks its session, then takes that lock; a child's final save
    # in that session claiming its parent must take them in the same order, or each waits
    # for the other (PostgreSQL ends one: a deadlock).
    await apply(store, model("m", {"text": "x"}), agent("assistant", "m", max_concurrent_runs=9))
    [child] = await family(store, 1)
    record, lease = await claim(store, child)
    record.state = RunState.SUCCEEDED
    record.session_id = "ses_1"
    await store.get_or_create_session("default", "ses_1", "assistant")
    newcomer = a_run("run_new")
    newcomer.session_id = "ses_1"
    said = [Message.assistant("done")]

    async def save() -> WokenRun | None:
        return await store.save_run(record, lease, session_messages=said, claim_woken=("w", 30.0))

    async def submit() -> Submitted:
        return await store.submit_agent_run(newcomer, claim_for=("w", 30.0))

    if not store_url.startswith("postgresql"):  # (SQLite: one writer, nothing to interleave)
        await save()
        assert await state_of(store, "run_p") in (RunState.QUEUED, RunState.RUNNING)
        assert (await submit()).created
        return
    # Hold the admission lock, so that the save (which locks its runs first) and the
    # submit (which locks the session first) both wait (for it, or one for the other),
    # then let it go.
    engine = create_async_engine(store_url.replace("postgresql://", "postgresql+asyncpg://"))
    results: dict[str, object] = {}

    async def keep(name: str, operation: Callable[[], Awaitable[object]]) -> None:
        results[name] = await operation()

    deadlocks = sa.text("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
    try:
        async with engine.connect() as holder:
            before = (await holder.execute(deadlocks)).scalar_one()
            await holder.execute(sa.select(sa.func.pg_advisory_lock(ADVISORY_LOCK_KEY)))
            with anyio.fail_after(20):
                async with anyio.create_task_group() as group:
                    group.start_soon(keep, "save", save)
                    await waiting_for_locks(holder, 1)
                    group.start_soon(keep, "submit", submit)
                    await waiting_for_locks(holder, 2)
                    await holder.execute(sa.select(sa.func.pg_advisory_unlock(ADVISORY_LOCK_KEY)))
                    await holder.commit()
            await anyio.sleep(1.1)  # (a backend reports its statistics at most once a second)
            await holder.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
            after = (await holder.execute(deadlocks)).scalar_one()
    finally:
        await engine.dispose()
    # (a deadlock is retried, so both go through: but only after PostgreSQL's
    # deadlock_timeout, a second)
    assert after == before, "the save and the submit deadlocked"
    woken = results["save"]
    assert isinstance(woken, WokenRun) and woken.record is not None and woken.record.id == "run_p"
    submitted = results["submit"]
    assert isinstance(submitted, Submitted) and submitted.lease is not None


async def waiting_for_locks(conn: AsyncConnection, count: int) -> None:
    """Until ``count`` transactions wait for a lock (PostgreSQL)."""
    waiting = sa.text("SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted")
    while (await conn.execute(waiting)).scalar_one() < count:
        await conn.rollback()
        await anyio.sleep(0.01)


def keyed(run_id: str, key: str) -> RunRecord:
    record = a_run(run_id, "run_p", 1)
    record.idempotency_key = key
    return record


async def test_children_sharing_an_allowance_get_what_the_others_leave(store: Store) -> None:
    # An agent token's children share what it carries: one not finished holds its caps,
    # a finished one what it spent; children of other groups (another call's token, or a
    # key that differs where a LIKE pattern would have matched: "_") hold nothing of it
    await store.apply(load_text(AGENTS, "agents.yaml"))
    await store.submit_run(a_run("run_p"))
    await claim(store, "run_p")
    group = "link:run_p:1_0:"
    allowance = Allowance(group, cost_usd=1.0, tokens=100, refuses_when_spent=True)

    async def submit(run_id: str, key: str, shared: Allowance | None = allowance) -> RunRecord:
        submitted = await store.submit_agent_run(keyed(run_id, key), allowance=shared)
        assert submitted.created
        stored = await store.get_run(run_id)
        assert stored is not None
        return stored

    other = Allowance("link:run_p:1x0:", cost_usd=5.0, tokens=500, refuses_when_spent=True)
    assert (await submit("run_o", "link:run_p:1x0:aa", other)).max_tokens == 500
    first = await submit("run_c1", f"{group}aa")
    assert (first.max_cost_usd, first.max_tokens) == (1.0, 100)
    with pytest.raises(BudgetExceededError):  # the first holds all of it
        await submit("run_c2", f"{group}bb")

    # the first ends having spent $0.25 and 30 tokens
    record, lease = await claim(store, "run_c1")
    record.state, record.finished_at = RunState.SUCCEEDED, time.time()
    record.cost_usd, record.usage = 0.25, Usage(input_tokens=30)
    await store.save_run(record, lease)
    third = await submit("run_c3", f"{group}cc")
    assert (third.max_cost_usd, third.max_tokens) == (0.75, 70)
    # an allowance with no token limit caps tokens at nothing
    fourth = await submit(
        "run_c4", f"{group}dd", Allowance(group, cost_usd=2.0, refuses_when_spent=True)
    )
    assert (fourth.max_cost_usd, fourth.max_tokens) == (2.0 - 0.25 - 0.75, None)


async def test_children_submitted_at_once_never_share_more_than_their_allowance(
    store: Store,
) -> None:
    await store.apply(load_text(AGENTS, "agents.yaml"))
    await store.submit_run(a_run("run_p"))
    await claim(store, "run_p")
    group = "link:run_p:2:0:"
    allowance = Allowance(group, cost_usd=1.0, tokens=100, refuses_when_spent=True)

    refused: list[str] = []

    async def submit(n: int) -> None:
        try:
            await store.submit_agent_run(keyed(f"run_c{n}", f"{group}{n}"), allowance=allowance)
        except BudgetExceededError as exc:
            refused.append(exc.limit)

    async with anyio.create_task_group() as group_of_submits:
        for n in range(8):
            group_of_submits.start_soon(submit, n)
    [child] = await store.list_children("run_p")  # the first holds it all: none other starts
    assert (child.max_cost_usd, child.max_tokens) == (1.0, 100)
    assert refused == ["max_cost_usd"] * 7


async def test_children_about_to_start_split_what_is_left_evenly(store: Store) -> None:
    # A system's messages waiting for their node runs: the first of three gets a third of
    # what is left, not all of it; a waiting one whose child started meanwhile is no longer
    # counted (that child holds its cap instead)
    await store.apply(load_text(AGENTS, "agents.yaml"))
    await store.submit_run(a_run("run_p"))
    await claim(store, "run_p")
    waiting = frozenset({"msg_a", "msg_b", "msg_c"})
    allowance = Allowance("msg_", cost_usd=3.0, waiting=waiting)
    first = await store.submit_agent_run(keyed("run_a", "msg_a"), allowance=allowance)
    assert first.record.max_cost_usd == 1.0
    second = await store.submit_agent_run(keyed("run_b", "msg_b"), allowance=allowance)
    assert second.record.max_cost_usd == 1.0  # (3 - 1 held) split with msg_c
    third = await store.submit_agent_run(keyed("run_c", "msg_c"), allowance=allowance)
    assert third.record.max_cost_usd == 1.0


async def test_a_child_its_allowance_has_nothing_left_for_is_refused_but_a_retry_is_not(
    store: Store,
) -> None:
    # A child capped at nothing still takes a model turn before its limit is checked: a
    # token whose allowance is spent could start any number of them, each paid for. It is
    # refused (budget_exceeded) instead, whatever limit is spent; a retry of a child the
    # allowance holds (its key) still finds that child.
    await store.apply(load_text(AGENTS, "agents.yaml"))
    await store.submit_run(a_run("run_p"))
    await claim(store, "run_p")
    for n in range(2):
        group = f"link:run_p:3:{n}:"
        cost, tokens = (1.0, None) if n == 0 else (None, 100)
        shared = Allowance(group, cost, tokens, refuses_when_spent=True)
        await store.submit_agent_run(keyed(f"run_a{n}", f"{group}aa"), allowance=shared)
        with pytest.raises(BudgetExceededError) as refused:
            await store.submit_agent_run(keyed(f"run_b{n}", f"{group}bb"), allowance=shared)
        assert refused.value.limit == ("max_cost_usd" if n == 0 else "max_tokens")
        assert await store.get_run(f"run_b{n}") is None
        again = await store.submit_agent_run(keyed(f"run_c{n}", f"{group}aa"), allowance=shared)
        assert (again.record.id, again.created) == (f"run_a{n}", False)
        assert await store.get_run(f"run_c{n}") is None
    # an allowance that does not refuse (a system's node runs) caps such a child at nothing
    group = "link:run_p:3:0:"
    capped = await store.submit_agent_run(
        keyed("run_d", f"{group}dd"), allowance=Allowance(group, 1.0)
    )
    assert (capped.created, capped.record.max_cost_usd) == (True, 0.0)


async def test_a_child_capped_at_more_tokens_than_a_32_bit_integer_holds_is_stored(
    store: Store,
) -> None:
    # limits.max_tokens has no upper bound: an agent allowed 5e9 tokens starts children
    # capped at up to that (agents_exec, or an agent token's allowance); PostgreSQL's
    # INTEGER column refused them (value out of int32 range) before migration 0019
    await store.apply(load_text(AGENTS, "agents.yaml"))
    await store.submit_run(a_run("run_p"))
    await claim(store, "run_p")
    many = 5_000_000_000
    plain = keyed("run_c1", "key-1")
    plain.max_tokens = many
    await store.submit_agent_run(plain)
    group = "link:run_p:1:0:"
    shared = Allowance(group, tokens=2 * many)
    await store.submit_agent_run(keyed("run_c2", f"{group}a"), allowance=shared)
    caps = [(await store.get_run(run_id)) for run_id in ("run_c1", "run_c2")]
    assert [c.max_tokens for c in caps if c is not None] == [many, 2 * many]


@pytest.mark.parametrize("cancel_after", [0.0, 0.01, 0.02])
async def test_allowance_submits_racing_a_cancel_and_lease_renewals_all_settle(
    store: Store, cancel_after: float
) -> None:
    # Siblings of three groups submitted at once (on PostgreSQL: the parent share-locked,
    # then each group's advisory lock), the parent's lease renewed meanwhile (its row
    # updated) and the parent cancelled (its cascade locks it, then its children): every
    # submit ends - stored, refused for its allowance, or refused for the cancel - none
    # waits forever or fails otherwise, and no child outlives the cancel unfinished
    await store.apply(load_text(AGENTS, "agents.yaml"))
    await store.submit_run(a_run("run_p"))
    _, lease = await claim(store, "run_p")
    outcomes: list[str] = []

    async def submit(n: int) -> None:
        group = f"link:run_p:{n % 3}:0:"
        try:
            await store.submit_agent_run(
                keyed(f"run_c{n}", f"{group}{n}"),
                allowance=Allowance(group, 1.0, 100, refuses_when_spent=True),
            )
            outcomes.append("stored")
        except (BudgetExceededError, ConflictError) as exc:
            outcomes.append(type(exc).__name__)

    async def renew() -> None:
        current = lease
        for _ in range(10):
            current, cancelling = await store.renew_lease(current, 30.0)
            if cancelling:
                return
            await anyio.sleep(0)

    async def cancel() -> None:
        await anyio.sleep(cancel_after)
        await store.request_cancel("run_p")

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            for n in range(12):
                group.start_soon(submit, n)
            group.start_soon(renew)
            group.start_soon(cancel)
    children = await store.list_children("run_p")
    assert len(outcomes) == 12 and outcomes.count("stored") == len(children) <= 3
    assert all(c.state is RunState.CANCELLED for c in children)


def in_session(record: RunRecord, session: str) -> RunRecord:
    record.session_id = session
    return record


async def test_a_child_continues_only_a_session_its_run_tree_opened_or_was_named(
    store: Store,
) -> None:
    """A child run's session is named by a model or a tool program: another user's session
    (another run tree's) would show it their messages. It may open a new session, continue
    one a run of its own tree opened (at any depth), or its parent's or an ancestor's."""
    await store.apply(load_text(AGENTS, "agents.yaml"))
    await store.submit_agent_run(in_session(a_run("run_u"), "theirs"))  # another user's
    await store.submit_agent_run(in_session(a_run("run_p"), "mine"))
    await store.submit_agent_run(a_run("run_c", "run_p", 1))
    await store.submit_run(a_run("run_q"))  # another tree

    with pytest.raises(SessionNotAllowedError) as refused:
        await store.submit_agent_run(in_session(a_run("run_x", "run_p", 1), "theirs"))
    assert refused.value.code == "session_not_allowed" and "'theirs'" in refused.value.message
    assert await store.get_run("run_x") is None
    assert [m.run_id for m in await store.session_messages("default", "theirs")] == []

    # a new session: the tree opens it; its runs may continue it at any depth
    assert (await store.submit_agent_run(in_session(a_run("run_a", "run_p", 1), "new"))).created
    grandchild = in_session(a_run("run_g", "run_c", 2), "new")
    assert (await store.submit_agent_run(grandchild)).created
    # the session the tree's root was started in (named for it by its user)
    assert (await store.submit_agent_run(in_session(a_run("run_m", "run_c", 2), "mine"))).created
    # a retry of a child (its idempotency key) finds it, the session its own
    retried = in_session(a_run("run_k", "run_p", 1), "keyed")
    retried.idempotency_key = "call-1"
    assert (await store.submit_agent_run(retried)).created
    again = in_session(a_run("run_k2", "run_p", 1), "keyed")
    again.idempotency_key = "call-1"
    found = await store.submit_agent_run(again)
    assert not found.created and found.record.id == "run_k"
    # another tree may not continue what this one opened, nor the user's own session
    for session in ("new", "mine", "theirs"):
        with pytest.raises(SessionNotAllowedError):
            await store.submit_agent_run(in_session(a_run(f"run_q_{session}", "run_q", 1), session))
    # top-level runs (a user's, with an API token) are not children: any session
    assert (await store.submit_agent_run(in_session(a_run("run_v"), "new"))).created
