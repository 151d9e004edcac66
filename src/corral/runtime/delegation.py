"""Child runs of linked agents: the runtime side of ``agents_exec`` (see
:mod:`corral.tools.agents` for the tools, :class:`~corral.tools.agents.Delegation`
for the interface they call).

A child run is an ordinary durable run with ``parent_run_id`` and ``depth``
set, submitted with an idempotency key derived from the parent's call and
announced on the bus like any submitted run. Its parent waits for it in
``waiting_children``, holding no worker: the store queues the parent again in the
transaction that finishes its last unfinished child (``Store.save_run``), and the
executor announces the parent then (:meth:`RunExecutor._announce_woken`).
Cancelling a run cancels its descendants (``Store.request_cancel``).

On a worker with a free slot the child is claimed in the transaction that submits
it and starts at once in that slot (:class:`ChildSlots`): no announcement, no claim
of its own. A parent whose children all run on its worker waits for them in its
slot up to :data:`CHILD_WAIT_SECONDS` before it parks (one-turn children end well
within it: the parent goes on with no park, no claim, no replay). Otherwise it
parks, and the last child's final save claims it for that child's worker
(``on_woken`` of :meth:`~corral.runtime.executor.RunExecutor.execute`). What the
parent journaled of the call (``child.start``, written *behind*: see
:mod:`corral.runtime.journal`) is durable within ``BEHIND_AFTER_SECONDS`` of the
call or with the parent's next write, whichever comes first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from corral.bus.base import Bus
from corral.core.errors import (
    BudgetExceededError,
    ConflictError,
    NotFoundError,
    ToolError,
    ToolErrorCode,
    UserError,
)
from corral.core.events import StepStartData
from corral.core.runs import Lease, RunRecord
from corral.core.sessions import SessionNotAllowedError
from corral.resources.kinds import AgentSpec
from corral.runtime.agent_tokens import AgentClaims
from corral.runtime.operations import new_run
from corral.store.base import Allowance, Store, Submitted
from corral.tools.base import ChildRun, ToolContext

#: how long a parent waits in its slot for children running on its worker before it
#: parks: past it, its slot is worth more to other runs than its park costs
CHILD_WAIT_SECONDS = 0.5

#: how the idempotency key of a child run a tool program started over the API begins
LINK_KEY_PREFIX = "link:"


def link_group(run_id: str, call: str | None) -> str:
    """How the idempotency keys of the children that the agent token of ``call`` (a tool
    call of run ``run_id``; ``None``: a token that names none) starts begin: they share the
    token's budget claims (:class:`~corral.store.base.Allowance`)."""
    return f"{LINK_KEY_PREFIX}{run_id}:{call or '-'}:"


def link_allowance(caller: AgentClaims) -> Allowance | None:
    """What the children the agent token ``caller`` starts share: what its call had left
    when it started (``None``: no limit to share)."""
    if caller.cost_left is None and caller.tokens_left is None:
        return None
    group = link_group(caller.run_id, caller.call)
    # (refused once spent: a program could otherwise start any number capped at nothing)
    return Allowance(group, caller.cost_left, caller.tokens_left, refuses_when_spent=True)


async def token_call_ended(store: Store, caller: AgentClaims) -> bool:
    """Whether the tool call the agent token ``caller`` was minted for has ended: its run's
    journal went on to a later step after the token's position. (A program may keep its
    token and hand it to a later call's program: the unspent part of its call's share
    would then be given out twice.) A token that names no call or position: ``False``."""
    if caller.call is None or caller.seq is None:
        return False
    step = int(caller.call.split(":", 1)[0])
    return any(
        isinstance(event.data, StepStartData) and event.data.step > step
        for event in await store.list_events(caller.run_id, caller.seq)
    )


def link_child_key(run_id: str, call: str | None, digest: str) -> str:
    """The idempotency key of a child of run ``run_id`` started by ``POST
    /v1/links/{agent}/exec`` with the token of ``call`` (``digest``: of the request's key
    and body)."""
    return f"{link_group(run_id, call)}{digest}"


def started_by_a_tool_program(child: RunRecord, parent_run_id: str) -> bool:
    """Whether ``child`` was started over the API by a tool program of its parent's run
    (not by an ``agents_exec`` call): its spend is charged to the parent when the step
    whose call started it is done (see :class:`~corral.engine.loop.AgentLoop`)."""
    return (child.idempotency_key or "").startswith(f"{LINK_KEY_PREFIX}{parent_run_id}:")


class ChildSlots(Protocol):
    """A worker's slots, as child runs take them (see the module docstring)."""

    def reserve(self) -> tuple[str, float] | None:
        """Hold a free slot for a child: ``(owner, lease_seconds)`` to claim it with, or
        ``None`` (no slot free, or the worker is stopping)."""

    def release(self) -> None:
        """Give back a slot :meth:`reserve` held (the child was not claimed)."""

    def start(self, record: RunRecord, lease: Lease) -> None:
        """Execute a child claimed with a reserved slot, in that slot."""

    async def ended(self, run_ids: Sequence[str], seconds: float) -> dict[str, RunRecord]:
        """Those of ``run_ids``, all started here by :meth:`start`, whose executions ended
        them (finished, as saved) within ``seconds``; none at once when one of them was not
        started here."""


