"""Agent systems: submitting a system task, and the agent messages of one."""

from __future__ import annotations

from typing import Annotated, Any, Self

from pydantic import BaseModel, Field

from corral.api.common import FromRecord, Request, Text, Timestamp
from corral.api.tasks import Labels
from corral.core.agent_messages import AgentMessage, MessageState


class SubmitSystemTask(Request):
    """A run of an AgentSystem to queue (the system is named in the path)."""

    input: Annotated[Text, Field(description="The system's input, to its entry agent.")]
    idempotency_key: Annotated[Text, Field(min_length=1, max_length=255)] | None = Field(
        None, description="Submitting the same key again (same system) returns the same task."
    )
    labels: Labels = Field(default_factory=dict[str, str])


class AgentMessageOut(FromRecord):
    """One message of a system task: the system's input to its entry, a node's output to a
    next node, or the gathered outputs of the branches into a join."""

    id: str
    namespace: str
    system_run_id: str
    from_agent: str | None = Field(None, description="null: the system's input, or a join.")
    to_agent: str
    branch_id: str
    parent_branch_id: str | None = None
    type: str = Field(description="input, output or join")
    payload: Any = Field(None, description="What the receiving agent is given.")
    idempotency_key: str
    state: MessageState
    attempt: int = Field(description="Deliveries by a bus so far (0: none, or delivered directly).")
    hop: int = Field(description="Messages from the system's input along this one's path.")
    child_run_id: str | None = Field(None, description="The node task that handles it.")
    trace_id: str | None = None
    error: dict[str, Any] | None = None
    created_at: Timestamp
    delivered_at: Timestamp | None = None
    finished_at: Timestamp | None = None

    @classmethod
    def from_record(cls, record: AgentMessage) -> Self:
        return cls.model_validate(record)


class AgentMessagePage(BaseModel):
    items: list[AgentMessageOut]
    next_cursor: str | None
