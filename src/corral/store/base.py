"""The Store interface: resources, runs and run events, behind one abstract class.

Every backend (SQLite now, PostgreSQL next) implements :class:`Store`.
Backends convert their driver's exceptions at this boundary: callers only
ever see :class:`~corral.core.errors.CorralError` subclasses, namely
:class:`StoreError` when the database itself fails (locked, full, unreadable),
``NotFoundError``/``ConflictError`` when an operation contradicts stored state,
and ``ResourceError`` when an applied batch is invalid. A failed operation
leaves nothing behind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType
from typing import Any, Self

from corral.core.agent_messages import AgentMessage, MessageState
from corral.core.errors import BudgetExceededError, CorralError
from corral.core.events import Event
from corral.core.memory import MemoryEntry, MemoryHit, MemoryPlace, MemoryStats, MemoryVector
from corral.core.messages import Message, Usage
from corral.core.runs import Approval, Lease, RunRecord, RunState
from corral.core.selectors import Selector
from corral.core.sessions import Session, SessionMessage
from corral.core.tokens import ApiToken
from corral.resources.kinds import Resource
from corral.resources.loader import LoadedResource


class StoreError(CorralError):
    """The database could not complete an operation (locked, full, unreachable, corrupt)."""

    code = "store_error"


class ApplyAction(StrEnum):
    """What applying one resource did."""

    CREATED = "created"
    CONFIGURED = "configured"
    UNCHANGED = "unchanged"


@dataclass(frozen=True)
class ApplyOutcome:
    """The result of applying one resource."""

    namespace: str
    kind: str
    name: str
    action: ApplyAction
    generation: int


@dataclass(frozen=True)
class RunCounts:
    """Runs per (namespace, state), and queued runs already due (the queue depth)."""

    by_state: dict[tuple[str, RunState], int]
    due: int


@dataclass(frozen=True)
class Submitted:
    """What :meth:`Store.submit_agent_run` did: the run as stored, whether it is new (not
    an earlier run with the same idempotency key), and its lease when it was claimed too."""

    record: RunRecord
    created: bool
    lease: Lease | None = None


#: what a child run holds of an :class:`Allowance`, as the store reads it: its idempotency
#: key, state, caps (``max_cost_usd``, ``max_tokens``), spend (``cost_usd``, ``usage``)
Holder = tuple[str | None, RunState, float | None, int | None, float, Usage]


@dataclass(frozen=True)
class Allowance:
    """What the child runs of one parent whose idempotency keys begin with ``group`` share
    (those one agent token started, the node runs of a system run): together at most
    ``cost_usd`` and ``tokens`` (``None``: no limit). A new one is capped at what the others
    leave - a finished one holds what it spent, one not finished its own caps (all of which
    it may spend) - split evenly between the children about to start: the new one and
    those of ``waiting`` (their idempotency keys: the messages of a system waiting for
    their node runs) not started yet, so that none of them is starved by the first."""

    group: str
    cost_usd: float | None = None
    tokens: int | None = None
    waiting: frozenset[str] = frozenset()

    #: refuse a new child that what the others hold leaves nothing of a limit (see
    #: :meth:`caps`): an agent token's children (a system's node runs are started capped
    #: at nothing instead, as their messages come)
    refuses_when_spent: bool = False
    #: who may spend the allowance, as its refusal names it
    spender: str = "this agent token"

    def left(self, key: str, others: Sequence[Holder]) -> tuple[float | None, int | None]:
        """The caps of a new child of idempotency key ``key``, given what the others hold."""
        ways = len((self.waiting - {k for k, *_ in others if k is not None}) | {key})
        cost = tokens = None
        if self.cost_usd is not None:
            held = sum(
                spent if state.finished else (cap or 0.0) for _, state, cap, _, spent, _ in others
            )
            cost = max(self.cost_usd - held, 0.0) / ways
        if self.tokens is not None:
            held_tokens = sum(
                used.total_tokens if state.finished else (cap or 0)
                for _, state, _, cap, _, used in others
            )
            tokens = max(self.tokens - held_tokens, 0) // ways
        return cost, tokens

    def caps(self, key: str, others: Sequence[Holder]) -> tuple[float | None, int | None]:
        """:meth:`left`; with :attr:`refuses_when_spent`, ``BudgetExceededError`` when that
        leaves the new child nothing of a limit and no other holds ``key`` (a retry finds
        its child): a child capped at nothing still takes a model turn before its limit is
        checked, so a token whose allowance is spent could start any number of them, each
        one paid for."""
        cost, tokens = self.left(key, others)
        if not self.refuses_when_spent or any(held == key for held, *_ in others):
            return cost, tokens
        if cost is not None and cost <= 0.0:
            raise BudgetExceededError(
                "max_cost_usd",
                f"{self.spender} may spend ${self.cost_usd:.6f} (max_cost_usd), and its child "
                "runs hold or spent all of it: no child run starts",
            )
        if tokens is not None and tokens <= 0:
            raise BudgetExceededError(
                "max_tokens",
                f"{self.spender} may use {self.tokens} tokens (max_tokens), and its child runs "
                "hold or used all of them: no child run starts",
            )
        return cost, tokens


@dataclass(frozen=True)
class WokenRun:
    """The run a :meth:`Store.save_run` queued (a finished child's parent, or the run
    itself parked for children that all finished meanwhile), and, when the save claimed
    it too (``claim_woken``), the run as claimed and its lease."""

    run_id: str
    record: RunRecord | None = None
    lease: Lease | None = None


@dataclass(frozen=True)
class StoredResource:
    """A resource as stored: ``generation`` counts its configurations, starting at 1."""

    resource: Resource
    generation: int
    created_at: float
    updated_at: float


class Store(ABC):
    """Durable state of Corral. All methods are safe to call concurrently."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @abstractmethod
    async def close(self) -> None:
        """Release connections; the store is unusable afterwards."""

    # ----------------------------------------------------------------- resources

    @abstractmethod
    async def apply(
        self, batch: Sequence[Resource | LoadedResource], *, dry_run: bool = False
    ) -> list[ApplyOutcome]:
        """Create or update every resource of ``batch`` in one transaction.

        References are checked against the batch and the stored resources;
        any problem raises ``ResourceError`` and stores nothing. Secret values
        are encrypted before they are stored. Outcomes follow the batch order.
        With ``dry_run`` every check is made and the outcomes say what applying
        would do (the generation it would reach), but nothing is written.
        """

    @abstractmethod
    async def get_resource(self, namespace: str, kind: str, name: str) -> StoredResource | None:
        """One resource, or ``None``."""

    @abstractmethod
    async def list_resources(
        self,
        namespace: str | None,
        kind: str | None = None,
        *,
        selector: Selector | None = None,
        limit: int | None = None,
        after: tuple[str, ...] | None = None,
    ) -> list[StoredResource]:
        """The resources of a namespace (of one kind, whose labels meet ``selector``, when
        given), ordered by kind and name; ``namespace=None``: of every namespace, ordered
        by namespace, kind and name.

        A page of them: at most ``limit``, those after the keyset ``after`` =
        ``(kind, name)`` (``(namespace, kind, name)`` across namespaces), the last of
        the previous page, when given.
        """

    async def resources_fingerprint(self, namespace: str) -> tuple[int, int, float]:
        """A value that changes whenever a resource of ``namespace`` is applied or deleted.

        ``(count, sum of generations, latest update)``: a worker compares it with
        the one its cached live agents were built from, one cheap read instead of
        reading and validating every resource an agent refers to. Backends
        override this with a single aggregate query.
        """
        items = await self.list_resources(namespace)
        return (
            len(items),
            sum(item.generation for item in items),
            max((item.updated_at for item in items), default=0.0),
        )

    async def delete_resource(self, namespace: str, kind: str, name: str) -> None:
        """Delete a resource (a Memory with its entries, in the same transaction).

        ``NotFoundError`` when it does not exist; ``ConflictError`` naming the
        referrers when another resource references it.
        """
        await self.delete_resources(namespace, [(kind, name)])

    @abstractmethod
    async def delete_resources(self, namespace: str, keys: Sequence[tuple[str, str]]) -> None:
        """Delete several resources of one namespace, ``(kind, name)`` each, in one
        transaction: all or none. References among them do not hold them back (two
        agents that link each other go together); ``ConflictError`` naming the referrers
        when a resource not among them references one, ``NotFoundError`` when one does
        not exist."""

    # ----------------------------------------------------------------- runs

    @abstractmethod
    async def save_run(
        self,
        record: RunRecord,
        lease: Lease | None = None,
        approvals: Sequence[Approval] = (),
        session_messages: Sequence[Message] = (),
        events: Sequence[Event] = (),
        claim_woken: tuple[str, float] | None = None,
    ) -> WokenRun | None:
        """Overwrite a stored run with ``record``; ``NotFoundError`` when it does not exist.

        ``events`` of the run are appended in the same transaction (a run's last
        events and its final state are one commit).

        With ``lease`` the write is fenced: ``LeaseLostError`` (and nothing
        written) unless the run's fencing token still equals ``lease.token``.
        When ``record.state`` is no longer ``running`` the lease columns are
        cleared. ``approvals`` are inserted in the same transaction (a run that
        goes to ``waiting_approval`` stores its pending approvals atomically), and so are
        ``session_messages``, appended to the session ``record.session_id`` of the run's
        namespace (a finished run and its session never disagree). ``cancel_requested`` is only ever raised by a save, never
        cleared (the flag belongs to ``request_cancel``).

        Child runs: a save that finishes a child queues its parent in the same
        transaction when the parent is ``waiting_children`` and this was its last
        unfinished child; a save into ``waiting_children`` queues the run itself when
        its children all finished meanwhile (the record still says waiting). The run
        such a save queued is returned (:class:`WokenRun`; ``None``: it queued none, and
        nobody need be told of it). With ``claim_woken=(owner, lease_seconds)`` it is
        claimed for ``owner`` in the same transaction (as :meth:`claim_runs` would,
        agent limits included) and returned with its lease: a worker goes on with a
        parent in the slot its last child frees, without a claim of its own.
        The lease columns of ``record`` itself are ignored: only claims,
        renewals and releases change them.
        """

    @abstractmethod
    async def get_run(self, run_id: str) -> RunRecord | None:
        """One run, or ``None``."""

    @abstractmethod
    async def list_runs(
        self,
        namespace: str,
        agent: str | None = None,
        limit: int = 50,
        states: Sequence[RunState] | None = None,
        *,
        before: tuple[float, str] | None = None,
        selector: Selector | None = None,
        session: str | None = None,
        status_since: float | None = None,
    ) -> list[RunRecord]:
        """The newest runs of a namespace (of one agent, in some states, whose labels match
        ``selector``, of one session, whose :attr:`~RunRecord.status_at` is at or after
        ``status_since``, when given), newest first.

        ``before`` is a keyset cursor ``(created_at, id)``: only runs that sort after
        it (older, or as old with a smaller id) are listed, so the next page of a
        listing starts at the last run of the previous one and no run is seen twice.
        """

    @abstractmethod
    async def count_matching_runs(
        self,
        namespace: str,
        agent: str | None = None,
        states: Sequence[RunState] | None = None,
        *,
        selector: Selector | None = None,
        session: str | None = None,
        status_since: float | None = None,
    ) -> int:
        """How many runs :meth:`list_runs` would list with these filters, on all its pages:
        one ``COUNT`` over the same conditions."""

    @abstractmethod
    async def list_children(
        self, run_id: str, *, ids: Sequence[str] | None = None
    ) -> list[RunRecord]:
        """The child runs of a run (those its ``agents_exec`` calls started), oldest first;
        only those among ``ids`` when given."""

    @abstractmethod
    async def count_runs(self, *, now: float | None = None) -> RunCounts:
        """How many runs are in each state, and how many queued runs are due by ``now``."""

    # ----------------------------------------------------------------- tasks and leases

    @abstractmethod
    async def submit_run(self, record: RunRecord) -> tuple[RunRecord, bool]:
        """Store a new queued run and return ``(record, True)``.

        When ``record.idempotency_key`` is set and a run with the same key exists
        for the same namespace and agent, nothing is stored and the existing run
        is returned with ``False`` - also when many submits race (a unique index
        decides, not a read-then-write).
        """

    @abstractmethod
    async def submit_agent_run(
        self,
        record: RunRecord,
        *,
        claim_for: tuple[str, float] | None = None,
        allowance: Allowance | None = None,
    ) -> Submitted:
        """Queue a run of a stored Agent: ``submit_run`` with the Agent's ``max_attempts``.

        ``NotFoundError`` (nothing stored) when the record's namespace has no such
        Agent; ``record.max_attempts`` is set from it. The run's session, when it has
        one, is opened (created if new; ``ConflictError`` when it belongs to another
        agent). A child run (``parent_run_id`` set) is refused in the same transaction
        when its parent is gone (``NotFoundError``), has finished or has a cancel
        requested (``ConflictError``): a parent read before a cancel never gets a child
        started after it. With ``claim_for=(owner, lease_seconds)`` a new run that is due is
        also claimed for ``owner`` (``corral run`` executes the run it submits):
        :attr:`Submitted.lease` is set then, and the record is the claimed one.
        With ``allowance`` (a child run), the record's ``max_cost_usd``/``max_tokens`` are
        set to what the allowance's other children leave, read in the same transaction
        (siblings submitted at once are capped one after the other: together they never
        get more than the allowance); with :attr:`Allowance.refuses_when_spent`, a new
        child they leave nothing of a limit is refused (``BudgetExceededError``, see
        :meth:`Allowance.caps`).
        A store reads the Agent, opens the session, stores the run and claims it in
        one transaction where it can (one commit where there would be two).
        """

    @abstractmethod
    async def claim_runs(
        self,
        owner: str,
        lease_seconds: float,
        limit: int = 1,
        *,
        now: float | None = None,
        run_ids: Sequence[str] | None = None,
        or_higher_priority: bool = False,
        expired_only: bool = False,
    ) -> list[tuple[RunRecord, Lease]]:
        """Claim up to ``limit`` runnable runs for ``owner``, highest priority then oldest first
        (only among ``run_ids`` when given: ``corral run`` claims its own run, a worker
        the runs a bus delivered to it).

        ``or_higher_priority`` (with ``run_ids``): any other runnable run whose priority
        is higher than the lowest among the claimable ``run_ids`` competes with them,
        so a worker handed runs by a first-in-first-out bus still starts a more urgent
        run first. Nothing is claimed when none of ``run_ids`` is claimable.
        ``expired_only``: only runs whose lease expired (a dispatched worker's sweep while
        the bus has deliveries: a run claimed where it was submitted or woken has none).

        Runnable: ``queued`` with ``not_before <= now``, or ``running`` with a lease
        that expired before ``now`` (its worker died or stalled). Each claim sets
        state ``running``, the owner, ``lease_expires_at = now + lease_seconds``,
        increments ``attempts`` (never past ``max_attempts``: a run that has used them
        all gets a lease with ``exhausted`` set, for its claimer to end it) and the
        fencing token, and sets ``started_at`` if unset. Two concurrent claimers never
        get the same run.
        """

    @abstractmethod
    async def renew_lease(self, lease: Lease, lease_seconds: float) -> tuple[Lease, bool]:
        """Extend a lease; returns the new lease and whether cancellation was requested.

        ``LeaseLostError`` when the run's fencing token is no longer ``lease.token``.
        """

    @abstractmethod
    async def release_run(
        self, lease: Lease, *, not_before: float = 0.0, refund_attempt: bool = False
    ) -> None:
        """Give a claimed run back: state ``queued``, lease cleared, runnable from ``not_before``.

        Fenced like ``save_run``. Used on shutdown and for retries with backoff.
        ``refund_attempt`` (a worker's shutdown, not a failure) takes back the attempt
        the claim counted, in the same write (never below 0).
        """

    @abstractmethod
    async def request_cancel(self, run_id: str) -> RunRecord:
        """Cancel a run: a ``queued`` or parked (``waiting_approval``, ``waiting_children``)
        run becomes ``cancelled`` at once (its pending approvals expire); a ``running`` one
        gets ``cancel_requested`` for its worker to act on. Its unfinished descendants are
        cancelled the same way, in the same transaction; a parent waiting for a run
        cancelled at once is queued as by a child's final save. A finished run is returned
        unchanged (its unfinished descendants are still cancelled). ``NotFoundError`` if
        absent.
        """

    @abstractmethod
    async def prune_runs(
        self,
        *,
        finished_before: float | None = None,
        keep_last: int | None = None,
        namespace: str | None = None,
        dry_run: bool = False,
    ) -> int:
        """Delete finished runs (with their events and approvals) and return how many
        (with ``dry_run``: how many would go; nothing is deleted).

        A run goes when it finished before ``finished_before``, or when it is not
        among the ``keep_last`` most recently finished runs of its namespace. Runs
        that are queued, running or waiting for approval are never touched.
        """

    # ----------------------------------------------------------------- approvals

    @abstractmethod
    async def list_approvals(
        self,
        namespace: str | None = None,
        *,
        run_id: str | None = None,
        states: Sequence[str] | None = None,
        limit: int | None = None,
        after: tuple[float, str] | None = None,
    ) -> list[Approval]:
        """Approvals, oldest first (by ``requested_at``, then id), filtered by namespace,
        run and state when given; at most ``limit``, those after the keyset ``after`` =
        ``(requested_at, id)`` when given."""

    @abstractmethod
    async def get_approval(self, approval_id: str) -> Approval | None:
        """One approval, or ``None``."""

    @abstractmethod
    async def decide_approval(
        self, approval_id: str, approved: bool, *, by: str | None = None, reason: str | None = None
    ) -> Approval:
        """Approve or reject a pending approval, once.

        ``NotFoundError`` if absent; ``ConflictError`` if already decided or
        expired. When it was the run's last pending approval and the run is
        ``waiting_approval``, the run becomes ``queued`` in the same transaction so
        a worker resumes it.
        """

    @abstractmethod
    async def queue_overdue_runs(self, now: float | None = None) -> list[tuple[str, int]]:
        """Queue the runs parked in ``waiting_children`` whose ``deadline_at`` passed by
        ``now`` (a system run whose node hangs past its ``timeout_seconds``): their
        executor ends them. Returns ``(run id, fencing token)`` of each queued run. Safe
        to call from every worker at once: a run is queued by one call only."""

    @abstractmethod
    async def expire_approvals(self, now: float | None = None) -> list[Approval]:
        """Mark pending approvals whose ``expires_at`` passed as ``expired`` and queue their
        runs (as ``decide_approval`` does); returns what expired."""

    # ----------------------------------------------------------------- sessions

    @abstractmethod
    async def get_or_create_session(self, namespace: str, session_id: str, agent: str) -> Session:
        """The session with this id in ``namespace``, created when absent (race-free).

        Sessions are namespaced: the same id in two namespaces is two sessions.
        ``ConflictError`` when it exists for another agent.
        """

    @abstractmethod
    async def get_session(self, namespace: str, session_id: str) -> Session | None:
        """One session, or ``None``."""

    @abstractmethod
    async def list_sessions(
        self,
        namespace: str,
        agent: str | None = None,
        *,
        limit: int | None = None,
        after: tuple[float, str] | None = None,
    ) -> list[Session]:
        """Sessions of a namespace, most recently updated first (then by id, descending);
        at most ``limit``, those after the keyset ``after`` = ``(updated_at, id)`` (older,
        or as old with a smaller id) when given."""

    @abstractmethod
    async def delete_session(self, namespace: str, session_id: str) -> None:
        """Delete a session and its messages; ``NotFoundError`` if absent.

        ``ConflictError`` naming the run (and nothing deleted) while a run of the
        session is not finished (queued, running or waiting for approval); the check
        and the delete are one transaction, and a submit opens its session in the
        transaction that stores its run, so no run is ever left without its session.
        """

    @abstractmethod
    async def session_messages(
        self, namespace: str, session_id: str, *, include_hidden: bool = False
    ) -> list[SessionMessage]:
        """The session's messages in order; hidden (compacted) ones only when asked."""

    @abstractmethod
    async def compact_session(
        self, namespace: str, session_id: str, up_to_seq: int, summary: Message | None
    ) -> None:
        """Hide every visible message with ``seq <= up_to_seq`` and, when given, store
        ``summary`` as a visible summary message placed before the remaining ones -
        in one transaction. Hidden messages are kept."""

    # ----------------------------------------------------------------- events

    @abstractmethod
    async def append_events(self, events: Sequence[Event], lease: Lease | None = None) -> None:
        """Store events atomically; ``ConflictError`` when a (run, seq) exists or the run does not.

        With ``lease`` the write is fenced as in ``save_run``: a stale worker's
        events are refused with ``LeaseLostError`` and nothing is written.
        """

    @abstractmethod
    async def list_events(
        self, run_id: str, after_seq: int = 0, limit: int | None = None
    ) -> list[Event]:
        """The events of a run with ``seq > after_seq``, in order; at most ``limit`` of them."""

    # ----------------------------------------------------------------- API tokens

    @abstractmethod
    async def create_token(self, token: ApiToken) -> None:
        """Store a new API token (its secret's hash, never the secret); ``ConflictError``
        when the id exists."""

    @abstractmethod
    async def get_token(self, token_id: str) -> ApiToken | None:
        """One token (revoked ones too), or ``None``."""

    @abstractmethod
    async def list_tokens(
        self,
        namespace: str | None = None,
        *,
        limit: int | None = None,
        after: tuple[float, str] | None = None,
    ) -> list[ApiToken]:
        """Tokens, oldest first (by ``created_at``, then id), of one namespace when given;
        revoked ones included. At most ``limit``, those after the keyset ``after`` =
        ``(created_at, id)`` when given."""

    @abstractmethod
    async def revoke_token(self, token_id: str) -> ApiToken:
        """Revoke a token (once: a revoked token keeps its first ``revoked_at``);
        ``NotFoundError`` when absent."""

    @abstractmethod
    async def touch_token(self, token_id: str, when: float) -> None:
        """Record that the token was used at ``when`` (callers throttle this write)."""

    # ----------------------------------------------------------------- memory

    @abstractmethod
    async def write_memory(
        self,
        entry: MemoryEntry,
        *,
        max_entries: int | None = None,
        max_age_days: float | None = None,
        vector: MemoryVector | None = None,
    ) -> tuple[MemoryEntry, bool]:
        """Store ``entry`` at its place, replacing the text and metadata of an entry with
        the same key there; returns the entry as stored and whether this call wrote it.
        With ``vector``, its embedding is stored with it (scaled to unit length), in the
        same transaction; without, a replaced entry loses its old vector.

        With ``entry.idempotency_key`` set and an entry of the same Memory written under
        that key already, nothing is written and that entry comes back with ``False``:
        a replayed tool call never writes twice. The scope's retention (``max_entries``
        most recently written, none older than ``max_age_days``) is applied in the same
        transaction. ``MemoryInputError`` for a text, key or metadata it cannot take.
        """

    @abstractmethod
    async def write_memories(
        self,
        entries: Sequence[MemoryEntry],
        vectors: Sequence[MemoryVector] | None = None,
        *,
        max_entries: int | None = None,
        max_age_days: float | None = None,
    ) -> list[tuple[MemoryEntry, bool]]:
        """:meth:`write_memory` for each entry (with ``vectors[i]`` when given), all in one
        transaction: all are written, or none. Retention is applied once, at the end."""

    @abstractmethod
    async def memory_by_idempotency_key(
        self, namespace: str, memory: str, idempotency_key: str
    ) -> MemoryEntry | None:
        """The entry a write with ``idempotency_key`` stored in the Memory, if any (a replay
        is answered from it before anything is embedded)."""

    @abstractmethod
    async def memory_vector_index(self) -> str:
        """How this store searches Memory vectors (for ``describe``, capabilities)."""

    @abstractmethod
    async def read_memory(self, place: MemoryPlace, key: str) -> MemoryEntry | None:
        """The entry with ``key`` at ``place``, or ``None``."""

    @abstractmethod
    async def list_memory(
        self,
        place: MemoryPlace,
        *,
        prefix: str = "",
        limit: int = 20,
        after: str | None = None,
    ) -> list[MemoryEntry]:
        """The entries at ``place`` by key (those starting with ``prefix``, after the key
        ``after``: the last of the previous page), at most ``limit`` (capped at 100)."""

    @abstractmethod
    async def delete_memory_entry(self, place: MemoryPlace, key: str) -> bool:
        """Delete one entry; whether it existed."""

    @abstractmethod
    async def search_memory(
        self,
        place: MemoryPlace,
        query: str,
        *,
        top_k: int = 5,
        filters: Mapping[str, Any] | None = None,
        vector: MemoryVector | None = None,
    ) -> list[MemoryHit]:
        """The entries at ``place`` whose text matches words of ``query``, best first, at
        most ``top_k`` (capped at 100); with ``filters``, only those whose metadata has
        each key equal to its value. Any query text is taken as words, never as syntax:
        a query without words finds nothing by full text.

        With ``vector`` (the query's embedding), the search is hybrid: the full-text
        ranking and the ranking of the entries' vectors of the same embedder by cosine
        distance are fused by reciprocal rank fusion; each hit says which signals
        found it."""

    @abstractmethod
    async def prune_memory(
        self,
        place: MemoryPlace,
        *,
        max_entries: int | None = None,
        max_age_days: float | None = None,
        now: float | None = None,
    ) -> int:
        """Apply retention to one scope now (as a write does); how many entries went."""

    @abstractmethod
    async def memory_stats(self, namespace: str, memory: str) -> MemoryStats:
        """How many entries a Memory holds (all scopes), their text's size in characters,
        how many scopes have entries, and its search index (no Memory: all zero)."""

    # ----------------------------------------------------------------- agent messages

    @abstractmethod
    async def add_agent_messages(self, messages: Sequence[AgentMessage]) -> list[bool]:
        """Store messages of system runs, each unless one with its id is stored already
        (insert-or-ignore: a coordinator that runs again sends the same ids); returns, in
        order, whether each was stored by this call. ``NotFoundError`` when a message's
        system run does not exist (nothing stored)."""

    @abstractmethod
    async def get_agent_message(self, message_id: str) -> AgentMessage | None:
        """One message, or ``None``."""

    @abstractmethod
    async def list_agent_messages(
        self,
        system_run_id: str,
        *,
        limit: int | None = None,
        after: tuple[float, str] | None = None,
        states: Sequence[MessageState] | None = None,
    ) -> list[AgentMessage]:
        """The messages of a system run, oldest first (by ``created_at``, then id); at most
        ``limit``, those after the keyset ``after`` = ``(created_at, id)`` when given, only
        those in ``states`` when given."""

    @abstractmethod
    async def mark_agent_message(
        self,
        message_id: str,
        state: MessageState,
        *,
        child_run_id: str | None = None,
        error: dict[str, Any] | None = None,
        attempt: int | None = None,
        now: float | None = None,
    ) -> AgentMessage | None:
        """Move a message forward to ``state`` (``pending`` -> ``delivered`` -> ``done`` or
        ``failed``; any unfinished state -> ``dead_letter``), setting its child run, error,
        delivery count and the time of the change (``delivered_at`` or ``finished_at``).
        Returns the message as changed, or ``None`` when it is absent or that move is not
        one forward from its state (a repeated or late mark changes nothing)."""
