"""Sessions in the store: namespaced, appended in order, compacted, deleted only when no
unfinished run needs them; and the migration that namespaced them (0004).

Run against every store URL of ``store_url`` (SQLite, both paths, and PostgreSQL).
"""

from __future__ import annotations

import asyncio
import time

import pytest
import sqlalchemy as sa

from corral.core.errors import ConflictError, NotFoundError
from corral.core.messages import Message
from corral.core.runs import RunRecord, RunState
from corral.resources.loader import load_text
from corral.resources.secrets import SecretCipher
from corral.store import Store, open_store
from corral.store.schema import LATEST_REVISION
from corral.store.sql import MIGRATIONS_DIR
from databases import on_database, rows_of
from store_helpers import append_session_messages
from test_store import (  # noqa: F401 - fixtures
    cipher_fixture,
    sqlite_path,
    store_fixture,
    store_url_fixture,
)
from test_store_durable import (  # noqa: F401 - fixtures
    SCRIPT_ENDPOINT,
    a_task,
    claim_one,
    other_store_fixture,
)

AGENTS_IN_TWO_NAMESPACES = (
    SCRIPT_ENDPOINT
    + """---
apiVersion: corral/v1
kind: Agent
metadata: {name: assistant}
spec: {model: script}
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: script, namespace: team}
spec: {provider: scripted}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: helper, namespace: team}
spec: {model: script}
"""
)


def in_session(run_id: str, session_id: str, namespace: str = "default") -> RunRecord:
    record = a_task(run_id)
    record.namespace, record.session_id = namespace, session_id
    record.agent = "assistant" if namespace == "default" else "helper"
    return record


# --------------------------------------------------------------------------- sessions


async def test_sessions_are_created_once_under_a_race(store: Store, other_store: Store) -> None:
    opened = await asyncio.gather(
        *(
            (store if i % 2 else other_store).get_or_create_session("default", "ses_1", "assistant")
            for i in range(20)
        )
    )
    assert len({(s.id, s.created_at) for s in opened}) == 1
    assert await store.get_session("default", "ses_1") == opened[0]
    assert await store.get_session("default", "ses_ghost") is None
    with pytest.raises(ConflictError, match="assistant"):
        await store.get_or_create_session("default", "ses_1", "other")


async def test_session_messages_append_in_order_and_list_by_recency(store: Store) -> None:
    await store.get_or_create_session("default", "ses_a", "assistant")
    await store.get_or_create_session("default", "ses_b", "helper")
    await store.get_or_create_session("team", "ses_c", "assistant")
    first = await append_session_messages(
        store, "default", "ses_a", [Message.user("hi"), Message.assistant("hello")], run_id="run_1"
    )
    assert [(m.seq, m.run_id) for m in first] == [(1, "run_1"), (2, "run_1")]
    await append_session_messages(store, "default", "ses_b", [Message.user("x")])
    await append_session_messages(store, "default", "ses_a", [Message.user("again")])
    assert await append_session_messages(store, "default", "ses_a", []) == []
    stored = await store.session_messages("default", "ses_a")
    assert [(m.seq, m.message.content) for m in stored] == [(1, "hi"), (2, "hello"), (3, "again")]
    assert stored[:2] == first

    assert [s.id for s in await store.list_sessions("default")] == ["ses_a", "ses_b"]
    assert [s.id for s in await store.list_sessions("default", "helper")] == ["ses_b"]
    with pytest.raises(NotFoundError):
        await append_session_messages(store, "default", "ses_ghost", [Message.user("x")])


async def test_concurrent_appends_get_distinct_consecutive_seqs(
    store: Store, other_store: Store
) -> None:
    await store.get_or_create_session("default", "ses_1", "assistant")
    await asyncio.gather(
        *(
            append_session_messages(
                store if i % 2 else other_store,
                "default",
                "ses_1",
                [Message.user(f"{i}a"), Message.user(f"{i}b")],
            )
            for i in range(20)
        )
    )
    stored = await store.session_messages("default", "ses_1")
    assert [m.seq for m in stored] == list(range(1, 41))
    for a, b in zip(stored[::2], stored[1::2], strict=True):  # each batch stays together
        assert (a.message.content[:-1], a.message.content[-1], b.message.content[-1]) == (
            b.message.content[:-1],
            "a",
            "b",
        )