class StoreDelegation:
    """Starts child runs in the store (and announces them on the bus, or starts them in
    a slot of ``slots``). ``executing``: the runs executing here by id, as claimed (a
    call's run is read from the store when it is not there)."""

    def __init__(
        self,
        store: Store,
        bus: Bus | None = None,
        slots: ChildSlots | None = None,
        executing: Mapping[str, RunRecord] | None = None,
    ) -> None:
        self.store = store
        self.bus = bus
        self.slots = slots
        self.executing: Mapping[str, RunRecord] = {} if executing is None else executing

    async def start_child(
        self,
        ctx: ToolContext,
        agent: str,
        user_input: str,
        session: str | None,
        *,
        key: str,
        max_depth: int,
    ) -> ChildRun:
        # capped at the call's share of what the run has left; refused when that is nothing
        # (capped at nothing, it would still take a paid model turn): an allowance of its
        # own key, which a retry of the call finds its child under
        allowance = None
        if ctx.cost_left is not None or ctx.tokens_left is not None:
            allowance = Allowance(
                key,
                ctx.cost_left,
                ctx.tokens_left,
                refuses_when_spent=True,
                spender="this call (its share of what the run has left)",
            )
        return await self.start_child_of(
            ctx.run_id,
            ctx.namespace,
            agent,
            user_input,
            session,
            key=key,
            max_depth=max_depth,
            allowance=allowance,
            parent=self.executing.get(ctx.run_id),
        )

    async def start_child_of(
        self,
        parent_run_id: str,
        namespace: str,
        agent: str,
        user_input: str,
        session: str | None,
        *,
        key: str,
        max_depth: int,
        allowance: Allowance | None = None,
        parent: RunRecord | None = None,
    ) -> ChildRun:
        """Start (or find, by ``key``) a child run of ``parent_run_id``: what ``agents_exec``
        and ``POST /v1/links/{agent}/exec`` (a tool program's agent token) both do.
        ``allowance``: what the child may spend, shared with its siblings of the same group
        (an ``agents_exec`` call's share of what its parent has left; what an agent token
        carries): the store caps the child at what they leave, so that children cannot
        spend the parent's budget many times over before their ends are charged to it
        (``None``: no cap). ``parent``: the parent's record, when at hand (what is taken of it - namespace, depth, priority - never changes; that
        it is still open is checked where the child is stored)."""
        if parent is None or parent.id != parent_run_id:
            parent = await self.store.get_run(parent_run_id)
        if parent is None or parent.namespace != namespace:
            # (the calling run is the one executing: never, short of a purge)
            raise ToolError(ToolErrorCode.UNAVAILABLE, f"the run {parent_run_id} is gone")
        depth = parent.depth + 1
        if depth > max_depth:
            raise ToolError(
                ToolErrorCode.BUDGET_EXCEEDED,
                f"a child run of agent {agent!r} would be {depth} levels deep, past this "
                f"agent's limit of {max_depth} (limits.max_depth)",
                details={"limit": "max_depth", "max_depth": max_depth, "depth": depth},
            )
        try:
            record = new_run(
                agent,
                user_input,
                namespace=namespace,
                session=session,
                idempotency_key=key,
                output_schema=None,
            )
            record.parent_run_id = parent.id
            record.depth = depth
            # a child goes before the work its parent's siblings queued after it
            record.priority = parent.priority
        except UserError as exc:  # a bad session id
            raise ToolError(ToolErrorCode.INVALID_INPUT, exc.message) from None
        slots = self.slots
        slot = slots.reserve() if slots is not None else None
        try:
            submitted = await self._submit(record, slot, allowance)
        except BaseException:
            if slots is not None and slot is not None:
                slots.release()
            raise
        if slots is not None and slot is not None:
            if submitted.lease is not None:
                slots.start(submitted.record, submitted.lease)
                return ChildRun(submitted.record.id, agent)
            slots.release()  # (found by its key, or its agent at max_concurrent_runs)
        if submitted.created and self.bus is not None:
            await self.bus.announce_runnable([submitted.record.id], mark="submitted")
        return ChildRun(submitted.record.id, agent)

    async def _submit(
        self, record: RunRecord, slot: tuple[str, float] | None, allowance: Allowance | None
    ) -> Submitted:
        try:
            return await self.store.submit_agent_run(record, claim_for=slot, allowance=allowance)
        except NotFoundError as exc:
            raise ToolError(ToolErrorCode.UNAVAILABLE, exc.message) from None
        except BudgetExceededError as exc:  # (its allowance left it nothing)
            details = {"limit": exc.limit}
            raise ToolError(ToolErrorCode.BUDGET_EXCEEDED, exc.message, details=details) from None
        except SessionNotAllowedError as exc:  # a session of another run tree
            refused = {"refused": exc.code, "session": record.session_id or ""}
            raise ToolError(ToolErrorCode.PERMISSION_DENIED, exc.message, details=refused) from None
        except (ConflictError, UserError) as exc:  # a session of another agent, a bad id
            raise ToolError(ToolErrorCode.INVALID_INPUT, exc.message) from None

    async def describe(self, namespace: str, agent: str) -> dict[str, Any]:
        stored = await self.store.get_resource(namespace, "Agent", agent)
        if stored is None or not isinstance(stored.resource.spec, AgentSpec):
            raise ToolError(
                ToolErrorCode.UNAVAILABLE, f"agent {agent!r} is not in namespace {namespace!r}"
            )
        spec = stored.resource.spec
        info: dict[str, Any] = {"tools": list(spec.tools)}
        if spec.output_schema is not None:
            info["output_schema"] = spec.output_schema
        return info
