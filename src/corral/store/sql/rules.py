"""The rules of the store that do not depend on a SQL dialect or driver, said once.

Both the SQLAlchemy parts of :class:`~corral.store.sql.SqlStore` and the SQLite
fast path (:mod:`corral.store.sqlite`) decide with these: what a save writes to
a run's row, whose events a write may carry, what a fencing token found in the
database means for a lease, how appended session messages are numbered, and
the errors each rule raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from corral.core.errors import ConflictError, LeaseLostError, NotFoundError
from corral.core.events import Event
from corral.core.messages import Message
from corral.core.runs import Lease, RunRecord, RunState
from corral.core.sessions import SessionMessage, SessionNotAllowedError
from corral.store.sql.rows import RUNS

#: Columns a save never writes: the run's key, and the lease columns that only
#: claims, renewals and releases change (a save that ends the lease clears them).
_NOT_SAVED = ("id", "lease_owner", "lease_expires_at", "fencing_token")
#: The lease columns a save that ends the lease (the run is no longer running) clears.
LEASE_COLUMNS = ("lease_owner", "lease_expires_at")


def _saved(cancel_requested: bool, running: bool) -> tuple[str, ...]:
    kept = [c for c in RUNS.columns if c not in _NOT_SAVED]
    if not cancel_requested:
        kept.remove("cancel_requested")
    return tuple(kept) if running else (*kept, *LEASE_COLUMNS)


_SAVED = {(c, r): _saved(c, r) for c in (False, True) for r in (False, True)}


def saved_run_columns(record: RunRecord, lease: Lease | None) -> tuple[str, ...]:
    """The columns ``save_run`` writes for ``record`` (under ``lease``, when given).

    A lease on another run is a ``ConflictError``. ``cancel_requested`` is only
    written when set: the flag belongs to ``request_cancel``, and a worker saving
    the record it claimed before the request must not clear it. A run that is no
    longer ``running`` has its lease cleared: the ``LEASE_COLUMNS`` are written as
    ``NULL`` then (and only then).
    """
    if lease is not None and lease.run_id != record.id:
        raise ConflictError(f"cannot save run {record.id!r} under a lease on {lease.run_id!r}")
    return _SAVED[record.cancel_requested, record.state is RunState.RUNNING]


def saved_run_values(record: RunRecord, lease: Lease | None) -> dict[str, Any]:
    """The columns ``save_run`` writes for ``record``, with their values (SQLAlchemy's;
    the fast path takes :func:`saved_run_columns` and the record's ``RUNS.params``)."""
    columns = saved_run_columns(record, lease)
    values = RUNS.values(record)
    saved = {c: values[c] for c in columns}
    if record.state is not RunState.RUNNING:
        saved.update(dict.fromkeys(LEASE_COLUMNS))
    return saved


def check_events_saved_with(events: Sequence[Event], run_id: str) -> None:
    """``ConflictError`` unless every event belongs to run ``run_id`` (saved with it)."""
    if any(e.run_id != run_id for e in events):
        raise ConflictError(f"events of another run cannot be saved with run {run_id!r}")


def check_events_under(events: Sequence[Event], lease: Lease | None) -> None:
    """``ConflictError`` when ``lease`` is given and an event belongs to another run."""
    if lease is not None and any(e.run_id != lease.run_id for e in events):
        raise ConflictError(
            f"events of another run cannot be written under a lease on {lease.run_id!r}"
        )


def judge_token(run_id: str, token: int | None, lease: Lease | None) -> None:
    """What the fencing token of run ``run_id`` as read (``None``: no such run) means for a
    write under ``lease``: ``NotFoundError``, ``LeaseLostError``, or nothing when it may go on."""
    if token is None:
        raise NotFoundError(f"run {run_id!r} not found")
    if lease is not None and token != lease.token:
        raise lost_lease(lease, token)


def lost_lease(lease: Lease, token: int) -> LeaseLostError:
    """The error of a write refused because a newer claim bumped the fencing token."""
    return LeaseLostError(
        f"run {lease.run_id!r} was claimed again (fencing token {token}) after "
        f"{lease.owner!r} leased it with token {lease.token}; the write was refused"
    )


def no_longer_running(lease: Lease) -> LeaseLostError:
    """The error of renewing a lease whose token still matches on a run no longer running
    (its holder saved it into another state, which ended the lease)."""
    return LeaseLostError(
        f"run {lease.run_id!r} is no longer running under the lease of {lease.owner!r}"
    )


def agent_not_found(record: RunRecord) -> NotFoundError:
    """The error of submitting a run of an Agent its namespace does not have."""
    return NotFoundError(f"Agent {record.agent!r} not found in namespace {record.namespace!r}")


def check_parent_open(record: RunRecord, parent: Sequence[Any] | None) -> None:
    """Whether the child run ``record`` may be stored under its parent, as the submit's own
    transaction read it (``(state, cancel_requested)``; ``None``: no such run). A run read
    earlier may have ended or been cancelled since (a node run delivered while its system
    run was cancelled): no child starts after its parent's end or once a cancel, whose
    cascade has already looked for children, was asked for."""
    if parent is None:
        raise NotFoundError(f"run {record.parent_run_id!r}, the parent of a new child, not found")
    state, cancel_requested = RunState(parent[0]), bool(parent[1])
    if state.finished or cancel_requested:
        why = f"has ended {state.value}" if state.finished else "is being cancelled"
        raise ConflictError(
            f"run {record.parent_run_id} {why}: no child run of agent {record.agent!r} starts"
        )


def session_not_found(session_id: str) -> NotFoundError:
    """The error of writing to a session that does not exist."""
    return NotFoundError(f"session {session_id!r} not found")


def check_session_agent(session_id: str, owner: str, agent: str) -> None:
    """``ConflictError`` when the session (owned by agent ``owner``) is used for ``agent``."""
    if owner != agent:
        raise ConflictError(f"session {session_id!r} belongs to agent {owner!r}")


def check_session_of_tree(record: RunRecord, opened_now: bool, of_tree: object) -> None:
    """``SessionNotAllowedError`` when the child run ``record`` names a session its run tree
    may not continue: one that existed before (not ``opened_now`` by its submit) and that
    ``of_tree`` (what ``session_of_tree`` found) says is neither its ancestors' nor opened by
    a run of its tree. A child run's session is named by a model or a tool program, which
    may be steered by what they read: another tree's session would show them its messages."""
    if record.parent_run_id is None or record.session_id is None or opened_now or of_tree:
        return
    raise SessionNotAllowedError(
        f"session {record.session_id!r} was neither opened by this run's tree nor named for "
        "it: a child run continues only a session a run of its own tree opened, or the "
        "session of its parent or an ancestor"
    )


def numbered(
    messages: Sequence[Message], last_seq: int, run_id: str | None, now: float
) -> list[SessionMessage]:
    """``messages`` as appended after seq ``last_seq`` of their session (0: none yet)."""
    return [
        SessionMessage(last_seq + i, message, run_id, created_at=now)
        for i, message in enumerate(messages, start=1)
    ]
