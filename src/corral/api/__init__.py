"""The bodies of the HTTP API, as pydantic models: the wire contract of server and client.

``corral.server`` answers with these models (they are what /openapi.json
describes) and ``corral.client`` parses its answers into the same ones, so the
two cannot drift apart. The package is plain pydantic over the library's
records: importing it pulls in neither FastAPI nor a database driver (the
``api-plain`` import contract). One module per area of the API (as the
server's ``routes_*``), all re-exported here.

Requests forbid unknown fields. Responses are built from the library's records
by pydantic (``from_attributes``): a record's fields are defined once, in the
record. Every list answers ``{items, next_cursor}``: pass ``next_cursor`` back
as ``cursor`` for the next page; ``null`` means there is none.
"""

from corral.api.agents import Prompt, PromptObject
from corral.api.approvals import ApprovalOut, ApprovalPage, Decision
from corral.api.common import (
    ID_PATTERN,
    FromRecord,
    Id,
    JsonObject,
    MessageOut,
    Name,
    Request,
    SessionId,
    Text,
    Timestamp,
    ToolCallOut,
    surrogate_path,
)
from corral.api.links import LinkExec, LinkInfo, LinkOut, LinkPage
from corral.api.memory import (
    MemoryEntryOut,
    MemoryEntryPage,
    MemoryHitOut,
    MemorySearchRequest,
    MemorySearchResult,
    MemoryWriteRequest,
)
from corral.api.ops import BackendOut, CapabilitiesOut, Health, Readiness, SandboxOut
from corral.api.resources import (
    KIND_NAMES,
    RESOURCE_OUT,
    AgentDocument,
    AgentOut,
    AgentRoleDocument,
    AgentRoleOut,
    AppliedResource,
    ApplyResult,
    DocumentMetadata,
    McpServerDocument,
    McpServerOut,
    MemoryDocument,
    MemoryOut,
    ModelEndpointDocument,
    ModelEndpointOut,
    NamespacePolicyDocument,
    NamespacePolicyOut,
    ResourceDocument,
    ResourceMetadata,
    ResourceOut,
    ResourcePage,
    ResourceStatus,
    SecretDocument,
    SecretOut,
    ToolDocument,
    ToolOut,
    ToolPermissionDocument,
    ToolPermissionOut,
    resource_out,
)
from corral.api.sessions import SessionMessageOut, SessionMessagePage, SessionOut, SessionPage
from corral.api.tasks import (
    EventOut,
    EventPage,
    PendingApprovalOut,
    SubmitTask,
    Task,
    TaskDetail,
    TaskPage,
    Usage,
)
from corral.api.tokens import CreateToken, TokenCreated, TokenOut, TokenPage
from corral.core.limits import MAX_DELAY_SECONDS, MAX_PAGE_ITEMS, MAX_PRIORITY

__all__ = [
    "ID_PATTERN",
    "KIND_NAMES",
    "MAX_DELAY_SECONDS",
    "MAX_PAGE_ITEMS",
    "MAX_PRIORITY",
    "RESOURCE_OUT",
    "AgentDocument",
    "AgentOut",
    "AgentRoleDocument",
    "AgentRoleOut",
    "AppliedResource",
    "ApplyResult",
    "ApprovalOut",
    "ApprovalPage",
    "BackendOut",
    "CapabilitiesOut",
    "CreateToken",
    "Decision",
    "DocumentMetadata",
    "EventOut",
    "EventPage",
    "FromRecord",
    "Health",
    "Id",
    "JsonObject",
    "LinkExec",
    "LinkInfo",
    "LinkOut",
    "LinkPage",
    "McpServerDocument",
    "McpServerOut",
    "MemoryDocument",
    "MemoryEntryOut",
    "MemoryEntryPage",
    "MemoryHitOut",
    "MemoryOut",
    "MemorySearchRequest",
    "MemorySearchResult",
    "MemoryWriteRequest",
    "MessageOut",
    "ModelEndpointDocument",
    "ModelEndpointOut",
    "Name",
    "NamespacePolicyDocument",
    "NamespacePolicyOut",
    "PendingApprovalOut",
    "Prompt",
    "PromptObject",
    "Readiness",
    "Request",
    "ResourceDocument",
    "ResourceMetadata",
    "ResourceOut",
    "ResourcePage",
    "ResourceStatus",
    "SandboxOut",
    "SecretDocument",
    "SecretOut",
    "SessionId",
    "SessionMessageOut",
    "SessionMessagePage",
    "SessionOut",
    "SessionPage",
    "SubmitTask",
    "Task",
    "TaskDetail",
    "TaskPage",
    "Text",
    "Timestamp",
    "TokenCreated",
    "TokenOut",
    "TokenPage",
    "ToolCallOut",
    "ToolDocument",
    "ToolOut",
    "ToolPermissionDocument",
    "ToolPermissionOut",
    "Usage",
    "resource_out",
    "surrogate_path",
]
