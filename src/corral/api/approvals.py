"""Approvals: tool calls that wait (or waited) for a human decision, and the decisions."""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import BaseModel, Field

from corral.api.common import FromRecord, Request, Text, Timestamp
from corral.core.runs import Approval, ApprovalState


class ApprovalOut(FromRecord):
    """A tool call that waits (or waited) for a human decision."""

    id: str
    run_id: str
    namespace: str
    agent: str
    call_id: str
    tool: str
    arguments: str
    reason: str
    state: ApprovalState
    requested_at: Timestamp
    expires_at: Timestamp | None = None
    decided_at: Timestamp | None = None
    decided_by: str | None = None
    decision_reason: str | None = None

    @classmethod
    def from_approval(cls, approval: Approval) -> Self:
        return cls.model_validate(approval)


class ApprovalPage(BaseModel):
    items: list[ApprovalOut]
    next_cursor: str | None


class Decision(Request):
    reason: Annotated[Text, Field(max_length=4000)] | None = Field(
        None, description="Recorded with the decision; a rejection's reason is told to the model."
    )
