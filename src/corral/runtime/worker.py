"""A worker: claims runnable runs with a lease and executes them, up to its concurrency.

Two ways to find work. With the in-process bus the worker claims from the
store whenever it is woken or ``poll_seconds`` pass. With a bus that dispatches
(NATS JetStream) it takes deliveries of announced runs and claims the runs of
each fetch by id, in one transaction, holding each delivery (``in_progress``)
while its run executes. NATS hands runs out in the order they were announced;
the claim restores priority: a due run more urgent than a delivered one is
claimed in its place (the displaced delivery comes again shortly, the urgent
run's own delivery later finds it claimed). The store is then swept only every
``poll_seconds``, the safety net for whatever no message announced: runs
submitted while the bus was down, leases of dead workers that expired, runs
whose retry time came. Either way the claim decides: a delivery
of a run someone else holds or that already ended is only acknowledged.

Shutdown (``stop`` set, e.g. on SIGTERM): the worker stops claiming, gives its
in-flight runs ``grace_seconds`` to finish, then interrupts them and releases
their leases so another worker resumes them at once from their journals.

Failures (:mod:`corral.runtime.health`): a store or bus error in a claim, the
sweep, a lease renewal, the expiry of approvals or the retention prune is
logged, counted and tried again after a jittered backoff; the worker stays up
and reports itself not ready (``health.problem()``) while it cannot claim. An
unexpected error that ends its loop is logged and leaves it not ready for good.

Time (:mod:`corral.core.clock`): the worker, its health, executor and lease
keeper read the time and wait on one clock (a test's fake one advances when the
test says); only the shutdown grace and keeping a delivery alive run on real time.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import anyio

from corral.bus.base import Bus, Delivery
from corral.bus.local import LocalBus
from corral.core.clock import SYSTEM_CLOCK, Clock, move_on_after
from corral.core.ids import new_id
from corral.core.runs import Lease, RunRecord, RunState
from corral.core.settings import Settings
from corral.runtime.agent_tokens import AgentTokenIssuer
from corral.runtime.capabilities import announce_isolation
from corral.runtime.executor import Observer, Outcome, RunExecutor
from corral.runtime.health import TRANSIENT, Operation, WorkerHealth
from corral.runtime.inbox import InboxConsumer
from corral.store.base import Store
from corral.tools.sandbox.host import SandboxHost

log = logging.getLogger(__name__)

PRUNE_INTERVAL_SECONDS = 600.0
#: While runs are queued (the last claim got all it asked for), a busy worker claims again
#: once an eighth of its slots are free, or this long after its last claim: finishing
#: runs are refilled in batches, one claim transaction each.
CLAIM_COALESCE_SECONDS = 0.01
#: how long one fetch of deliveries waits before the worker looks at its state again
TAKE_SECONDS = 1.0
#: when a delivered run could not be claimed for a passing reason, how soon to try again
RETRY_DELIVERY_SECONDS = 0.5
#: how long a stopping worker waits for its interrupted runs to be released
RELEASE_SECONDS = 10.0


def default_owner() -> str:
    """A worker identity that says where it runs: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{new_id('w')[-6:]}"


