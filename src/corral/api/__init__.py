"""The bodies of the HTTP API, as pydantic models: the wire contract of server and client.

``corral.server`` answers with these models (they are what /openapi.json
describes) and ``corral.client`` parses its answers into the same ones, so the
two cannot drift apart. The module is plain pydantic over the library's
records: importing it pulls in neither FastAPI nor httpx.

Requests forbid unknown fields. Responses are built from the library's records
with the ``from_*`` constructors, the only place that knows both shapes. Every
list answers ``{items, next_cursor}``: pass ``next_cursor`` back as ``cursor``
for the next page; ``null`` means there is none.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, WithJsonSchema
from pydantic.json_schema import SkipJsonSchema

from corral.core.events import Event, EventType
from corral.core.messages import Message
from corral.core.runs import Approval, ApprovalState, RunRecord, RunState
from corral.core.sessions import (
    SESSION_ID_PATTERN,
    SESSION_ID_RULE,
    InvalidSessionIdError,
    Session,
    SessionMessage,
    check_session_id,
)
from corral.core.tokens import ApiToken, Role
from corral.resources.kinds import (
    KINDS,
    NAME_PATTERN,
    STORED,
    AgentRoleSpec,
    AgentSpec,
    McpServerSpec,
    ModelEndpointSpec,
    SecretSpec,
    ToolPermissionSpec,
    ToolSpecModel,
)

# The store's record types (no database driver comes with them).
from corral.store.base import ApplyAction, ApplyOutcome, StoredResource


def surrogate_path(value: Any, path: str = "") -> str | None:
    """Where in ``value`` (JSON data) a string holds a lone surrogate, or ``None``.

    ``json.loads`` accepts ``"\\ud800"``, but such a string is not Unicode text: it
    cannot be encoded to UTF-8, so it could be neither stored nor sent back.
    """
    if isinstance(value, str):
        return path if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            where = surrogate_path(key, path) or surrogate_path(item, f"{path}.{key}".lstrip("."))
            if where is not None:
                return where
    elif isinstance(value, list):
        for index, item in enumerate(value):
            where = surrogate_path(item, f"{path}[{index}]")
            if where is not None:
                return where
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _unicode_only(value: dict[str, Any]) -> dict[str, Any]:
    where = surrogate_path(value)
    if where is not None:
        raise ValueError(f"text at {where or 'the top'!r} is not valid Unicode (a lone surrogate)")
    return value


Name = Annotated[str, Field(pattern=NAME_PATTERN, description="A resource name.")]
#: A JSON object from a client (a JSON Schema): any content, but only valid Unicode text.
JsonObject = Annotated[dict[str, Any], AfterValidator(_unicode_only)]
#: Free text: any characters but NUL, which PostgreSQL cannot store.
Text = Annotated[str, Field(pattern=r"^[^\x00]*$")]
ID_PATTERN = r"^[A-Za-z0-9._:-]+$"
Id = Annotated[str, Field(min_length=1, max_length=64, pattern=ID_PATTERN)]
Timestamp = Annotated[float, Field(description="Seconds since the epoch (UTC).")]


def _session_id(value: str) -> str:
    try:
        return check_session_id(value)
    except InvalidSessionIdError:
        raise ValueError(SESSION_ID_RULE) from None


#: A session id, checked by the rule the CLI applies too (core/sessions.py): the schema
#: publishes it, the validator alone enforces it, so both refuse with the same reason.
SessionId = Annotated[
    str,
    AfterValidator(_session_id),
    WithJsonSchema({"type": "string", "pattern": SESSION_ID_PATTERN, "maxLength": 64}),
]


class Request(BaseModel):
    """Base of request bodies: unknown fields are errors."""

    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- common


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int
    requests: int


class ToolCallOut(BaseModel):
    id: str
    name: str
    arguments: str = Field(description="The model's arguments, as JSON text.")


class MessageOut(BaseModel):
    """One message of a conversation."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: list[ToolCallOut] = Field(default_factory=list[ToolCallOut])
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False

    @staticmethod
    def from_message(message: Message) -> MessageOut:
        return MessageOut(
            role=message.role,
            content=message.content,
            tool_calls=[
                ToolCallOut(id=c.id, name=c.name, arguments=c.arguments) for c in message.tool_calls
            ],
            tool_call_id=message.tool_call_id,
            name=message.name,
            is_error=message.is_error,
        )


