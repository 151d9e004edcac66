"""The agent message record: one hop of an agent system run, from one node to the next.

A message is stored before it is delivered (``store/`` is the source of truth) and
delivered through the bus (``bus/``): in-process in embedded mode, on a JetStream
subject per agent inbox in scale-out. Its ``id`` is derived from where it comes from
(the system run, the sending node's branch and the receiving agent), so a coordinator
that runs again after a crash sends the same ids and the store keeps one of each; the
child run that handles it is keyed by the same id, so a message delivered twice never
runs its agent twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class MessageState(StrEnum):
    #: stored, not yet handed to its agent (a child run does not exist yet)
    PENDING = "pending"
    #: its child run exists (created from the bus delivery or by the coordinator's sweep)
    DELIVERED = "delivered"
    #: its child run succeeded; the coordinator has taken the output
    DONE = "done"
    #: its child run failed or was cancelled
    FAILED = "failed"
    #: it could not be delivered within the bus's max deliveries
    DEAD_LETTER = "dead_letter"

    @property
    def finished(self) -> bool:
        return self in (MessageState.DONE, MessageState.FAILED, MessageState.DEAD_LETTER)


@dataclass
class AgentMessage:
    """One message between two agents of a system run, as stored."""

    id: str
    namespace: str
    #: the system run this message belongs to
    system_run_id: str
    #: the sending agent (``None``: the system's input, to the entry agent)
    from_agent: str | None
    to_agent: str
    #: the branch this message starts or continues, and the branch it forked from
    branch_id: str
    parent_branch_id: str | None
    #: ``input`` (the system's input to the entry), ``output`` (a node's output to a next
    #: node), ``join`` (the gathered outputs of the branches into a join node)
    type: str
    payload: Any
    idempotency_key: str
    state: MessageState = MessageState.PENDING
    #: deliveries so far (the bus's count; 0 before the first)
    attempt: int = 0
    #: hops from the system's input along this message's path (the entry's input is 0)
    hop: int = 0
    #: the child run that handles it, once delivered
    child_run_id: str | None = None
    trace_id: str | None = None
    error: dict[str, Any] | None = None
    created_at: float = field(default_factory=time.time)
    delivered_at: float | None = None
    finished_at: float | None = None
