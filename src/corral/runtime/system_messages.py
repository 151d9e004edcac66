"""Agent messages of system runs: their ids, what a node run is given, and delivery.

What the coordinator (:mod:`corral.runtime.systems`), the inbox consumer
(:mod:`corral.runtime.inbox`) and the front doors (:mod:`corral.runtime.system_runs`)
share: a message id derived from where the message comes from, the input of the node
run that handles a message, :func:`deliver` (a message -> its node run, keyed by the
message id) and the record of a system run to submit.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import NamedTuple

from corral.bus.base import Bus
from corral.core.agent_messages import AgentMessage, MessageState
from corral.core.errors import ConflictError, NotFoundError
from corral.core.runs import RunRecord
from corral.runtime.operations import new_run
from corral.store.base import Allowance, Store

#: the kind of the resource a system run runs
KIND = "AgentSystem"
#: how a message id (and so the idempotency key of its node run) begins
MESSAGE_ID_PREFIX = "msg_"
_MESSAGE_ID = re.compile(rf"{MESSAGE_ID_PREFIX}[0-9a-f]{{32}}")


def message_id(system_run_id: str, source: str, to_agent: str) -> str:
    """The id of the message to ``to_agent`` that ``source`` (the message its sender
    handled, ``input``, or ``join``) leads to in a system run: the same on every pass."""
    digest = hashlib.sha256(f"{system_run_id}\x00{source}\x00{to_agent}".encode()).hexdigest()
    return f"{MESSAGE_ID_PREFIX}{digest[:32]}"


def is_message_id(text: str) -> bool:
    """Whether ``text`` has the shape of a :func:`message_id` (a delivery's id is what
    whoever published it wrote: only such a one is looked up)."""
    return _MESSAGE_ID.fullmatch(text) is not None


def node_input(message: AgentMessage) -> str:
    """The input of the node run that handles ``message``: text as it is, anything else
    (a structured output, a join's gathered outputs) as JSON text."""
    if isinstance(message.payload, str):
        return message.payload
    return json.dumps(message.payload, ensure_ascii=False)


class Delivered(NamedTuple):
    """What :func:`deliver` did: the node run, and the message as it marked it (``None``:
    the message was not ``pending`` any more, or is gone)."""

    run: RunRecord
    message: AgentMessage | None


async def deliver(
    store: Store,
    bus: Bus | None,
    message: AgentMessage,
    *,
    attempt: int | None = None,
    parent: RunRecord | None = None,
) -> Delivered:
    """Deliver ``message``: create (or find, by its id) the node run that handles it and
    mark it ``delivered``; the node run is announced on ``bus`` when new. What the
    coordinator does for a pending message (it passes the system run it holds as
    ``parent``: one read less) and what a bus's inbox consumer does for a delivery.
    ``NotFoundError`` when the system run or the agent is gone; ``ConflictError`` when
    the system run has ended or is being cancelled (a publish consumed after a cancel, a
    forged one): the store checks that in the transaction that creates the node run
    (:meth:`~corral.store.base.Store.submit_agent_run`), so a ``parent`` read before a
    cancel starts no node run after it."""
    if parent is None:
        parent = await store.get_run(message.system_run_id)
    if parent is None or parent.id != message.system_run_id:
        raise NotFoundError(f"system run {message.system_run_id!r} not found")
    record = new_run(
        message.to_agent,
        node_input(message),
        namespace=message.namespace,
        session=None,
        idempotency_key=message.id,
        output_schema=None,
    )
    record.parent_run_id = parent.id
    record.depth = parent.depth + 1
    record.priority = parent.priority
    record.system = parent.system
    allowance = None
    if parent.max_cost_usd is not None:
        # what the system has left, as its agent loop's cap, split with the other messages
        # waiting for their node runs: nodes running at once cannot together spend more
        # than the system has (each holds its cap until it ends, then what it spent)
        waiting = await store.list_agent_messages(parent.id, states=[MessageState.PENDING])
        pending = frozenset(m.id for m in waiting)
        allowance = Allowance(MESSAGE_ID_PREFIX, parent.max_cost_usd, None, waiting=pending)
    record.branch_id = message.branch_id
    record.parent_branch_id = message.parent_branch_id
    submitted = await store.submit_agent_run(record, allowance=allowance)
    if submitted.record.parent_run_id != parent.id:
        # a task submitted under this message's id as its idempotency key (the ids are
        # derived from the system run's): not a node run, and never one to wait for
        raise ConflictError(
            f"task {submitted.record.id} of agent {message.to_agent!r} holds the idempotency "
            f"key {message.id!r} of the system's message: it is not a node run of "
            f"system run {parent.id}"
        )
    marked = await store.mark_agent_message(
        message.id, MessageState.DELIVERED, child_run_id=submitted.record.id, attempt=attempt
    )
    if submitted.created and bus is not None:
        await bus.announce_runnable([submitted.record.id], mark="submitted")
    return Delivered(submitted.record, marked)


def system_run_record(
    spec_name: str,
    user_input: str,
    *,
    namespace: str,
    idempotency_key: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> RunRecord:
    """A system run to submit: a run of the system ``spec_name`` (its ``agent`` too)."""
    record = new_run(
        spec_name,
        user_input,
        namespace=namespace,
        session=None,
        idempotency_key=idempotency_key,
        output_schema=None,
        labels=labels,
    )
    record.system = spec_name
    return record


__all__ = [
    "KIND",
    "Delivered",
    "deliver",
    "is_message_id",
    "message_id",
    "node_input",
    "system_run_record",
]