# --------------------------------------------------------------------------- tasks


class PendingApprovalOut(BaseModel):
    call_id: str
    tool: str
    arguments: str
    reason: str
    requested_at: Timestamp
    expires_at: Timestamp | None = None


class Task(BaseModel):
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

    @classmethod
    def from_record(cls, record: RunRecord) -> Task:
        return cls(**_task_fields(record))


class TaskDetail(Task):
    """A task with its conversation."""

    messages: list[MessageOut]

    @classmethod
    def from_record(cls, record: RunRecord) -> TaskDetail:
        messages = [MessageOut.from_message(m) for m in record.messages]
        return cls(**_task_fields(record), messages=messages)


def _task_fields(record: RunRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "namespace": record.namespace,
        "agent": record.agent,
        "input": record.input,
        "state": record.state,
        "output": record.output,
        "error": record.error,
        "usage": Usage(
            input_tokens=record.usage.input_tokens,
            output_tokens=record.usage.output_tokens,
            requests=record.usage.requests,
        ),
        "cost_usd": record.cost_usd,
        "steps": record.steps,
        "created_at": record.created_at,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
        "idempotency_key": record.idempotency_key,
        "session_id": record.session_id,
        "priority": record.priority,
        "not_before": record.not_before,
        "attempts": record.attempts,
        "max_attempts": record.max_attempts,
        "cancel_requested": record.cancel_requested,
        "lease_owner": record.lease_owner,
        "lease_expires_at": record.lease_expires_at,
        "pending_approvals": [
            PendingApprovalOut(
                call_id=p.call_id,
                tool=p.tool,
                arguments=p.arguments,
                reason=p.reason,
                requested_at=p.requested_at,
                expires_at=p.expires_at,
            )
            for p in record.pending_approvals
        ],
        "output_schema": record.output_schema,
    }


class TaskPage(BaseModel):
    items: list[Task]
    next_cursor: str | None


#: the bounds of a task's priority and delay (the API's and the CLI's, one rule)
MAX_PRIORITY = 1_000_000
MAX_DELAY_SECONDS = 366 * 86400
#: items per page of a list
MAX_PAGE_ITEMS = 500


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


# --------------------------------------------------------------------------- events


class EventOut(BaseModel):
    """One event of a run; ``seq`` numbers a run's events from 1 without gaps."""

    run_id: str
    seq: int
    type: EventType
    ts: Timestamp
    data: dict[str, Any]

    @staticmethod
    def from_event(event: Event) -> EventOut:
        return EventOut(
            run_id=event.run_id, seq=event.seq, type=event.type, ts=event.ts, data=event.data
        )


class EventPage(BaseModel):
    items: list[EventOut]
    next_cursor: str | None = Field(
        description="Where the next page starts; null once the run has finished and every "
        "event was listed. A run still going returns a cursor even with no new events."
    )


# --------------------------------------------------------------------------- resources


#: The kinds as the API takes them in paths and queries: ``Agent``, ``agent`` or ``agents``.
KIND_NAMES: tuple[str, ...] = tuple(
    spelling for kind in KINDS for spelling in (kind, kind.lower(), kind.lower() + "s")
)


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)  # a null default: the field is absent, never null


class DocumentMetadata(Request):
    name: Name
    namespace: Name | SkipJsonSchema[None] = Field(
        None,
        description="Defaults to the token's namespace; another one is refused.",
        json_schema_extra=_no_default,
    )
    labels: dict[str, str] = Field(default_factory=dict[str, str])


class _Document(Request):
    apiVersion: Literal["corral/v1"]
    metadata: DocumentMetadata


class ModelEndpointDocument(_Document):
    kind: Literal["ModelEndpoint"]
    spec: ModelEndpointSpec


