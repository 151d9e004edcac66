"""Embedded mode: execute a durable run in this process, or follow whoever executes it.

``corral run`` is submit-and-follow: the run is queued like any other, then
this process claims exactly that run and executes it with an observer that
streams its events. If another worker got there first (a long-lived
``corral worker`` on the same store), this process follows the stored events
instead. Either way the run is journaled, so a crash of this process leaves a
run that any worker resumes.

A run that parks for its child runs (``agents_exec``) is seen through with them:
each unfinished child is executed here (or followed, when a worker has it) until
it ends, concurrently, and then the parent again. The observer sees only the
events of the runs it asked for; a child's show in its parent's ``child.start``
and ``child.finish``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Self

import anyio

from corral.bus.base import Bus
from corral.bus.local import LocalBus
from corral.core.events import Event
from corral.core.runs import Lease, RunRecord, RunState
from corral.core.settings import Settings
from corral.runtime.agents import Loading
from corral.runtime.executor import Observer, RunExecutor
from corral.runtime.follow import RunFollower, Stop, Until
from corral.runtime.operations import replay_events, run_not_found, submit_claimed
from corral.runtime.worker import default_owner
from corral.store.base import Store

#: how often a run executed elsewhere is looked at when no bus announcement wakes its follower
FOLLOW_POLL_SECONDS = 1.0


@dataclass
class Steering:
    """How the caller of :meth:`LocalRunner.run` steers the run beyond its events.

    - ``submitted`` is called with the run's id as soon as it is stored;
    - ``on_pause``: when given, a run that pauses for approval is not the end: it
      is called with the run (each time it pauses), and the run is followed on -
      executed here again once the decision queued it, unless a worker gets it
      first - until it finishes;
    - ``stop``: when set, seeing the run through ends: a run executing here is
      released with its journal (the attempt given back), as a stopping worker
      does, so any worker resumes it at once; one executing elsewhere goes on.
    """

    submitted: Callable[[str], None] | None = None
    on_pause: Callable[[RunRecord], Awaitable[None]] | None = None
    stop: anyio.Event | None = None

    @property
    def stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def ends_at(self, state: RunState) -> bool:
        """Whether seeing the run through ends in ``state``."""
        return state.finished or (state is RunState.WAITING_APPROVAL and self.on_pause is None)

    def for_children(self) -> Steering:
        """How the child runs of a run seen through are steered: paused and stopped
        alike, never reported as submitted."""
        return Steering(on_pause=self.on_pause, stop=self.stop)


class LocalRunner:
    """Runs agents in this process, one durable run per call, all through one executor.

    The executor keeps the agents it builds (model clients, MCP sessions, a
    loaded local model) until the namespace's resources change, so a program
    that runs many tasks keeps one runner open rather than calling
    :func:`run_agent` (which opens one per run)::

        async with LocalRunner(store, settings) as runner:
            record = await runner.run("assistant", "What is 17 plus 25?")

    With ``bus`` the executor announces what it commits (as a worker does), and a
    run that another worker executes is followed as its events are announced;
    without, such a run's store is read every ``poll_seconds``.
    """

    def __init__(
        self,
        store: Store,
        settings: Settings,
        *,
        observer: Observer | None = None,
        loading: Loading | None = None,
        lease_seconds: float = 30.0,
        bus: Bus | None = None,
        poll_seconds: float = FOLLOW_POLL_SECONDS,
        descendants: bool = False,
    ) -> None:
        """``descendants``: the observer also gets the events of the child runs seen
        through (``corral systems run`` shows a system run's whole tree)."""
        self.store = store
        self.descendants = descendants
        self.observer = observer
        self.lease_seconds = lease_seconds
        self.poll_seconds = poll_seconds
        self.bus = bus or LocalBus()
        self.owner = default_owner()
        #: the runs whose events the observer gets (a child's are not its caller's)
        self._shown: set[str] = set()
        self.executor = RunExecutor(
            store,
            settings,
            lease_seconds=lease_seconds,
            observer=None if observer is None else self._observe,
            loading=loading,
            bus=bus,
        )

    async def __aenter__(self) -> Self:
        await self.executor.__aenter__()
        return self

    async def _observe(self, event: Event) -> None:
        if self.observer is not None and (self.descendants or event.run_id in self._shown):
            await self.observer(event)

    def _observer_of(self, run_id: str) -> Observer | None:
        return self.observer if self.descendants or run_id in self._shown else None

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
        labels: Mapping[str, str] | None = None,
        steering: Steering | None = None,
    ) -> RunRecord:
        """Submit a run and see it through: until it ends or waits for approval (with
        ``steering``: see :class:`Steering`).

        The run is submitted already claimed by this runner (one commit for both,
        where the store can), so no other worker can take it before it starts.
        """
        submitted = await submit_claimed(
            self.store,
            agent,
            user_input,
            owner=self.owner,
            lease_seconds=self.lease_seconds,
            namespace=namespace,
            session=session,
            output_schema=output_schema,
            labels=labels,
        )
        if steering is not None and steering.submitted is not None:
            steering.submitted(submitted.record.id)
        claim = (submitted.record, submitted.lease) if submitted.lease is not None else None
        return await self._shown_through(submitted.record.id, claim, steering or Steering())

    async def see_through(self, run_id: str, steering: Steering | None = None) -> RunRecord:
        """Execute the run here whenever it is runnable, or follow whoever executes it.

        ``NotFoundError`` when the run does not exist or is deleted meanwhile."""
        return await self._shown_through(run_id, None, steering or Steering())

    async def _shown_through(
        self, run_id: str, claim: tuple[RunRecord, Lease] | None, steering: Steering
    ) -> RunRecord:
        """:meth:`_see_through` with the run's events for the observer (its children's not)."""
        self._shown.add(run_id)
        try:
            return await self._see_through(run_id, claim, steering)
        finally:
            self._shown.discard(run_id)

    async def _see_through(
        self, run_id: str, claim: tuple[RunRecord, Lease] | None, steering: Steering
    ) -> RunRecord:
        seen = 0  # the last event the observer got
        paused = -1  # the last event when the run's pause was reported (steering.on_pause)
        observer = self._observer_of(run_id)
        while True:
            if claim is None and not steering.stopped:
                claims = await self.store.claim_runs(
                    self.owner, self.lease_seconds, 1, run_ids=[run_id]
                )
                claim = claims[0] if claims else None
            if claim is not None:
                record, lease = claim
                claim = None
                if observer is not None:
                    # The observer only gets events this process emits: catch up first,
                    # then skip what it saw live.
                    seen = await replay_events(self.store, run_id, seen, observer)
                    outcome = await self.executor.execute(record, lease, steering.stop)
                    seen = await replay_events(self.store, run_id, seen, None)
                else:
                    outcome = await self.executor.execute(record, lease, steering.stop)
                # saved by the executor: the record is the stored run
                if outcome == "done" and steering.ends_at(record.state):
                    return record
                if outcome == "done" and record.state is RunState.WAITING_APPROVAL:
                    assert steering.on_pause is not None
                    await steering.on_pause(record)
                    paused = seen
                if outcome == "done" and record.state is RunState.WAITING_CHILDREN:
                    if not await self._children_through(run_id, steering):
                        return await self._stored(run_id)
                    continue  # queued again by its last child: claim it
            if steering.stopped:
                return await self._stored(run_id)
            current, seen, paused = await self._follow(run_id, seen, steering, paused)
            if steering.ends_at(current.state) or steering.stopped:
                return current
            if current.state is RunState.WAITING_CHILDREN:
                if not await self._children_through(run_id, steering):
                    return await self._stored(run_id)
                continue
            due_in = current.not_before - time.time()
            if current.state is RunState.QUEUED and due_in > 0:  # a retry's backoff
                with anyio.move_on_after(due_in):
                    await (steering.stop or anyio.Event()).wait()

    async def _children_through(self, run_id: str, steering: Steering) -> bool:
        """See the unfinished child runs of a parked run through, all at once; whether
        they all finished (else one waits for a human, or steering stopped)."""
        unfinished = [c for c in await self.store.list_children(run_id) if not c.state.finished]
        children = steering.for_children()
        async with anyio.create_task_group() as group:
            for child in unfinished:
                group.start_soon(self._see_through, child.id, None, children)
        if steering.stopped:
            return False
        return all(c.state.finished for c in await self.store.list_children(run_id))

    async def _stored(self, run_id: str) -> RunRecord:
        record = await self.store.get_run(run_id)
        if record is None:  # deleted meanwhile
            raise run_not_found(run_id)
        return record

    async def _follow(
        self, run_id: str, seen: int, steering: Steering, paused: int
    ) -> tuple[RunRecord, int, int]:
        """Hand the run's new events to the observer until it finishes, waits for approval
        (unless ``steering`` follows on), or may be claimed here (queued, or its holder's
        lease expired), or steering stops; returns the run as last read, the last event
        handed out and the last event when a pause was reported. A run queued for later
        ends it at once.

        The first look never counts as claimable: a claim has just failed (another
        worker won, or the Agent is at its ``max_concurrent_runs``), so the next waits
        for news or ``poll_seconds``."""
        stop = Stop()  # set when the run may be claimed here: the follower ends after its round
        follower = RunFollower(
            self.store,
            self.bus,
            run_id,
            after=seen,
            until=Until.SETTLED if steering.on_pause is None else Until.FINISHED,
            poll_seconds=self.poll_seconds,
            stop=stop,
        )
        first = True
        observer = self._observer_of(run_id)
        async for events in follower.batches():
            if observer is not None:
                for event in events:
                    await observer(event)
            record = follower.record
            if (
                record is not None
                and record.state is RunState.WAITING_APPROVAL
                and steering.on_pause is not None
                and not events
                and follower.last_seq != paused
            ):  # paused under another worker (or decided here and waiting for more)
                paused = follower.last_seq
                await steering.on_pause(record)
            if steering.stopped or (
                record is not None
                and (
                    _due_later(record)
                    or record.state is RunState.WAITING_CHILDREN  # its children are seen to
                    or (not first and _claimable(record))
                )
            ):
                stop.set()
            first = False
        if follower.record is None:  # deleted meanwhile
            raise run_not_found(run_id)
        return follower.record, follower.last_seq, paused


