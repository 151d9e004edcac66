"""The run record: what a run was asked, what it did, where it ended."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from corral.core.messages import Message, Usage


class RunState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING_APPROVAL = "waiting_approval"
    #: parked until its child runs (``agents_exec``) finish; holds no worker slot
    WAITING_CHILDREN = "waiting_children"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    DEAD_LETTER = "dead_letter"

    @property
    def finished(self) -> bool:
        return self in (
            RunState.SUCCEEDED,
            RunState.FAILED,
            RunState.CANCELLED,
            RunState.DEAD_LETTER,
        )

    @property
    def parked(self) -> bool:
        """Waiting, durably and without a worker, for something outside the run: a human's
        decision or its child runs. Such a run is queued again when that comes."""
        return self in (RunState.WAITING_APPROVAL, RunState.WAITING_CHILDREN)


@dataclass(frozen=True)
class PendingApproval:
    """A tool call that waits for a human before it may run."""

    call_id: str
    tool: str
    arguments: str
    reason: str
    requested_at: float = field(default_factory=time.time)
    #: after this the request counts as rejected (from the agent's approval policy)
    expires_at: float | None = None


@dataclass(frozen=True)
class Decision:
    """A human's decision on a pending call (or its expiry), as a resumed run journals it
    in ``approval.resolved``: approved or not, why, who decided and when."""

    approved: bool
    reason: str | None = None
    by: str | None = None
    decided_at: float | None = None
    approval_id: str | None = None
    #: nobody decided: the request expired, which counts as a rejection
    expired: bool = False

    def journaled(self) -> dict[str, Any]:
        """What ``approval.resolved`` records beyond ``approved`` and ``reason``."""
        data: dict[str, Any] = {"by": self.by, "decided_at": self.decided_at}
        if self.approval_id is not None:
            data["approval_id"] = self.approval_id
        if self.expired:
            data["expired"] = True
        return data


@dataclass
class RunRecord:
    """One run of one agent, as stored.

    A run is also the durable task a worker claims: ``priority``, ``not_before``,
    ``attempts`` and ``max_attempts`` decide when and how often it is tried;
    ``lease_owner``, ``lease_expires_at`` and ``fencing_token`` say who runs it now.
    """

    id: str
    namespace: str
    agent: str
    input: str
    state: RunState = RunState.QUEUED
    output: Any = None
    error: dict[str, Any] | None = None
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    steps: int = 0
    messages: list[Message] = field(default_factory=list[Message])
    pending_approvals: list[PendingApproval] = field(default_factory=list[PendingApproval])
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    idempotency_key: str | None = None
    session_id: str | None = None
    priority: int = 0
    not_before: float = 0.0
    attempts: int = 0
    max_attempts: int = 3
    cancel_requested: bool = False
    lease_owner: str | None = None
    lease_expires_at: float | None = None
    fencing_token: int = 0
    #: a per-run structured-output schema (``prompt-object --schema``) over the agent's own
    output_schema: dict[str, Any] | None = None
    #: ``key=value`` labels given at submit (``-l``), checked by :mod:`corral.core.selectors`
    labels: dict[str, str] = field(default_factory=dict[str, str])
    #: the run whose ``agents_exec`` call started this one (a child run), if any
    parent_run_id: str | None = None
    #: how many parents it has: 0 for a submitted run, its parent's depth + 1 for a child
    depth: int = 0
    #: the agent the conversation goes on under after a ``handoff`` (``None``: ``agent``,
    #: the submitted one); saved with the run when it parks or ends
    active_agent: str | None = None
    #: the AgentSystem this run belongs to: set on a system run (``branch_id`` unset: the
    #: run its coordinator executes) and on each of its node runs (``branch_id`` set)
    system: str | None = None
    #: a node run's branch of its system run, and the branch that one forked from
    branch_id: str | None = None
    parent_branch_id: str | None = None
    #: when the run's time limit passes: a system run's start plus its
    #: ``limits.timeout_seconds`` (set by its coordinator); parked past it, any worker's
    #: upkeep queues it (``Store.queue_overdue_runs``) for its coordinator to fail it
    deadline_at: float | None = None
    #: what a system run's coordinator knew at the end of its last pass (saved with it),
    #: so that the next pass reads only what changed (see :mod:`corral.runtime.systems`)
    position: dict[str, Any] | None = None
    #: a cap on the run's own cost, given when it is created: a system run's
    #: ``limits.max_cost_usd``, and on each node run what its system run had left of it
    #: then; the agent loop stops at the lower of this and its agent's own limit
    max_cost_usd: float | None = None
    #: a cap on the run's own tokens, given when it is created: on a child run
    #: (``agents_exec``) what its parent had left of its ``limits.max_tokens`` then
    max_tokens: int | None = None

    @property
    def status_at(self) -> float:
        """When the run last reached a state the store stamps: ``finished_at``, else
        ``started_at``, else ``created_at`` (the A2A task's status timestamp; what
        ``Store.list_runs(status_since=)`` compares)."""
        if self.finished_at is not None:
            return self.finished_at
        return self.started_at if self.started_at is not None else self.created_at

    @property
    def is_system_run(self) -> bool:
        """Whether this is a system run (executed by its coordinator, not an agent loop)."""
        return self.system is not None and self.branch_id is None


@dataclass(frozen=True)
class Lease:
    """A worker's claim on a run.

    ``token`` is the run's fencing token at claim time: every write made under
    the lease carries it, and the store refuses the write once another claim
    has bumped the token (:class:`~corral.core.errors.LeaseLostError`).

    ``exhausted``: the run had used all its ``max_attempts`` before this claim (its
    workers kept dying), so the claim counted no attempt and only ends the run.
    """

    run_id: str
    owner: str
    token: int
    expires_at: float
    exhausted: bool = False


class ApprovalState(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"


@dataclass
class Approval:
    """A stored request for a human decision on one tool call."""

    id: str
    run_id: str
    namespace: str
    agent: str
    call_id: str
    tool: str
    arguments: str
    reason: str
    state: ApprovalState = ApprovalState.PENDING
    requested_at: float = field(default_factory=time.time)
    expires_at: float | None = None
    decided_at: float | None = None
    decided_by: str | None = None
    decision_reason: str | None = None
