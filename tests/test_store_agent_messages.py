"""Agent messages in the store, on every backend (the SQLite fast path, SQLite through
SQLAlchemy, PostgreSQL): insert-or-ignore by id, forward-only marks, keyset pages, a
run's system and branch fields kept, and messages going with their pruned system run."""

from __future__ import annotations

import time

import pytest

from corral.core.agent_messages import AgentMessage, MessageState
from corral.core.errors import NotFoundError
from corral.core.runs import RunRecord, RunState
from corral.store import Store
from test_store import (  # noqa: F401 - fixtures
    cipher_fixture,
    store_fixture,
    store_url_fixture,
)


def a_message(message_id: str, run_id: str = "run_s", **fields: object) -> AgentMessage:
    values: dict[str, object] = {
        "id": message_id,
        "namespace": "default",
        "system_run_id": run_id,
        "from_agent": "planner",
        "to_agent": "writer",
        "branch_id": "1.2",
        "parent_branch_id": "1",
        "type": "output",
        "payload": {"text": "an output", "n": [1, 2]},
        "idempotency_key": message_id,
        "hop": 2,
        **fields,
    }
    return AgentMessage(**values)  # type: ignore[arg-type]


async def system_run(store: Store, run_id: str = "run_s") -> RunRecord:
    record = RunRecord(id=run_id, namespace="default", agent="team", input="go", system="team")
    stored, created = await store.submit_run(record)
    assert created
    return stored


async def test_a_message_is_stored_once_whatever_the_repeats(store: Store) -> None:
    await system_run(store)
    first = a_message("msg_a", created_at=10.0)
    assert await store.add_agent_messages([first, a_message("msg_b", created_at=11.0)]) == [
        True,
        True,
    ]
    again = a_message("msg_a", payload="something else", created_at=12.0)
    assert await store.add_agent_messages([again]) == [False]
    stored = await store.get_agent_message("msg_a")
    assert stored == first  # every field as given, the first write kept
    assert await store.get_agent_message("msg_nope") is None


async def test_a_message_of_a_run_that_does_not_exist_is_refused(store: Store) -> None:
    with pytest.raises(NotFoundError):
        await store.add_agent_messages([a_message("msg_a", run_id="run_ghost")])
    assert await store.list_agent_messages("run_ghost") == []


async def test_marks_only_move_a_message_forward(store: Store) -> None:
    await system_run(store)
    await store.add_agent_messages([a_message("msg_a")])
    delivered = await store.mark_agent_message(
        "msg_a", MessageState.DELIVERED, child_run_id="run_c", attempt=1, now=5.0
    )
    assert delivered is not None
    assert (delivered.state, delivered.child_run_id, delivered.attempt) == (
        MessageState.DELIVERED,
        "run_c",
        1,
    )
    assert delivered.delivered_at == 5.0
    # a second delivery (a duplicate on the bus) changes nothing
    assert await store.mark_agent_message("msg_a", MessageState.DELIVERED) is None
    done = await store.mark_agent_message("msg_a", MessageState.DONE, now=6.0)
    assert done is not None and (done.state, done.finished_at) == (MessageState.DONE, 6.0)
    # a finished message stays as it ended
    for late in (MessageState.FAILED, MessageState.DEAD_LETTER, MessageState.DELIVERED):
        assert await store.mark_agent_message("msg_a", late) is None
    stored = await store.get_agent_message("msg_a")
    assert stored is not None and stored.state is MessageState.DONE


async def test_an_undelivered_message_can_end_in_the_dead_letters(store: Store) -> None:
    await system_run(store)
    await store.add_agent_messages([a_message("msg_a")])
    error = {"code": "dead_letter", "message": "no delivery worked"}
    dead = await store.mark_agent_message("msg_a", MessageState.DEAD_LETTER, error=error, attempt=5)
    assert dead is not None and (dead.state, dead.error, dead.attempt) == (
        MessageState.DEAD_LETTER,
        error,
        5,
    )