class Worker:
    """Claims and executes runs until told to stop."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        *,
        concurrency: int = 8,
        lease_seconds: float = 30.0,
        poll_seconds: float = 0.5,
        grace_seconds: float = 30.0,
        retry_base_seconds: float = 1.0,
        owner: str | None = None,
        bus: Bus | None = None,
        observer: Observer | None = None,
        on_error: Callable[[Operation], None] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        tokens: AgentTokenIssuer | None = None,
    ) -> None:
        self.store = store
        self.bus = bus or LocalBus()
        self.owner = owner or default_owner()
        #: what the poll, the sweep, upkeep, backoff and the leases wait on (tests: a fake)
        self.clock = clock
        #: failing operations and readiness; ``on_error`` counts each failure (metrics)
        self.health = WorkerHealth(self.owner, on_error=on_error, clock=clock)
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.poll_seconds = poll_seconds
        self.grace_seconds = grace_seconds
        self.retention_days = settings.run_retention_days
        self._sandbox_host = SandboxHost.from_env(corral_home=settings.home)
        self._next_prune = 0.0
        self._next_expiry = 0.0  # (monotonic) approvals and deadlines: at most once per poll
        self._last_claim = 0.0
        self._claim_batch = max(1, concurrency // 8)
        self._backlog = False
        self.executor = RunExecutor(
            store,
            settings,
            lease_seconds=lease_seconds,
            retry_base_seconds=retry_base_seconds,
            bus=self.bus,
            observer=observer,  # sees every event of the runs this worker executes (metrics)
            health=self.health,
            clock=clock,
            tokens=tokens,
            slots=self,
        )
        self.inbox = InboxConsumer(store, self.bus)
        self.active: dict[str, Lease] = {}
        self._reserved = 0  # slots of deliveries whose claim is under way
        self._bus_quiet = True  # whether the last fetch of deliveries came back empty
        self.executed = 0
        self.released = 0  # runs released unfinished because the worker stopped
        self.swept = 0  # runs claimed by looking in the store
        self.sweeps = 0  # times the store was looked at (dispatched mode)
        self.dispatched = 0  # runs claimed from a bus delivery
        self.taken = 0  # runs claimed by a run of this worker (a child, a woken parent)
        self.unclaimed = 0  # deliveries whose run was another's, ended, or not due
        self._wake = anyio.Event()
        self._idle = anyio.Event()
        self._shutdown = anyio.Event()
        self._stopping: anyio.Event | None = None
        self._until_idle = False
        self._runs: anyio.abc.TaskGroup | None = None  # where executions run, while serving
        # child runs started here, until their parent took them (ended) or no longer
        # executes here (_child_ended, _forget_children_of)
        self._children: dict[str, _LocalChild] = {}

    def wake(self) -> None:
        """Look for work now instead of at the next poll (used after an in-process submit)."""
        self._wake.set()

    async def serve(self, stop: anyio.Event, *, until_idle: bool = False) -> None:
        """Claim and execute runs until ``stop`` is set (or, with ``until_idle``, none are left).

        Store and bus failures do not end it (they are retried); any other exception
        does, after ``health`` recorded it (the worker is then not ready).
        """
        try:
            await announce_isolation(self._sandbox_host)
            await self._serve(stop, until_idle)
        except Exception as exc:
            self.health.crash(exc)
            raise

    async def _serve(self, stop: anyio.Event, until_idle: bool) -> None:
        self._stopping = stop
        self._until_idle = until_idle
        async with self.executor, anyio.create_task_group() as group:
            self._runs = group
            async with anyio.create_task_group() as background:
                # Upkeep in a task of its own: a store stuck on it must not hold up claims
                # (with ``until_idle`` it goes before each claim, so a drain sees its effect).
                if not until_idle:
                    background.start_soon(self._upkeep_forever)
                if self.bus.delivers_messages and self.bus.dispatches and not until_idle:
                    # agent messages of system runs, published by their coordinators
                    background.start_soon(self.inbox.serve, stop)
                if self.bus.dispatches and not until_idle:
                    await self._serve_dispatched(stop, group)
                while not stop.is_set():
                    if until_idle:
                        await self._upkeep()
                    ended = self.executed
                    claimed = await self._claim(group, "claim")
                    # (a run that ended during the claim may have queued another, committed
                    # after the claim looked: look again before calling it idle)
                    idle = not claimed and not self.active and self.executed == ended
                    if until_idle and idle and self.health.due("claim"):
                        break
                    # (a claim that got fewer runs than it asked for left none due: what
                    # comes next is announced, or found by the next look)
                    if not claimed or not self._backlog:
                        await self._idle_wait(stop)
                background.cancel_scope.cancel()
            await self._drain()
        self._runs = None
        if self.bus.dispatches:
            log.info(
                "worker %s: %d runs taken from bus deliveries, %d found by the store sweep, "
                "%d claimed by its own runs; %d deliveries claimed nothing",
                self.owner,
                self.dispatched,
                self.swept,
                self.taken,
                self.unclaimed,
            )

    def _free(self) -> int:
        return self.concurrency - len(self.active) - self._reserved

    # ChildSlots (corral.runtime.delegation): a child run claimed as it is submitted
    def reserve(self) -> tuple[str, float] | None:
        stopping = self._stopping is None or self._stopping.is_set()
        if stopping or self._runs is None or self._free() <= 0:
            return None
        self._reserved += 1
        return self.owner, self.lease_seconds

    def release(self) -> None:
        self._reserved -= 1
        self._wake.set()  # (a worker that found no free slot may take work again)

    def start(self, record: RunRecord, lease: Lease) -> None:
        assert self._runs is not None  # (reserve said so, and a run of this worker asks)
        assert record.parent_run_id is not None  # (a child run)
        self._reserved -= 1
        self.taken += 1
        self.active[record.id] = lease
        self._children[record.id] = _LocalChild(record.parent_run_id)
        self._runs.start_soon(self._execute, record, lease)

    async def ended(self, run_ids: Sequence[str], seconds: float) -> dict[str, RunRecord]:
        children = [self._children.get(run_id) for run_id in run_ids]
        if any(child is None for child in children):
            return {}  # (at once: the parent parks for that one anyway)
        ended: dict[str, RunRecord] = {}
        # (real time, whatever the clock: this only spares a park, it decides nothing)
        with anyio.move_on_after(seconds):
            for run_id, child in zip(run_ids, children, strict=True):
                assert child is not None
                await child.done.wait()
                self._children.pop(run_id, None)  # (taken: its parent asks for it once)
                if child.record is not None:
                    ended[run_id] = child.record
        return ended

    def _child_ended(self, run_id: str, child: _LocalChild) -> None:
        """A child started here ended: keep it for its parent while the parent executes
        here (it may ask only once its step's other calls are done), else forget it."""
        child.done.set()
        if child.parent_run_id not in self.active:
            self._children.pop(run_id, None)

    def _forget_children_of(self, run_id: str) -> None:
        """An execution of run ``run_id`` ended: the children it did not ask for are
        forgotten once they end (those still running, by :meth:`_child_ended`)."""
        for child_id, child in list(self._children.items()):
            if child.parent_run_id == run_id and child.done.is_set():
                del self._children[child_id]

    async def _idle_wait(self, stop: anyio.Event) -> None:
        """Until there may be work: stop, a freed slot, a bus announcement, or the poll."""
        # The poll is timed by the clock; the bus only wakes the worker early.
        with move_on_after(self.clock, self._next_look()):
            await _first_of(stop.wait, self._wake.wait, lambda: self.bus.wait_runnable(math.inf))
        self._wake = anyio.Event()

    async def _claim(
        self, group: anyio.abc.TaskGroup, operation: Operation, *, expired_only: bool = False
    ) -> int:
        """Claim what the free slots can take from the store (``expired_only``: only runs
        whose lease expired); 0 when that failed (backing off)."""
        free = self._free()
        if free <= 0 or self._coalescing(free) or not self.health.due(operation):
            return 0
        self._last_claim = self.clock.monotonic()
        claims: list[tuple[RunRecord, Lease]] = []
        with self.health.attempt(operation):
            claims = await self.store.claim_runs(
                self.owner,
                self.lease_seconds,
                free,
                now=self.clock.now(),
                expired_only=expired_only,
            )
        # A child run of this worker may have taken a slot while the claim was under way
        # (see reserve): the least urgent claims beyond the slots left go back.
        over = len(claims) - max(self._free(), 0)
        back = claims[len(claims) - over :] if over > 0 else []
        claims = claims[: len(claims) - len(back)]
        # The kept runs hold their slots before the give-back waits on the store: a child
        # or a delivery asking meanwhile must not find them free.
        for record, lease in claims:
            self.active[record.id] = lease
            group.start_soon(self._execute, record, lease)
        if back:
            await self._give_back(back)
        self.swept += len(claims)
        self._backlog = len(claims) == free
        return len(claims)

    async def _give_back(self, claims: Sequence[tuple[RunRecord, Lease]]) -> None:
        """Release runs claimed for slots that are gone, their attempt refunded (one whose
        attempts are exhausted is not refunded: its next claimer ends it), and announce
        them as any released run is: a run whose lease had expired was never announced,
        and a queued one's delivery may have been settled as another's meanwhile; queued
        again, only a sweep of queued runs would find it, which a busy bus puts off."""
        for record, lease in claims:
            try:
                await self.store.release_run(lease, refund_attempt=not lease.exhausted)
            except TRANSIENT as exc:
                log.warning("run %s: not given back (%s): its lease expires", record.id, exc)
                continue
            try:
                await self.executor.announce_released(lease)
            except TRANSIENT as exc:
                log.warning("run %s: given back, not announced (%s)", record.id, exc)

    def _coalescing(self, free: int) -> bool:
        """Whether to wait for more free slots before claiming (see CLAIM_COALESCE_SECONDS)."""
        if not (self._backlog and self.active) or free >= self._claim_batch:
            return False
        return self.clock.monotonic() - self._last_claim < CLAIM_COALESCE_SECONDS

    def _next_look(self) -> float:
        """How long to wait for a wake-up before looking for work again."""
        if not self.health.due("claim"):  # backing off (a wake-up finds the claim not due)
            return max(self.poll_seconds, self.health.wait_seconds("claim"))
        free = self._free()
        if self._backlog and self.active and 0 < free < self._claim_batch:
            return min(self.poll_seconds, CLAIM_COALESCE_SECONDS)
        return self.poll_seconds

    async def _upkeep_forever(self) -> None:
        while True:
            started = self.clock.monotonic()
            self._next_expiry = 0.0  # this loop's own pace is the limit here
            await self._upkeep()
            # Paced from the start of the round: time that passed meanwhile counts (on a
            # test's fake clock too, advanced while the round ran).
            await self.clock.sleep(self.poll_seconds - (self.clock.monotonic() - started))

    async def _upkeep(self) -> None:
        """Expire approvals and queue system runs past their deadline, at most once per
        ``poll_seconds`` (with ``until_idle`` upkeep comes before every claim, many a
        second, and these writes nearly always find nothing), and apply the retention
        setting when it is due."""
        now = self.clock.monotonic()
        if now >= self._next_expiry:
            self._next_expiry = now + self.poll_seconds
            await self._expire_approvals()
            await self._queue_overdue()
        await self._prune()

    async def _expire_approvals(self) -> None:
        """Expire the approvals past their deadline, and announce the runs that queued:
        a dispatching bus hands them to a worker now, not at some worker's next sweep.
        The approval's id is the mark, as for a decision (an approval is decided or
        expires, never both)."""
        if not self.health.due("approvals"):
            return
        with self.health.attempt("approvals"):
            for approval in await self.store.expire_approvals(now=self.clock.now()):
                await self.bus.announce_runnable([approval.run_id], mark=approval.id)

    async def _queue_overdue(self) -> None:
        """Queue the system runs parked past their ``timeout_seconds`` (a node run hangs,
        so no node's end wakes them) and announce them: their coordinator fails them and
        cancels their node runs. Any worker's upkeep may do it (the store queues each run
        once); the mark is the claim the run parked under (each parking is woken once)."""
        if not self.health.due("deadlines"):
            return
        with self.health.attempt("deadlines"):
            for run_id, token in await self.store.queue_overdue_runs(now=self.clock.now()):
                await self.bus.announce_runnable([run_id], mark=f"overdue:{token}")

    async def _prune(self) -> None:
        """Apply the retention setting, at most every PRUNE_INTERVAL_SECONDS."""
        now = self.clock.now()
        if self.retention_days is None or now < self._next_prune:
            return
        if not self.health.due("retention"):
            return
        pruned = 0
        with self.health.attempt("retention"):
            pruned = await self.store.prune_runs(finished_before=now - self.retention_days * 86400)
            self._next_prune = now + PRUNE_INTERVAL_SECONDS  # else again after the backoff
        if pruned:
            log.info("pruned %d finished runs older than %g days", pruned, self.retention_days)

    async def _execute(self, record: RunRecord, lease: Lease) -> Outcome | None:
        """Execute a claimed run, then any run its save woke and claimed for this worker
        (a parent whose last child it was: see ``RunExecutor.execute``), in the same
        slot; the first run's outcome, or ``None`` when the worker failed it."""
        woken: list[tuple[RunRecord, Lease]] = []

        def take(run: RunRecord, run_lease: Lease) -> None:
            self.active[run.id] = run_lease  # (its slot: the one this run frees)
            self.taken += 1
            woken.append((run, run_lease))

        outcome = await self._execute_one(record, lease, take)
        while woken:
            record, lease = woken.pop()
            await self._execute_one(record, lease, take)
        return outcome

    async def _execute_one(
        self, record: RunRecord, lease: Lease, take: Callable[[RunRecord, Lease], None]
    ) -> Outcome | None:
        started = self.clock.monotonic()
        log.debug(
            "run %s (agent %s): attempt %d/%d",
            record.id,
            record.agent,
            record.attempts,
            record.max_attempts,
        )
        child = self._children.get(record.id)
        if child is not None and child.done.is_set():
            child = None  # (an execution of it that ended, kept for its parent: not this one)
        try:
            # A stopping worker takes no woken run into its slot (an execution that began
            # before the stop still may: one more turn, within the grace like the rest).
            stopping = self._stopping is not None and self._stopping.is_set()
            outcome = await self.executor.execute(
                record, lease, self._shutdown, on_woken=None if stopping else take
            )
            if child is not None and outcome == "done" and record.state.finished:
                child.record = record  # as saved (see RunExecutor._save)
            log.info("%s", self._ended(record, outcome, self.clock.monotonic() - started))
            if outcome == "released" and self._shutdown.is_set():
                self.released += 1
            return outcome
        except TRANSIENT as exc:
            # The lease is left to expire: another worker (or this one) resumes the run.
            log.warning(
                "run %s (agent %s): stopped after %s: %s (its lease will expire)",
                record.id,
                record.agent,
                _seconds_text(self.clock.monotonic() - started),
                exc.message,
            )
            return None
        except Exception:
            log.exception("run %s failed in the worker", record.id)
            return None
        finally:
            # (only this claim's entry: a run that parked and was queued again at once may
            # already be claimed anew, and that execution is active now)
            if self.active.get(record.id) is lease:
                del self.active[record.id]
                self._forget_children_of(record.id)
            if child is not None:
                self._child_ended(record.id, child)
            self.executed += 1
            # A freed slot is news to a worker that had none free or claimed all it could
            # (more may be queued), and to a drain looking for its end; so is the end of a
            # run of an agent at max_concurrent_runs (its queued runs, left out of the last
            # claim, may fit now); other work that comes is announced (a parent this run
            # queued, too: see RunExecutor._save).
            if (
                self._until_idle
                or self._backlog
                or self._free() <= 1
                or (record.namespace, record.agent) in self.executor.limited_agents
            ):
                self._wake.set()
            if not self.active:
                self._idle.set()

    def _ended(self, record: RunRecord, outcome: Outcome, took: float) -> str:
        """The log line of an executed run: agent, what came of it, and how long it took."""
        head = f"run {record.id} (agent {record.agent}):"
        if outcome == "lost":
            return f"{head} lease lost after {_seconds_text(took)} (another worker holds the run)"
        if outcome == "released":
            why = (
                "the worker is stopping; another worker resumes it from its journal"
                if self._shutdown.is_set()
                else "the attempt failed; it is retried after a backoff"
            )
            return f"{head} released after {_seconds_text(took)} ({why})"
        line = f"{head} {record.state.value} in {_seconds_text(took)}, {record.steps} step(s)"
        if record.state is RunState.WAITING_APPROVAL:
            waiting = len(record.pending_approvals)
            line += f", {waiting} call(s) wait for approval"
        elif record.state is RunState.WAITING_CHILDREN:
            line += ", waits for its child runs"
        elif record.error and record.state is not RunState.SUCCEEDED:
            line += f": {record.error.get('code', 'error')}: {record.error.get('message', '')}"
        return line

    # ----------------------------------------------------------------- dispatched runs

    async def _serve_dispatched(self, stop: anyio.Event, group: anyio.abc.TaskGroup) -> None:
        """Take deliveries until ``stop``; sweep the store every ``poll_seconds`` meanwhile.

        The sweep claims queued runs only while the bus has nothing for this worker (its
        last fetch came back empty): with a backlog of announced runs, runs claimed by the
        sweep would turn their deliveries into wasted claims on the other workers. Runs
        whose lease expired are claimed either way: a run claimed where it was submitted
        (a child on its parent's worker) or woken (a parent its last child's save claimed)
        was never announced, so no delivery comes back for it when its worker dies.
        """
        async with anyio.create_task_group() as loops:
            loops.start_soon(self._take_deliveries, stop, group)
            while not stop.is_set():
                started = self.clock.monotonic()
                await self._claim(group, "sweep", expired_only=not self._bus_quiet)
                self.sweeps += 1
                # paced from the sweep's start, as upkeep is
                poll = self.poll_seconds - (self.clock.monotonic() - started)
                with move_on_after(self.clock, max(poll, self.health.wait_seconds("sweep"))):
                    await stop.wait()
            loops.cancel_scope.cancel()

    async def _take_deliveries(self, stop: anyio.Event, group: anyio.abc.TaskGroup) -> None:
        while not stop.is_set():
            free = self._free()
            if free <= 0:
                await self._wake.wait()  # set when a run of this worker ends
                self._wake = anyio.Event()
                continue
            deliveries = await self.bus.take_runnable(free, TAKE_SECONDS)
            self._bus_quiet = not deliveries
            # A child run may have taken a slot while the fetch waited (see reserve): a
            # run delivered for that slot goes back, to this worker or another.
            room = max(self._free(), 0)
            for delivery in deliveries[room:]:
                await _redeliver_after(delivery, 0.0)
            deliveries = deliveries[:room]
            if deliveries:
                self._reserved += len(deliveries)
                group.start_soon(self._claim_delivered, deliveries, stop, group)

    async def _claim_delivered(
        self, deliveries: list[Delivery], stop: anyio.Event, group: anyio.abc.TaskGroup
    ) -> None:
        """Claim the delivered runs in one transaction; execute each, holding its delivery."""
        started = 0
        unclaimed: list[Delivery] = []
        try:
            if stop.is_set():
                for delivery in deliveries:
                    await delivery.nak()  # for a worker that is not stopping
                return
            by_run = {delivery.run_id: delivery for delivery in deliveries}
            try:
                # A due run more urgent than those delivered goes first: NATS hands runs
                # out in the order they were announced, the store knows their priority.
                claims = await self.store.claim_runs(
                    self.owner,
                    self.lease_seconds,
                    len(by_run),
                    now=self.clock.now(),
                    run_ids=list(by_run),
                    or_higher_priority=True,
                )
            except TRANSIENT as exc:
                delay = self.health.failed("claim", exc)
                for delivery in deliveries:
                    await _redeliver_after(delivery, max(delay, RETRY_DELIVERY_SECONDS))
                return
            self.health.succeeded("claim")
            used: set[int] = set()
            for record, lease in claims:  # highest priority first
                self.active[record.id] = lease
                held = by_run.get(record.id)
                if held is None:  # more urgent than a delivered run: its own delivery
                    group.start_soon(self._execute, record, lease)  # will find it claimed
                    continue
                used.add(id(held))
                group.start_soon(self._dispatched, held, record, lease)
            started = len(claims)
            self.dispatched += started
            # (A run delivered twice in one batch, for two changes: one copy claims it.)
            unclaimed = [d for d in deliveries if id(d) not in used]
        finally:
            self._reserved -= len(deliveries)
            if started < len(deliveries):
                self._wake.set()  # slots are free again: a full worker may take more
        for delivery in unclaimed:
            self.unclaimed += 1
            await self._settle_unclaimed(delivery)

    async def _dispatched(self, delivery: Delivery, record: RunRecord, lease: Lease) -> None:
        """Execute a run claimed from ``delivery``, keeping the delivery in progress."""
        async with anyio.create_task_group() as keep:
            keep.start_soon(_keep_in_progress, delivery, self.bus.ack_wait_seconds / 3)
            outcome = await self._execute(record, lease)
            keep.cancel_scope.cancel()
        if outcome is None:  # failed in the worker: come back when its lease has expired
            await _redeliver_after(delivery, self.lease_seconds)
        else:  # ended, paused, released (and announced anew) or lost to another worker
            await delivery.ack()

    async def _settle_unclaimed(self, delivery: Delivery) -> None:
        """A delivered run this worker could not claim: the store says what it needs."""
        try:
            record = await self.store.get_run(delivery.run_id)
        except TRANSIENT as exc:
            delay = self.health.failed("claim", exc)
            await _redeliver_after(delivery, max(delay, RETRY_DELIVERY_SECONDS))
            return
        now = self.clock.now()
        if record is None or record.state not in (RunState.QUEUED, RunState.RUNNING):
            await delivery.ack()  # gone, ended, cancelled or waiting for a human
        elif record.state is RunState.QUEUED and record.not_before > now:
            await _redeliver_after(delivery, record.not_before - now)  # a retry's backoff, a delay
        elif record.state is RunState.QUEUED:
            # Due but not claimed: its Agent is at max_concurrent_runs, a more urgent
            # run took its place, or a write in flight held its row. Again later,
            # backing off; the sweep has it after the last delivery.
            await _redeliver_after(delivery, RETRY_DELIVERY_SECONDS * 2 ** (delivery.attempt - 1))
        else:
            expires = record.lease_expires_at or now
            if delivery.attempt > 1 and record.lease_owner != self.owner:
                # Delivered again: the worker that had it went silent, and the lease is
                # probably its own. Come back when that lease has expired rather than
                # leave the run to the next sweep. (If a live worker holds it, this
                # repeats once per lease until the last delivery, which is acked.)
                await _redeliver_after(delivery, max(expires - now, 0.0) + RETRY_DELIVERY_SECONDS)
            else:
                await delivery.ack()  # another worker holds it: its lease is the guarantee

    async def _drain(self) -> None:
        # Real time, whatever the clock: a stopping worker ends within its grace.
        self._idle = anyio.Event()
        if self.active:
            log.info(
                "worker %s stopping: draining %d runs (up to %g s)",
                self.owner,
                len(self.active),
                self.grace_seconds,
            )
            with anyio.move_on_after(self.grace_seconds):
                await self._idle.wait()
        if self.active:
            log.warning("releasing %d unfinished runs", len(self.active))
            self._shutdown.set()
            with anyio.move_on_after(RELEASE_SECONDS):
                await self._idle.wait()
            if self.active:
                log.warning(
                    "%d runs did not stop within %g s: their leases expire and another "
                    "worker resumes them",
                    len(self.active),
                    RELEASE_SECONDS,
                )
        log.info(
            "worker %s stopped: %d runs executed, %d released to other workers",
            self.owner,
            self.executed,
            self.released,
        )


@dataclass
class _LocalChild:
    """A child run started in this worker: set ``done`` when its execution ends, with
    the run as saved when that ended it (``record``; else ``None``: parked, lost, failed)."""

    parent_run_id: str
    done: anyio.Event = field(default_factory=anyio.Event)
    record: RunRecord | None = None


def _seconds_text(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.0f} s"


async def _redeliver_after(delivery: Delivery, delay: float) -> None:
    """Have the run delivered again after ``delay``; the last delivery is acked instead
    (a nak would dead-letter it), leaving the run to the store sweep."""
    if delivery.last:
        await delivery.ack()
    else:
        await delivery.nak(delay)


async def _keep_in_progress(delivery: Delivery, every: float) -> None:
    """Tell the bus the delivery is being worked on, so it is not delivered again
    (real time, whatever the worker's clock: the bus's ack wait runs on it)."""
    while True:
        await anyio.sleep(every)
        await delivery.in_progress()


async def _first_of(*waits: Callable[[], Awaitable[object]]) -> None:
    """Return as soon as the first of ``waits`` returns (the others are cancelled)."""
    async with anyio.create_task_group() as group:

        async def wait(until: Callable[[], Awaitable[object]]) -> None:
            await until()
            group.cancel_scope.cancel()

        for until in waits:
            group.start_soon(wait, until)
