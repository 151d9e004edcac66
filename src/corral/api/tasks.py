"""Tasks (durable runs of an agent) and their events."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, BaseModel, Field

from corral.api.common import (
    FromRecord,
    JsonObject,
    MessageOut,
    Name,
    Request,
    SessionId,
    Text,
    Timestamp,
)
from corral.core.events import AnyEventData, Event, EventType, parse_event_data
from corral.core.labels import labels_problem, labels_schema
from corral.core.limits import MAX_DELAY_SECONDS, MAX_PRIORITY
from corral.core.runs import RunRecord, RunState


def _valid_labels(labels: dict[str, str]) -> dict[str, str]:
    problem = labels_problem(labels)
    if problem is not None:
        raise ValueError(problem)
    return labels


#: a run's labels, held to the rule of ``core/labels.py``
Labels = Annotated[
    dict[str, str],
    AfterValidator(_valid_labels),
    Field(
        description="key=value labels: text without `,` `=` `!`, control, format or "
        "separator characters other than the space, nor surrounding spaces (keys 1-63 "
        "characters, values at most 63, at most 32 labels), selected by `selector` in the list.",
        json_schema_extra=labels_schema(),
    ),
]


class Usage(FromRecord):
    input_tokens: int
    output_tokens: int
    requests: int
    source: Literal["reported", "estimated"] = Field(
        "reported",
        description="estimated: a model endpoint reported no usage for some turn, and Corral "
        "estimated it",
    )


class PendingApprovalOut(FromRecord):
    call_id: str
    tool: str
    arguments: str
    reason: str
    requested_at: Timestamp
    expires_at: Timestamp | None = None


class Task(FromRecord):
    """A task: one durable run of one agent."""

    id: str
    namespace: str
    agent: str
    input: str
    state: RunState
    output: Any = Field(None, description="The answer: text, or JSON with an output schema.")
    error: dict[str, Any] | None = Field(
        None, description="Why the run failed: {code, message, ...}."
    )
    usage: Usage
    cost_usd: float
    steps: int
    created_at: Timestamp
    started_at: Timestamp | None = None
    finished_at: Timestamp | None = None
    idempotency_key: str | None = None
    session_id: str | None = None
    priority: int
    not_before: Timestamp
    attempts: int
    max_attempts: int
    cancel_requested: bool
    lease_owner: str | None = Field(None, description="The worker executing the run now.")
    lease_expires_at: Timestamp | None = None
    pending_approvals: list[PendingApprovalOut]
    output_schema: dict[str, Any] | None = None
    labels: dict[str, str] = Field(default_factory=dict[str, str])
    parent_run_id: str | None = Field(
        None, description="The task whose agents_exec call started this one (a child task)."
    )
    depth: int = Field(0, description="How many parents it has: 0 unless a child task.")
    max_cost_usd: float | None = Field(
        None,
        description=(
            "The task's own cost cap over its agent's limits: what its parent (or the agent "
            "token that started it) had left for it. Null: its agent's limits only."
        ),
    )
    max_tokens: int | None = Field(None, description="The same for tokens.")
    active_agent: str | None = Field(
        None,
        description=(
            "The agent the conversation went on under after a handoff (null: `agent`); "
            "updated when the task parks or ends"
        ),
    )
    system: str | None = Field(
        None, description="The AgentSystem of a system task, and of each of its node tasks."
    )
    branch_id: str | None = Field(
        None, description="A node task's branch of its system task (null: the system task)."
    )
    parent_branch_id: str | None = Field(None, description="The branch this one forked from.")

    @classmethod
    def from_record(cls, record: RunRecord) -> Self:
        return cls.model_validate(record)


class TaskDetail(Task):
    """A task with its conversation."""

    messages: list[MessageOut]


class TaskPage(BaseModel):
    items: list[Task]
    next_cursor: str | None


class SubmitTask(Request):
    """A run to queue."""

    agent: Name
    input: Annotated[Text, Field(description="The prompt.")]
    session: SessionId | None = Field(
        None, description="Carry the conversation of this session (created if new)."
    )
    idempotency_key: Annotated[Text, Field(min_length=1, max_length=255)] | None = Field(
        None, description="Submitting the same key again (same agent) returns the same task."
    )
    priority: int = Field(0, ge=-MAX_PRIORITY, le=MAX_PRIORITY, description="Higher runs first.")
    delay_seconds: float = Field(
        0.0, ge=0, le=MAX_DELAY_SECONDS, description="Wait before it may start."
    )
    output_schema: JsonObject | None = Field(
        None, description="A JSON Schema the answer must match (over the agent's own)."
    )
    labels: Labels = Field(default_factory=dict[str, str])


class EventOut(FromRecord):
    """One event of a run; ``seq`` numbers a run's events from 1 without gaps."""

    run_id: str
    seq: int
    type: EventType
    ts: Timestamp
    data: dict[str, Any]

    @classmethod
    def from_event(cls, event: Event) -> Self:
        return cls(
            run_id=event.run_id,
            seq=event.seq,
            type=event.type,
            ts=event.ts,
            data=event.data.to_dict(),
        )

    def payload(self) -> AnyEventData:
        """``data`` as its event type's payload (:mod:`corral.core.events`);
        ``ValueError`` when it is not one."""
        return parse_event_data(self.type, self.data)


class EventPage(BaseModel):
    items: list[EventOut]
    next_cursor: str | None = Field(
        description="Where the next page starts; null once the run has finished and every "
        "event was listed. A run still going returns a cursor even with no new events."
    )