async def test_a_system_runs_messages_come_in_keyset_pages(store: Store) -> None:
    await system_run(store)
    await system_run(store, "run_other")
    ids = [f"msg_{i:02d}" for i in range(7)]
    await store.add_agent_messages(
        [a_message(i, created_at=100.0 + n // 2) for n, i in enumerate(ids)]
    )
    await store.add_agent_messages([a_message("msg_x", run_id="run_other")])
    seen: list[str] = []
    after: tuple[float, str] | None = None
    while True:
        page = await store.list_agent_messages("run_s", limit=3, after=after)
        if not page:
            break
        seen += [m.id for m in page]
        after = (page[-1].created_at, page[-1].id)
    assert seen == ids


async def test_a_runs_system_and_branch_are_kept(store: Store) -> None:
    parent = await system_run(store)
    child = RunRecord(
        id="run_c",
        namespace="default",
        agent="writer",
        input="x",
        parent_run_id=parent.id,
        depth=1,
        system="team",
        branch_id="1.2",
        parent_branch_id="1",
    )
    await store.submit_run(child)
    stored = await store.get_run("run_c")
    assert stored is not None
    assert (stored.system, stored.branch_id, stored.parent_branch_id) == ("team", "1.2", "1")
    assert not stored.is_system_run and parent.is_system_run
    [(claimed, lease)] = await store.claim_runs("w", 30.0, run_ids=["run_c"])
    assert (claimed.system, claimed.branch_id) == ("team", "1.2")
    claimed.state = RunState.SUCCEEDED
    claimed.finished_at = time.time()
    await store.save_run(claimed, lease)
    stored = await store.get_run("run_c")
    assert stored is not None and stored.branch_id == "1.2"


async def test_messages_go_with_their_pruned_system_run(store: Store) -> None:
    await system_run(store)
    await store.add_agent_messages([a_message("msg_a")])
    [(record, lease)] = await store.claim_runs("w", 30.0, run_ids=["run_s"])
    record.state = RunState.SUCCEEDED
    record.finished_at = time.time() - 100
    await store.save_run(record, lease)
    assert await store.prune_runs(finished_before=time.time()) == 1
    assert await store.get_agent_message("msg_a") is None


async def test_a_parked_system_run_is_queued_when_one_node_run_ends(store: Store) -> None:
    """Not when the last one does, as a parent of agents_exec children is: each branch
    moves on as its node ends."""
    await system_run(store)
    for name in ("run_a", "run_b"):
        await store.submit_run(
            RunRecord(
                id=name,
                namespace="default",
                agent="node",
                input="x",
                parent_run_id="run_s",
                depth=1,
                system="team",
                branch_id="1",
            )
        )
        await store.add_agent_messages([a_message(f"msg_{name}")])
        await store.mark_agent_message(f"msg_{name}", MessageState.DELIVERED, child_run_id=name)
    [(record, lease)] = await store.claim_runs("w", 30.0, run_ids=["run_s"])
    record.state = RunState.WAITING_CHILDREN
    await store.save_run(record, lease)
    assert (await _state(store, "run_s")) is RunState.WAITING_CHILDREN

    [(node, node_lease)] = await store.claim_runs("w", 30.0, run_ids=["run_a"])
    node.state = RunState.SUCCEEDED
    node.finished_at = time.time()
    await store.save_run(node, node_lease)
    assert (await _state(store, "run_s")) is RunState.QUEUED  # run_b still runs

    # taken (its message done), the system run parks again and stays parked
    await store.mark_agent_message("msg_run_a", MessageState.DONE)
    [(record, lease)] = await store.claim_runs("w", 30.0, run_ids=["run_s"])
    record.state = RunState.WAITING_CHILDREN
    await store.save_run(record, lease)
    assert (await _state(store, "run_s")) is RunState.WAITING_CHILDREN


async def _state(store: Store, run_id: str) -> RunState:
    record = await store.get_run(run_id)
    assert record is not None
    return record.state
