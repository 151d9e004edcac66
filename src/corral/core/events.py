"""Run events: the ordered, numbered record of what a run did.

The engine emits events through an :class:`EventSink`; whoever runs the engine
decides where they go (the store, a terminal, an SSE stream). Sequence numbers
start at 1 and have no gaps within a run.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class EventType(StrEnum):
    """Every event type a run can emit."""

    RUN_START = "run.start"
    STEP_START = "step.start"
    TEXT_DELTA = "text.delta"
    TOOL_CALL = "tool.call"
    TOOL_RESULT = "tool.result"
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_RESOLVED = "approval.resolved"
    #: a tool call started a child run (``agents_exec``); the run waits for it
    CHILD_START = "child.start"
    #: the child run of a call finished: its outcome becomes the call's result
    CHILD_FINISH = "child.finish"
    #: a system run stored an agent message (its input to the entry, a node's output to a
    #: next node, the gathered outputs into a join)
    MESSAGE_SEND = "message.send"
    #: a system run's message reached its agent: the node run that handles it exists
    MESSAGE_DELIVER = "message.deliver"
    #: a join node of a system run gathered its inputs (or dropped a late one)
    BRANCH_JOIN = "branch.join"
    #: the conversation goes on under another agent (a ``handoff`` call): from, to, reason
    HANDOFF = "handoff"
    MESSAGE_CREATE = "message.create"
    #: a memory tool wrote (``memory_write``, ``memory_ingest``): no text beyond a preview
    MEMORY_WRITE = "memory.write"
    #: a memory tool searched (``memory_search``): the query's preview and the hit count
    MEMORY_SEARCH = "memory.search"
    STEP_FINISH = "step.finish"
    RUN_FINISH = "run.finish"
    ERROR = "error"
    #: something the run's reader should know that does not stop it (``code``, ``message``),
    #: said once per run: ``usage_estimated`` (a provider reported no token usage)
    WARNING = "warning"


@dataclass(frozen=True)
class Event:
    """One event of one run."""

    run_id: str
    seq: int
    type: EventType
    data: dict[str, Any] = field(default_factory=dict[str, Any])
    ts: float = field(default_factory=time.time)


EventSink = Callable[[Event], Awaitable[None]]
"""Receives each event in order; the engine awaits it before moving on."""
