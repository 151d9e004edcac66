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


@dataclass(frozen=True)
class PendingApproval:
    """A tool call that waits for a human before it may run."""

    call_id: str
    tool: str
    arguments: str
    reason: str
    requested_at: float = field(default_factory=time.time)


@dataclass
class RunRecord:
    """One run of one agent, as stored."""

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
