"""Rows <-> records (store/sql/rows.py) and the fast path's compiled statements.

The store suites run every operation on all three stores; these check the parts
that would otherwise only fail as a wrong value somewhere downstream: a record and
its table drifting apart, a field that does not survive the trip through either
path, a statement whose parameters the fast path would bind unconverted.
"""

from __future__ import annotations

import dataclasses
import sqlite3

import pytest
import sqlalchemy as sa

from corral.core.events import Event, ToolResultData
from corral.core.messages import Message, ToolCall, Usage
from corral.core.runs import Approval, ApprovalState, PendingApproval, RunRecord, RunState
from corral.core.sessions import SessionMessage
from corral.store import schema
from corral.store.sql.rows import APPROVALS, EVENTS, RUNS, SESSION_MESSAGES, RecordRows
from corral.store.sqlite import Compiled


def a_full_run() -> RunRecord:
    """A run with every kind of field set to something other than its default."""
    call = ToolCall(id="c1", name="lookup", arguments='{"q": "ünïcode ✓"}')
    return RunRecord(
        id="run-1",
        namespace="team-a",
        agent="helper",
        input="say ✓ \x00 and ' quotes \"",
        state=RunState.WAITING_APPROVAL,
        output={"answer": [1, 2.5, None, "x"]},
        error={"code": "tool_error", "message": "boom"},
        usage=Usage(input_tokens=3, output_tokens=4, requests=1),
        cost_usd=0.25,
        steps=2,
        messages=[
            Message("user", "hi"),
            Message("assistant", tool_calls=(call,)),
        ],
        pending_approvals=[PendingApproval("c1", "lookup", "{}", "policy", 10.0, 20.0)],
        created_at=1.5,
        started_at=2.5,
        finished_at=None,
        idempotency_key="key-✓",
        session_id="s1",
        priority=-3,
        not_before=7.0,
        attempts=2,
        max_attempts=5,
        cancel_requested=True,
        lease_owner="w1",
        lease_expires_at=99.0,
        fencing_token=12,
        output_schema={"type": "object"},
    )


def sqlite_row(rows: RecordRows[object], params: list[object]) -> tuple[object, ...]:
    """``params`` stored by SQLite and read back as the fast path reads them."""
    conn = sqlite3.connect(":memory:")
    names = ", ".join(rows.columns)
    conn.execute(f"CREATE TABLE t ({names})")
    conn.execute(f"INSERT INTO t VALUES ({', '.join('?' for _ in rows.columns)})", params)
    row: tuple[object, ...] = conn.execute(f"SELECT {names} FROM t").fetchone()
    return row


def test_a_run_survives_both_paths_field_for_field() -> None:
    run = a_full_run()
    by_sqlalchemy = RUNS.values(run)
    assert list(by_sqlalchemy) == list(RUNS.columns)
    assert by_sqlalchemy["pending"][0]["call_id"] == "c1"  # renamed field, stored as JSON
    assert by_sqlalchemy["state"] == "waiting_approval"
    # SQLAlchemy hands JSON back decoded: the dict's values, in table order, are its row.
    assert RUNS.record(tuple(by_sqlalchemy.values())) == run
    # The fast path stores JSON as text and booleans as integers.
    params = RUNS.params(run)
    assert isinstance(params[RUNS.columns.index("messages")], str)
    assert RUNS.record(sqlite_row(RUNS, params), text=True) == run


def test_nulls_and_empty_values_survive_both_paths() -> None:
    run = RunRecord(id="r", namespace="n", agent="a", input="")
    assert RUNS.record(tuple(RUNS.values(run).values())) == run
    assert RUNS.record(sqlite_row(RUNS, RUNS.params(run)), text=True) == run


def test_events_approvals_and_session_messages_survive_the_fast_path() -> None:
    output = {"nested": {"ok": True}, "list": []}
    event = Event(
        "r", 3, ToolResultData(step=1, call_id="c", tool="t", output=output, error=None), 4.5
    )
    assert EVENTS.record(sqlite_row(EVENTS, EVENTS.params(event)), text=True) == event
    approval = Approval("a1", "r", "n", "ag", "c1", "tool", "{}", "why", ApprovalState.APPROVED)
    assert APPROVALS.record(sqlite_row(APPROVALS, APPROVALS.params(approval)), text=True) == (
        approval
    )
    message = SessionMessage(4, Message("user", "ü"), "r", hidden=True)
    params = SESSION_MESSAGES.params(message, namespace="n", session_id="s", position=3.5)
    # The columns that are not the record's go where the table has them.
    by_column = dict(zip(SESSION_MESSAGES.columns, params, strict=True))
    assert (by_column["namespace"], by_column["session_id"], by_column["position"]) == (
        "n",
        "s",
        3.5,
    )
    assert SESSION_MESSAGES.record(sqlite_row(SESSION_MESSAGES, params), text=True) == message


def test_a_plain_string_for_an_enum_field_is_checked() -> None:
    approval = Approval("a1", "r", "n", "ag", "c1", "tool", "{}", "why", "approved")  # type: ignore[arg-type]
    assert APPROVALS.values(approval)["state"] == "approved"
    with pytest.raises(ValueError, match="nonsense"):
        APPROVALS.values(dataclasses.replace(approval, state="nonsense"))  # type: ignore[arg-type]


def test_a_field_without_its_column_fails_when_the_mapping_is_built() -> None:
    @dataclasses.dataclass
    class Grown(RunRecord):
        budget_usd: float = 0.0

    with pytest.raises(TypeError, match=r"budget_usd.*migration"):
        RecordRows(Grown, schema.runs, renamed={"pending_approvals": "pending"})
    # ... and a column without its field too.
    with pytest.raises(TypeError, match="pending"):
        RecordRows(RunRecord, schema.runs)


def test_the_fast_path_refuses_a_statement_whose_values_it_would_bind_unconverted() -> None:
    table = sa.Table("t", sa.MetaData(), sa.Column("at", sa.DateTime))
    with pytest.raises(TypeError, match="needs converting"):
        Compiled(table.insert())
    # Its own constants are bound as SQLAlchemy binds them (a JSON path here).
    compiled = Compiled(sa.select(schema.resources.c.spec["max_attempts"].as_integer()))
    assert compiled.params() == ['$."max_attempts"']
