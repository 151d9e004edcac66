"""What both front doors do with runs and approvals, once: the HTTP routes and the CLI call these.

- :func:`submit` queues a run (and announces it), :func:`submit_claimed` queues one
  already claimed by the caller (``corral run`` executes it at once);
- :func:`get_run`, :func:`get_approval`: one object, ``NotFoundError`` when it is absent
  or (``namespace`` given) in another namespace - whether or not it exists;
- :func:`cancel` (a run and its descendants), :func:`children` (a run's child runs);
- :func:`decide`: approve or reject, and announce the run the decision may have queued;
- :func:`follow_run`: a run's events to an observer, until it finishes or waits for a human.

Who may do what (tokens, roles) is the front door's business; the namespace a
caller is confined to is passed in.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from corral.bus.base import Bus
from corral.core.errors import ConflictError, NotFoundError, UserError
from corral.core.events import Event
from corral.core.ids import new_id
from corral.core.labels import check_labels
from corral.core.runs import Approval, RunRecord, RunState
from corral.core.sessions import check_session_id
from corral.resources.kinds import json_schema_problem
from corral.runtime.follow import RunFollower, Until
from corral.runtime.journal import Observer
from corral.store.base import Store, Submitted


async def submit(
    store: Store,
    agent: str,
    user_input: str,
    *,
    namespace: str = "default",
    session: str | None = None,
    idempotency_key: str | None = None,
    priority: int = 0,
    delay: float = 0.0,
    output_schema: dict[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
    bus: Bus | None = None,
) -> tuple[RunRecord, bool]:
    """Queue a run of ``agent``; returns ``(run, created)`` (``False``: the key was seen before).

    ``NotFoundError`` (nothing stored) when the agent does not exist, ``UserError``
    when ``output_schema`` is not a valid JSON Schema, ``LabelError`` for labels that
    break the rule of ``core/labels.py``, ``InvalidSessionIdError`` for a
    session id that breaks the rule of ``core/sessions.py``. A new run is
    announced on ``bus`` (one due later too: a dispatching bus delivers it again
    when it is due).
    """
    record = new_run(
        agent,
        user_input,
        namespace=namespace,
        session=session,
        idempotency_key=idempotency_key,
        priority=priority,
        delay=delay,
        output_schema=output_schema,
        labels=labels,
    )
    submitted = await store.submit_agent_run(record)
    if submitted.record.system is not None:
        # the key is a system run's (an AgentSystem of the agent's name) or a node run's
        raise ConflictError(
            f"idempotency key {idempotency_key!r} belongs to task {submitted.record.id}, "
            f"a run of AgentSystem {submitted.record.system!r}, not a task of agent {agent!r}"
        )
    if submitted.created and bus is not None:
        await bus.announce_runnable([submitted.record.id], mark="submitted")
    return submitted.record, submitted.created


async def submit_claimed(
    store: Store,
    agent: str,
    user_input: str,
    *,
    owner: str,
    lease_seconds: float,
    namespace: str = "default",
    session: str | None = None,
    output_schema: dict[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Submitted:
    """Queue a run claimed by ``owner`` in the same transaction where the store can
    (``lease`` is ``None`` when it could not be claimed); the errors of :func:`submit`.
    Nothing is announced: the caller executes the run."""
    record = new_run(
        agent,
        user_input,
        namespace=namespace,
        session=session,
        output_schema=output_schema,
        labels=labels,
    )
    return await store.submit_agent_run(record, claim_for=(owner, lease_seconds))


def new_run(
    agent: str,
    user_input: str,
    *,
    namespace: str,
    session: str | None,
    idempotency_key: str | None = None,
    priority: int = 0,
    delay: float = 0.0,
    output_schema: dict[str, Any] | None,
    labels: Mapping[str, str] | None = None,
) -> RunRecord:
    """A run to submit, its input checked before anything is stored."""
    problem = json_schema_problem(output_schema) if output_schema is not None else None
    if problem is not None:  # it could only fail the run
        raise UserError(f"the output schema is {problem}")
    if session is not None:  # opened by the store with the run (submit_agent_run)
        check_session_id(session)
    now = time.time()
    return RunRecord(
        id=new_id("run"),
        namespace=namespace,
        agent=agent,
        input=user_input,
        idempotency_key=idempotency_key,
        session_id=session,
        priority=priority,
        not_before=now + delay,
        created_at=now,
        output_schema=output_schema,
        labels=check_labels(labels or {}),
    )


def run_not_found(run_id: str) -> NotFoundError:
    """The error for a run that is not there (never was, was deleted, or is not the caller's)."""
    return NotFoundError(f"task {run_id!r} not found")


async def get_run(store: Store, run_id: str, *, namespace: str | None = None) -> RunRecord:
    """The run; ``NotFoundError`` when it is absent or not in ``namespace`` (when given)."""
    record = await store.get_run(run_id)
    if record is None or (namespace is not None and record.namespace != namespace):
        raise run_not_found(run_id)
    return record


async def children(store: Store, run_id: str, *, namespace: str | None = None) -> list[RunRecord]:
    """The child runs of a run, oldest first; ``NotFoundError`` as :func:`get_run`."""
    await get_run(store, run_id, namespace=namespace)
    return await store.list_children(run_id)


async def cancel(
    store: Store, run_id: str, *, namespace: str | None = None, bus: Bus | None = None
) -> RunRecord:
    """Cancel a run and its descendants (see :meth:`Store.request_cancel`); ``NotFoundError``
    as :func:`get_run`. A child run cancelled at once may have queued its parent: the parent
    is announced on ``bus`` (when given), so a worker resumes it now.

    A run that has already finished is left as it is: ``ConflictError`` ("run X already
    succeeded; nothing cancelled"), so a caller never mistakes it for a cancellation
    (kubectl's and Temporal's habit; the CLI's exit code 2, the API's 409).
    """
    record = await get_run(store, run_id, namespace=namespace)
    if record.state.finished:
        raise already_finished(record)
    cancelled = await store.request_cancel(run_id)
    if cancelled.state.finished and cancelled.state is not RunState.CANCELLED:
        raise already_finished(cancelled)  # it finished between the read and the request
    if bus is not None and cancelled.parent_run_id is not None and cancelled.state.finished:
        await bus.announce_runnable([cancelled.parent_run_id], mark=f"child:{cancelled.id}")
    return cancelled


def already_finished(record: RunRecord) -> ConflictError:
    """The error for cancelling a run that has already finished."""
    ended = {RunState.DEAD_LETTER: "ended as a dead letter"}.get(record.state, record.state.value)
    return ConflictError(f"task {record.id} already {ended}; nothing cancelled")


async def get_approval(store: Store, approval_id: str, *, namespace: str | None = None) -> Approval:
    """The approval; ``NotFoundError`` when it is absent or not in ``namespace`` (when given)."""
    approval = await store.get_approval(approval_id)
    if approval is None or (namespace is not None and approval.namespace != namespace):
        raise NotFoundError(f"approval {approval_id!r} not found")
    return approval


async def decide(
    store: Store,
    bus: Bus,
    approval_id: str,
    approved: bool,
    *,
    by: str | None = None,
    reason: str | None = None,
    namespace: str | None = None,
) -> Approval:
    """Approve or reject a pending tool call (``ConflictError`` once decided or expired).

    The store queues the run when this was its last pending call: it is announced
    on ``bus``, so a worker resumes it now rather than at its next sweep.
    """
    if namespace is not None:
        await get_approval(store, approval_id, namespace=namespace)
    decided = await store.decide_approval(approval_id, approved, by=by, reason=reason)
    await bus.announce_runnable([decided.run_id], mark=decided.id)
    return decided


async def follow_run(
    store: Store,
    bus: Bus,
    run_id: str,
    observer: Observer,
    *,
    follow: bool = True,
    poll_seconds: float = 1.0,
) -> RunRecord:
    """Hand the run's stored events to ``observer``; with ``follow`` also those committed
    later, until the run finishes or waits for approval. Returns the run as it ended.

    The follower is woken by the events announced on ``bus`` and reads the store
    every ``poll_seconds`` otherwise (a run executed where the bus does not reach).
    ``NotFoundError`` when the run does not exist, or is deleted while followed.
    """
    if not follow:
        seen = await replay_events(store, run_id, 0, observer)
        record = await store.get_run(run_id)
        if record is None:
            raise run_not_found(run_id)
        await replay_events(store, run_id, seen, observer)  # written just before the read
        return record
    follower = RunFollower(store, bus, run_id, until=Until.SETTLED, poll_seconds=poll_seconds)
    async for batch in follower.batches():
        for event in batch:
            await observer(event)
    if follower.record is None:
        raise run_not_found(run_id)
    return follower.record


async def replay_events(store: Store, run_id: str, after: int, observer: Observer | None) -> int:
    """Pass the run's stored events after ``after`` to ``observer`` (none: only skip them);
    returns the last seq seen."""
    events: list[Event] = await store.list_events(run_id, after)
    if observer is not None:
        for event in events:
            await observer(event)
    return events[-1].seq if events else after