def _due_later(record: RunRecord) -> bool:
    return record.state is RunState.QUEUED and record.not_before > time.time()


def _claimable(record: RunRecord) -> bool:
    """Whether a claim of the run could succeed now (as far as this read of it tells)."""
    now = time.time()
    if record.state is RunState.QUEUED:
        return record.not_before <= now
    expires = record.lease_expires_at
    return record.state is RunState.RUNNING and expires is not None and expires <= now


async def run_agent(
    store: Store,
    settings: Settings,
    agent: str,
    user_input: str,
    *,
    namespace: str = "default",
    session: str | None = None,
    output_schema: dict[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
    observer: Observer | None = None,
    loading: Loading | None = None,
    lease_seconds: float = 30.0,
    bus: Bus | None = None,
    steering: Steering | None = None,
) -> RunRecord:
    """Submit a run and see it through in a runner of its own (see :class:`LocalRunner`)."""
    async with LocalRunner(
        store, settings, observer=observer, loading=loading, lease_seconds=lease_seconds, bus=bus
    ) as runner:
        return await runner.run(
            agent,
            user_input,
            namespace=namespace,
            session=session,
            output_schema=output_schema,
            labels=labels,
            steering=steering,
        )


async def see_through(
    store: Store,
    settings: Settings,
    run_id: str,
    *,
    observer: Observer | None = None,
    loading: Loading | None = None,
    lease_seconds: float = 30.0,
    bus: Bus | None = None,
) -> RunRecord:
    """Execute the run here whenever it is runnable, or follow whoever executes it."""
    async with LocalRunner(
        store, settings, observer=observer, loading=loading, lease_seconds=lease_seconds, bus=bus
    ) as runner:
        return await runner.see_through(run_id)
