"""Journals written by an earlier release still read, replay and resume.

``fixtures/journals/journals.db`` was written once by the release that
``journals.json`` names (see ``make_fixture.py``): finished runs with every kind of
event, and runs it left parked - waiting for approval, a parent waiting for a child
that waits for approval, an agent system whose entry node waits for approval. This
code reads every event of it typed, writes each back as the same JSON, rebuilds each
run from its journal, and carries the parked runs on to their ends.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.bus.local import LocalBus
from corral.core.events import parse_event_data, payload_class
from corral.core.runs import ApprovalState, RunState
from corral.core.settings import Settings
from corral.engine.replay import replay
from corral.runtime import operations
from corral.runtime.worker import Worker
from corral.store import Store, open_store
from corral.store.sql.rows import dumps

FIXTURE = Path(__file__).parent / "fixtures" / "journals"
RELEASE = json.loads((FIXTURE / "journals.json").read_text())
RUNS: dict[str, str] = RELEASE["runs"]


@pytest.fixture(name="home")
def home_fixture(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(FIXTURE / "journals.db", home / "corral.db")
    with sqlite3.connect(home / "corral.db") as conn:
        # The runs were parked when the fixture was made: their times move as if they were
        # parked a moment ago (a system run's limits.timeout_seconds counts from its start).
        (made,) = conn.execute("SELECT max(created_at) FROM runs").fetchone()
        conn.execute(
            "UPDATE runs SET created_at = created_at + :s, started_at = started_at + :s,"
            " deadline_at = deadline_at + :s",
            {"s": time.time() - made},
        )
    return home


@pytest.fixture(name="store")
async def store_fixture(home: Path) -> AsyncIterator[Store]:
    store = await open_store(f"sqlite:///{home / 'corral.db'}")
    try:
        yield store
    finally:
        await store.close()


def _stored_rows(home: Path) -> list[tuple[str, int, str, str]]:
    with sqlite3.connect(home / "corral.db") as conn:
        return list(conn.execute("SELECT run_id, seq, type, data FROM run_events ORDER BY 1, 2"))


def _without_optional_nulls(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """What the release stored, less the optional fields it wrote as ``null`` (this code
    leaves an optional field without a value out; docs/api.md says readers take both
    alike)."""
    keys = payload_class(parse_event_data(kind, data).TYPE)._keys
    optional = {k.key for k in keys if not k.always}
    return {k: v for k, v in data.items() if not (v is None and k in optional)}


def test_the_fixture_holds_the_runs_it_says_in_their_states() -> None:
    assert RELEASE["states"] == {
        "adder": "succeeded",
        "memo": "succeeded",
        "typed": "succeeded",
        "triage": "succeeded",
        "short": "failed",
        "boss": "succeeded",
        "gated": "waiting_approval",
        "chief": "waiting_children",
        "desk": "succeeded",
        "gatedesk": "waiting_children",
    }


def test_every_stored_event_reads_typed_and_writes_back_the_same_json(home: Path) -> None:
    rows = _stored_rows(home)
    kinds = {kind for _, _, kind, _ in rows}
    # every event type but a retry's error (no retryable failure in the fixture) is there
    assert {"run.start", "tool.call", "tool.result", "approval.requested", "child.start"} <= kinds
    assert {"child.finish", "message.send", "message.deliver", "handoff", "text.delta"} <= kinds
    assert {"memory.write", "memory.search", "error", "run.finish", "message.create"} <= kinds
    for run_id, seq, kind, text in rows:
        stored = json.loads(text)
        payload = parse_event_data(kind, stored)
        again = dumps(payload.to_dict())
        assert again == dumps(_without_optional_nulls(kind, stored)), (run_id, seq, kind)


async def test_every_journal_replays(store: Store) -> None:
    for name, run_id in RUNS.items():
        record = await store.get_run(run_id)
        assert record is not None
        events = await store.list_events(run_id)
        if record.system is not None:
            continue  # a system run's coordinator reads its own events (the resume below)
        checkpoint = replay(events)
        assert checkpoint.finished is record.state.finished, name
        assert checkpoint.usage == record.usage, name
        if record.state is RunState.SUCCEEDED:  # (a failed run's record counts its last step)
            assert checkpoint.messages[-1].content == record.messages[-1].content, name
            assert checkpoint.steps == record.steps, name


async def test_the_parked_runs_carry_on_to_their_ends(store: Store, home: Path) -> None:
    before = {run_id: await store.list_events(run_id) for run_id in RUNS.values()}
    settings = Settings(home=home, db_url=f"sqlite:///{home / 'corral.db'}", secret_key=None)
    bus = LocalBus()
    for _ in range(4):  # each decision lets a run go on to its next wait, if any
        pending = await store.list_approvals(states=[ApprovalState.PENDING.value])
        if not pending:
            break
        for approval in pending:
            await operations.decide(store, bus, approval.id, True, by="compat-test")
        with anyio.fail_after(30):
            await Worker(store, settings, poll_seconds=0.05, bus=bus).serve(
                anyio.Event(), until_idle=True
            )

    ended = {name: await store.get_run(run_id) for name, run_id in RUNS.items()}
    assert {name: r.state.value for name, r in ended.items() if r is not None} == {
        **RELEASE["states"],
        "gated": "succeeded",
        "chief": "succeeded",
        "gatedesk": "succeeded",
    }
    assert ended["gated"] is not None and ended["gated"].output == "added"
    assert ended["chief"] is not None and ended["chief"].output == "the child added"
    assert ended["gatedesk"] is not None and ended["gatedesk"].output == "helped"
    for run_id, old in before.items():  # what the release journaled stays as it was
        assert (await store.list_events(run_id))[: len(old)] == old