async def test_compaction_hides_originals_and_places_the_summary_first(store: Store) -> None:
    await store.get_or_create_session("default", "ses_1", "assistant")
    await append_session_messages(
        store, "default", "ses_1", [Message.user(f"m{i}") for i in range(1, 6)]
    )

    await store.compact_session("default", "ses_1", 3, Message.system("summary of m1-m3"))
    visible = await store.session_messages("default", "ses_1")
    assert [(m.seq, m.message.content, m.summary) for m in visible] == [
        (6, "summary of m1-m3", True),
        (4, "m4", False),
        (5, "m5", False),
    ]
    everything = await store.session_messages("default", "ses_1", include_hidden=True)
    assert [(m.message.content, m.hidden) for m in everything] == [
        ("m1", True),
        ("m2", True),
        ("m3", True),
        ("summary of m1-m3", False),
        ("m4", False),
        ("m5", False),
    ]

    # A later compaction up to m4 also hides the earlier summary, which sits before m4.
    await append_session_messages(store, "default", "ses_1", [Message.user("m7")])
    await store.compact_session("default", "ses_1", 4, Message.system("summary of m1-m4"))
    visible = await store.session_messages("default", "ses_1")
    assert [m.message.content for m in visible] == ["summary of m1-m4", "m5", "m7"]
    assert [m.seq for m in visible] == [8, 5, 7]

    # Compacting everything (even past the end) keeps the summary before what comes next.
    await store.compact_session("default", "ses_1", 1000, Message.system("all of it"))
    await append_session_messages(store, "default", "ses_1", [Message.user("next")])
    assert [m.message.content for m in await store.session_messages("default", "ses_1")] == [
        "all of it",
        "next",
    ]
    # Without a summary, compaction only hides; naming a summary's seq cuts right after it.
    await store.compact_session("default", "ses_1", 9, None)
    assert [m.message.content for m in await store.session_messages("default", "ses_1")] == ["next"]
    assert len(await store.session_messages("default", "ses_1", include_hidden=True)) == 10
    with pytest.raises(NotFoundError):
        await store.compact_session("default", "ses_ghost", 1, None)


async def test_deleting_a_session_deletes_its_messages(store: Store, store_url: str) -> None:
    await store.get_or_create_session("default", "ses_1", "assistant")
    await store.get_or_create_session("default", "ses_2", "assistant")
    await append_session_messages(store, "default", "ses_1", [Message.user("a"), Message.user("b")])
    await append_session_messages(store, "default", "ses_2", [Message.user("c")])
    await store.delete_session("default", "ses_1")
    assert await store.get_session("default", "ses_1") is None
    assert await store.session_messages("default", "ses_1", include_hidden=True) == []
    with pytest.raises(NotFoundError):
        await store.delete_session("default", "ses_1")
    rows = await rows_of(store_url, "SELECT session_id, COUNT(*) FROM session_messages GROUP BY 1")
    assert rows == [("ses_2", 1)]


async def test_the_same_session_id_in_two_namespaces_is_two_sessions(store: Store) -> None:
    mine = await store.get_or_create_session("default", "ses_1", "assistant")
    theirs = await store.get_or_create_session("team", "ses_1", "helper")  # no ConflictError
    assert (mine.namespace, mine.agent, theirs.namespace, theirs.agent) == (
        "default",
        "assistant",
        "team",
        "helper",
    )
    await append_session_messages(store, "default", "ses_1", [Message.user("mine")])
    await append_session_messages(store, "team", "ses_1", [Message.user("theirs")])
    assert [m.message.content for m in await store.session_messages("default", "ses_1")] == ["mine"]
    assert [m.message.content for m in await store.session_messages("team", "ses_1")] == ["theirs"]
    assert await store.get_session("elsewhere", "ses_1") is None
    assert await store.session_messages("elsewhere", "ses_1") == []
    with pytest.raises(NotFoundError):
        await append_session_messages(store, "elsewhere", "ses_1", [Message.user("x")])
    with pytest.raises(NotFoundError):
        await store.delete_session("elsewhere", "ses_1")

    await store.delete_session("team", "ses_1")
    assert await store.get_session("team", "ses_1") is None
    assert await store.get_session("default", "ses_1") == await store.get_or_create_session(
        "default", "ses_1", "assistant"
    )
    assert len(await store.session_messages("default", "ses_1")) == 1


async def test_a_submit_opens_its_session_in_its_own_namespace(store: Store) -> None:
    await store.apply(load_text(AGENTS_IN_TWO_NAMESPACES, "agents.yaml"))
    await store.submit_agent_run(in_session("run_1", "ses_1"))
    await store.submit_agent_run(in_session("run_2", "ses_1", "team"))
    assert [(s.namespace, s.agent) for s in await store.list_sessions("default")] == [
        ("default", "assistant")
    ]
    assert [(s.namespace, s.agent) for s in await store.list_sessions("team")] == [
        ("team", "helper")
    ]
    # A session of another agent (same namespace) is refused, and nothing is stored.
    other = in_session("run_3", "ses_1", "team")
    other.agent = "assistant"
    await store.apply(load_text(AGENTS_IN_TWO_NAMESPACES.replace("helper", "assistant"), "a"))
    with pytest.raises(ConflictError, match="belongs to agent 'helper'"):
        await store.submit_agent_run(other)
    assert await store.get_run("run_3") is None