class ToolDocument(_Document):
    kind: Literal["Tool"]
    spec: ToolSpecModel


class McpServerDocument(_Document):
    kind: Literal["McpServer"]
    spec: McpServerSpec


class AgentDocument(_Document):
    kind: Literal["Agent"]
    spec: AgentSpec


class SecretDocument(_Document):
    kind: Literal["Secret"]
    spec: SecretSpec


class AgentRoleDocument(_Document):
    kind: Literal["AgentRole"]
    spec: AgentRoleSpec


class ToolPermissionDocument(_Document):
    kind: Literal["ToolPermission"]
    spec: ToolPermissionSpec


#: A resource document to apply: its ``spec`` is the schema of its ``kind``. Only the
#: published schema of ``POST /v1/resources``: the server parses bodies with the resource
#: loader (YAML too, with line numbers).
ResourceDocument = Annotated[
    ModelEndpointDocument
    | ToolDocument
    | McpServerDocument
    | AgentDocument
    | SecretDocument
    | AgentRoleDocument
    | ToolPermissionDocument,
    Field(discriminator="kind"),
]


class ResourceMetadata(BaseModel):
    name: str
    namespace: str
    labels: dict[str, str]


class ResourceStatus(BaseModel):
    generation: int = Field(description="Counts the resource's configurations, from 1.")
    created_at: Timestamp
    updated_at: Timestamp


class _Stored(BaseModel):
    """A stored resource document (secret values shown as <redacted>)."""

    apiVersion: Literal["corral/v1"]
    metadata: ResourceMetadata
    status: ResourceStatus


class ModelEndpointOut(_Stored):
    kind: Literal["ModelEndpoint"]
    spec: ModelEndpointSpec


class ToolOut(_Stored):
    kind: Literal["Tool"]
    spec: ToolSpecModel


class McpServerOut(_Stored):
    kind: Literal["McpServer"]
    spec: McpServerSpec


class AgentOut(_Stored):
    kind: Literal["Agent"]
    spec: AgentSpec


class SecretOut(_Stored):
    kind: Literal["Secret"]
    spec: SecretSpec


class AgentRoleOut(_Stored):
    kind: Literal["AgentRole"]
    spec: AgentRoleSpec


class ToolPermissionOut(_Stored):
    kind: Literal["ToolPermission"]
    spec: ToolPermissionSpec


#: A stored resource: ``spec`` has the schema of its ``kind`` (secret values <redacted>).
ResourceOut = Annotated[
    ModelEndpointOut
    | ToolOut
    | McpServerOut
    | AgentOut
    | SecretOut
    | AgentRoleOut
    | ToolPermissionOut,
    Field(discriminator="kind"),
]
RESOURCE_OUT: TypeAdapter[ResourceOut] = TypeAdapter(ResourceOut)


def resource_out(stored: StoredResource, document: dict[str, Any]) -> ResourceOut:
    """The answer for ``stored``, shown as ``document`` (its redacted document)."""
    status = ResourceStatus(
        generation=stored.generation,
        created_at=stored.created_at,
        updated_at=stored.updated_at,
    )
    # a stored spec is not checked again against rules apply has made stricter since
    return RESOURCE_OUT.validate_python({**document, "status": status}, context=STORED)


class ResourcePage(BaseModel):
    items: list[ResourceOut]
    next_cursor: str | None


class AppliedResource(BaseModel):
    namespace: str
    kind: str
    name: str
    action: ApplyAction
    generation: int

    @staticmethod
    def from_outcome(outcome: ApplyOutcome) -> AppliedResource:
        return AppliedResource(
            namespace=outcome.namespace,
            kind=outcome.kind,
            name=outcome.name,
            action=outcome.action,
            generation=outcome.generation,
        )


class ApplyResult(BaseModel):
    """What applying a batch did, one entry per document in order."""

    outcomes: list[AppliedResource]


# --------------------------------------------------------------------------- approvals


