"""Embedded mode: submit a durable run and execute it in this process, or follow it.

``corral run`` is submit-and-follow: the run is queued like any other, then
this process claims exactly that run and executes it with an observer that
streams its events. If another worker got there first (a long-lived
``corral worker`` on the same store), this process follows the stored events
instead. Either way the run is journaled, so a crash of this process leaves a
run that any worker resumes.
"""

from __future__ import annotations

import time
from typing import Any, Self

import anyio

from corral.bus.base import Bus
from corral.core.errors import UserError
from corral.core.events import Event
from corral.core.ids import new_id
from corral.core.runs import Lease, RunRecord, RunState
from corral.core.sessions import check_session_id
from corral.core.settings import Settings
from corral.resources.kinds import json_schema_problem
from corral.runtime.agents import Loading
from corral.runtime.executor import Observer, RunExecutor
from corral.runtime.worker import default_owner
from corral.store.base import Store, Submitted

FOLLOW_POLL_SECONDS = 0.1


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
    bus: Bus | None = None,
) -> tuple[RunRecord, bool]:
    """Queue a run of ``agent``; returns ``(run, created)`` (``False``: the key was seen before).

    ``NotFoundError`` (nothing stored) when the agent does not exist, ``UserError``
    when ``output_schema`` is not a valid JSON Schema, ``InvalidSessionIdError`` for a
    session id that breaks the rule of ``core/sessions.py``. A new run is
    announced on ``bus`` (one due later too: a dispatching bus delivers it again
    when it is due).
    """
    submitted = await _submit(
        store,
        agent,
        user_input,
        namespace=namespace,
        session=session,
        idempotency_key=idempotency_key,
        priority=priority,
        delay=delay,
        output_schema=output_schema,
    )
    if submitted.created and bus is not None:
        await bus.announce_runnable([submitted.record.id], mark="submitted")
    return submitted.record, submitted.created


async def _submit(
    store: Store,
    agent: str,
    user_input: str,
    *,
    namespace: str,
    session: str | None,
    idempotency_key: str | None = None,
    priority: int = 0,
    delay: float = 0.0,
    output_schema: dict[str, Any] | None,
    claim_for: tuple[str, float] | None = None,
) -> Submitted:
    problem = json_schema_problem(output_schema) if output_schema is not None else None
    if problem is not None:  # before anything is stored: it could only fail the run
        raise UserError(f"the output schema is {problem}")
    if session is not None:  # opened by the store with the run (submit_agent_run)
        check_session_id(session)
    now = time.time()
    record = RunRecord(
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
    )
    return await store.submit_agent_run(record, claim_for=claim_for)


class LocalRunner:
    """Runs agents in this process, one durable run per call, all through one executor.

    The executor keeps the agents it builds (model clients, MCP sessions, a
    loaded local model) until the namespace's resources change, so a program
    that runs many tasks keeps one runner open rather than calling
    :func:`run_agent` (which opens one per run)::

        async with LocalRunner(store, settings) as runner:
            record = await runner.run("assistant", "What is 17 plus 25?")
    """

    def __init__(
        self,
        store: Store,
        settings: Settings,
        *,
        observer: Observer | None = None,
        loading: Loading | None = None,
        lease_seconds: float = 30.0,
    ) -> None:
        self.store = store
        self.observer = observer
        self.lease_seconds = lease_seconds
        self.owner = default_owner()
        self.executor = RunExecutor(
            store, settings, lease_seconds=lease_seconds, observer=observer, loading=loading
        )

    async def __aenter__(self) -> Self:
        await self.executor.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.executor.__aexit__(*exc_info)

    async def run(
        self,
        agent: str,
        user_input: str,
        *,
        namespace: str = "default",
        session: str | None = None,
        output_schema: dict[str, Any] | None = None,
    ) -> RunRecord:
        """Submit a run and see it through: until it ends or waits for approval.

        The run is submitted already claimed by this runner (one commit for both,
        where the store can), so no other worker can take it before it starts.
        """
        submitted = await _submit(
            self.store,
            agent,
            user_input,
            namespace=namespace,
            session=session,
            output_schema=output_schema,
            claim_for=(self.owner, self.lease_seconds),
        )
        claim = (submitted.record, submitted.lease) if submitted.lease is not None else None
        return await self._see_through(submitted.record.id, claim)

    async def see_through(self, run_id: str) -> RunRecord:
        """Execute the run here whenever it is runnable, or follow whoever executes it."""
        return await self._see_through(run_id, None)

    async def _see_through(self, run_id: str, claim: tuple[RunRecord, Lease] | None) -> RunRecord:
        store, observer = self.store, self.observer
        seen = 0
        while True:
            if claim is None:
                claims = await store.claim_runs(self.owner, self.lease_seconds, 1, run_ids=[run_id])
                claim = claims[0] if claims else None
            current: RunRecord | None = None
            if claim is not None:
                record, lease = claim
                if observer is not None:
                    # The observer only gets events this process emits: catch up first,
                    # then skip what it saw live.
                    seen = await _replay_to(store, run_id, seen, observer)
                    outcome = await self.executor.execute(record, lease)
                    seen = await _replay_to(store, run_id, seen, None)
                else:
                    outcome = await self.executor.execute(record, lease)
                if outcome == "done":  # saved by the executor: the record is the stored run
                    current = record
            elif observer is not None:
                seen = await _replay_to(store, run_id, seen, observer)
            claim = None
            if current is None:
                current = await store.get_run(run_id)
                assert current is not None
            if current.state.finished or current.state is RunState.WAITING_APPROVAL:
                if observer is not None:
                    await _replay_to(store, run_id, seen, observer)
                return current
            await anyio.sleep(FOLLOW_POLL_SECONDS)


async def run_agent(
    store: Store,
    settings: Settings,
    agent: str,
    user_input: str,
    *,
    namespace: str = "default",
    session: str | None = None,
    output_schema: dict[str, Any] | None = None,
    observer: Observer | None = None,
    loading: Loading | None = None,
    lease_seconds: float = 30.0,
) -> RunRecord:
    """Submit a run and see it through in a runner of its own (see :class:`LocalRunner`)."""
    async with LocalRunner(
        store, settings, observer=observer, loading=loading, lease_seconds=lease_seconds
    ) as runner:
        return await runner.run(
            agent, user_input, namespace=namespace, session=session, output_schema=output_schema
        )


async def see_through(
    store: Store,
    settings: Settings,
    run_id: str,
    *,
    observer: Observer | None = None,
    loading: Loading | None = None,
    lease_seconds: float = 30.0,
) -> RunRecord:
    """Execute the run here whenever it is runnable, or follow whoever executes it."""
    async with LocalRunner(
        store, settings, observer=observer, loading=loading, lease_seconds=lease_seconds
    ) as runner:
        return await runner.see_through(run_id)


async def _replay_to(store: Store, run_id: str, after: int, observer: Observer | None) -> int:
    """Pass the run's events after ``after`` to ``observer`` (none: only skip them);
    returns the last seq seen."""
    events: list[Event] = await store.list_events(run_id, after)
    for event in events:
        if observer is not None:
            await observer(event)
    return events[-1].seq if events else after