@pytest.mark.parametrize("state", [RunState.QUEUED, RunState.RUNNING, RunState.WAITING_APPROVAL])
async def test_a_session_is_not_deleted_while_a_run_of_it_is_unfinished(
    store: Store, state: RunState
) -> None:
    await store.apply(load_text(AGENTS_IN_TWO_NAMESPACES, "agents.yaml"))
    await store.submit_agent_run(in_session("run_done", "ses_1"))
    await store.submit_agent_run(in_session("run_busy", "ses_1"))
    [(done, lease)] = await store.claim_runs("w1", 30.0, run_ids=["run_done"])
    done.state, done.finished_at = RunState.SUCCEEDED, time.time()
    await store.save_run(done, lease, session_messages=[Message.user("hi")])
    [(busy, lease)] = await store.claim_runs("w1", 30.0, run_ids=["run_busy"])
    if state is not RunState.RUNNING:
        busy.state = state
        await store.save_run(busy, lease)
    assert (await store.get_run("run_busy")).state is state  # type: ignore[union-attr]

    with pytest.raises(ConflictError, match=f"its run run_busy is {state.value}"):
        await store.delete_session("default", "ses_1")
    assert await store.get_session("default", "ses_1") is not None  # nothing deleted
    assert len(await store.session_messages("default", "ses_1")) == 1
    # The same id in another namespace is another session, with no run.
    await store.get_or_create_session("team", "ses_1", "helper")
    await store.delete_session("team", "ses_1")

    await store.request_cancel("run_busy")  # finishes it (or asks its worker to)
    if state is RunState.RUNNING:
        with pytest.raises(ConflictError):
            await store.delete_session("default", "ses_1")
        busy.state, busy.finished_at = RunState.CANCELLED, time.time()
        await store.save_run(busy, lease)
    await store.delete_session("default", "ses_1")
    assert await store.get_session("default", "ses_1") is None


async def test_a_delete_and_a_submit_racing_on_one_session_never_orphan_a_run(
    store: Store, other_store: Store
) -> None:
    """Each round either deletes the session before the run is stored (the submit opens
    it anew) or refuses the delete: a stored queued run always has its session."""
    await store.apply(load_text(AGENTS_IN_TWO_NAMESPACES, "agents.yaml"))
    for i in range(10):
        await store.get_or_create_session("default", f"ses_{i}", "assistant")
        results = await asyncio.gather(
            store.delete_session("default", f"ses_{i}"),
            other_store.submit_agent_run(in_session(f"run_{i}", f"ses_{i}")),
            return_exceptions=True,
        )
        assert not isinstance(results[1], BaseException), results[1]
        if isinstance(results[0], BaseException):
            assert isinstance(results[0], ConflictError), results[0]
        assert await store.get_session("default", f"ses_{i}") is not None, f"round {i}"


# --------------------------------------------------------------------------- migration


@pytest.mark.empty_database
async def test_sessions_stored_at_0003_are_kept_in_their_namespace_by_the_upgrade(
    store_url: str, cipher: SecretCipher
) -> None:
    from alembic import command
    from alembic.config import Config

    if store_url.startswith("sqlite"):
        sqlite_path(store_url).parent.mkdir(parents=True)

    def at_0003_with_sessions(conn: sa.Connection) -> None:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        config.attributes["connection"] = conn
        command.upgrade(config, "0003")
        conn.execute(
            sa.text(
                "INSERT INTO sessions (id, namespace, agent, created_at, updated_at) VALUES"
                " ('ses_a', 'default', 'assistant', 1000.0, 1002.0),"
                " ('ses_b', 'team', 'helper', 1001.0, 1001.0)"
            )
        )
        message = '{"role": "user", "content": "%s"}'
        conn.execute(
            sa.text(
                "INSERT INTO session_messages (session_id, seq, position, message, run_id,"
                " hidden, summary, created_at) VALUES"
                f" ('ses_a', 1, 1.0, '{message % 'first'}', 'run_1', :yes, :no, 1000.0),"
                f" ('ses_a', 2, 2.0, '{message % 'second'}', NULL, :no, :no, 1001.0),"
                f" ('ses_b', 1, 1.0, '{message % 'other'}', NULL, :no, :no, 1001.0)"
            ),
            {"yes": True, "no": False},
        )

    await on_database(store_url, at_0003_with_sessions)

    store = await open_store(store_url, cipher=cipher)
    try:
        kept = await store.get_session("default", "ses_a")
        assert kept is not None
        assert (kept.agent, kept.created_at, kept.updated_at) == ("assistant", 1000.0, 1002.0)
        assert await store.get_session("team", "ses_a") is None
        messages = await store.session_messages("default", "ses_a", include_hidden=True)
        assert [(m.seq, m.message.content, m.run_id, m.hidden) for m in messages] == [
            (1, "first", "run_1", True),
            (2, "second", None, False),
        ]
        [other] = await store.session_messages("team", "ses_b")
        assert other.message.content == "other"
        # Namespaced from now on: the id of another namespace's session is free here.
        await store.get_or_create_session("team", "ses_a", "helper")
        await append_session_messages(store, "default", "ses_a", [Message.user("third")])
        assert len(await store.session_messages("default", "ses_a")) == 2
    finally:
        await store.close()
    revision = await rows_of(store_url, "SELECT version_num FROM alembic_version")
    assert revision == [(LATEST_REVISION,)]