class ApprovalOut(BaseModel):
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

    @staticmethod
    def from_approval(a: Approval) -> ApprovalOut:
        return ApprovalOut(
            id=a.id,
            run_id=a.run_id,
            namespace=a.namespace,
            agent=a.agent,
            call_id=a.call_id,
            tool=a.tool,
            arguments=a.arguments,
            reason=a.reason,
            state=a.state,
            requested_at=a.requested_at,
            expires_at=a.expires_at,
            decided_at=a.decided_at,
            decided_by=a.decided_by,
            decision_reason=a.decision_reason,
        )


class ApprovalPage(BaseModel):
    items: list[ApprovalOut]
    next_cursor: str | None


class Decision(Request):
    reason: Annotated[Text, Field(max_length=4000)] | None = Field(
        None, description="Recorded with the decision; a rejection's reason is told to the model."
    )


# --------------------------------------------------------------------------- sessions


class SessionOut(BaseModel):
    id: str
    namespace: str
    agent: str
    created_at: Timestamp
    updated_at: Timestamp

    @staticmethod
    def from_session(s: Session) -> SessionOut:
        return SessionOut(
            id=s.id,
            namespace=s.namespace,
            agent=s.agent,
            created_at=s.created_at,
            updated_at=s.updated_at,
        )


class SessionPage(BaseModel):
    items: list[SessionOut]
    next_cursor: str | None


class SessionMessageOut(BaseModel):
    seq: int
    message: MessageOut
    run_id: str | None = None
    hidden: bool = Field(description="Compacted away: kept for audit, no longer sent to the model.")
    summary: bool = Field(description="Written by compaction, summarizing older messages.")
    created_at: Timestamp

    @staticmethod
    def from_stored(m: SessionMessage) -> SessionMessageOut:
        return SessionMessageOut(
            seq=m.seq,
            message=MessageOut.from_message(m.message),
            run_id=m.run_id,
            hidden=m.hidden,
            summary=m.summary,
            created_at=m.created_at,
        )


class SessionMessagePage(BaseModel):
    items: list[SessionMessageOut]
    next_cursor: str | None


# --------------------------------------------------------------------------- prompts


class Prompt(Request):
    """Ask an agent and wait for the answer."""

    input: Annotated[Text, Field(description="The prompt.")]
    session: SessionId | None = Field(None, description="Carry the conversation of this session.")
    timeout_seconds: float = Field(
        60.0,
        gt=0,
        le=600,
        description="How long to wait; past it the answer is 202 with the task still going.",
    )


class PromptObject(Prompt):
    """Ask an agent for JSON that validates against a schema."""

    schema_: JsonObject | None = Field(
        None,
        alias="schema",
        description="The JSON Schema of the answer; defaults to the agent's output_schema.",
    )


# --------------------------------------------------------------------------- tokens


class TokenOut(BaseModel):
    """An API token, without its secret."""

    id: str
    namespace: str
    role: Role
    name: str
    description: str
    created_at: Timestamp
    last_used_at: Timestamp | None = None
    revoked_at: Timestamp | None = None

    @classmethod
    def from_token(cls, t: ApiToken) -> TokenOut:
        return cls(**_token_fields(t))


class TokenCreated(TokenOut):
    token: str = Field(description="The token itself: shown this once, never again.")

    @classmethod
    def from_created(cls, t: ApiToken, plain: str) -> TokenCreated:
        return cls(**_token_fields(t), token=plain)


def _token_fields(t: ApiToken) -> dict[str, Any]:
    return {
        "id": t.id,
        "namespace": t.namespace,
        "role": t.role,
        "name": t.name,
        "description": t.description,
        "created_at": t.created_at,
        "last_used_at": t.last_used_at,
        "revoked_at": t.revoked_at,
    }


class TokenPage(BaseModel):
    items: list[TokenOut]
    next_cursor: str | None


class CreateToken(Request):
    """A new token of the caller's namespace."""

    role: Role
    name: Annotated[Text, Field(max_length=255)] = ""
    description: Annotated[Text, Field(max_length=4000)] = ""


# --------------------------------------------------------------------------- operations


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready", "not_ready"]
    detail: str = ""
