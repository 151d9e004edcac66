"""Resources: the documents an apply takes, stored resources, what an apply did."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, Field, TypeAdapter
from pydantic.json_schema import SkipJsonSchema

from corral.api.common import FromRecord, Name, Request, Timestamp
from corral.resources.execution import NamespacePolicySpec
from corral.resources.kinds import (
    KINDS,
    STORED,
    AgentRoleSpec,
    AgentSpec,
    McpServerSpec,
    ModelEndpointSpec,
    SecretSpec,
    ToolPermissionSpec,
    ToolSpecModel,
)
from corral.resources.memory import MemorySpec
from corral.resources.systems import AgentSystemSpec

# The store's record types (no database driver comes with them).
from corral.store.base import ApplyAction, ApplyOutcome, StoredResource

#: The kinds as the API takes them in paths and queries: ``Agent``, ``agent`` or ``agents``.
KIND_NAMES: tuple[str, ...] = tuple(
    spelling
    for kind in KINDS
    for spelling in (
        kind,
        kind.lower(),
        kind.lower()[:-1] + "ies" if kind.endswith("y") else kind.lower() + "s",
    )
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


class NamespacePolicyDocument(_Document):
    kind: Literal["NamespacePolicy"]
    spec: NamespacePolicySpec


class MemoryDocument(_Document):
    kind: Literal["Memory"]
    spec: MemorySpec


class AgentSystemDocument(_Document):
    kind: Literal["AgentSystem"]
    spec: AgentSystemSpec


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
    | ToolPermissionDocument
    | NamespacePolicyDocument
    | MemoryDocument
    | AgentSystemDocument,
    Field(discriminator="kind"),
]


class ResourceMetadata(BaseModel):
    name: str
    namespace: str
    labels: dict[str, str]


# read from the StoredResource itself (the rest of an answer is its document); no
# docstring, which would become the schema's description
class ResourceStatus(FromRecord):
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


class NamespacePolicyOut(_Stored):
    kind: Literal["NamespacePolicy"]
    spec: NamespacePolicySpec


class MemoryOut(_Stored):
    kind: Literal["Memory"]
    spec: MemorySpec


class AgentSystemOut(_Stored):
    kind: Literal["AgentSystem"]
    spec: AgentSystemSpec


#: A stored resource: ``spec`` has the schema of its ``kind`` (secret values <redacted>).
ResourceOut = Annotated[
    ModelEndpointOut
    | ToolOut
    | McpServerOut
    | AgentOut
    | SecretOut
    | AgentRoleOut
    | ToolPermissionOut
    | NamespacePolicyOut
    | MemoryOut
    | AgentSystemOut,
    Field(discriminator="kind"),
]
RESOURCE_OUT: TypeAdapter[ResourceOut] = TypeAdapter(ResourceOut)


def resource_out(stored: StoredResource, document: dict[str, Any]) -> ResourceOut:
    """The answer for ``stored``, shown as ``document`` (its redacted document)."""
    # status is the stored record itself, read by attribute; a stored spec is not
    # checked again against rules apply has made stricter since
    return RESOURCE_OUT.validate_python({**document, "status": stored}, context=STORED)


class ResourcePage(BaseModel):
    items: list[ResourceOut]
    next_cursor: str | None


class AppliedResource(FromRecord):
    namespace: str
    kind: str
    name: str
    action: ApplyAction
    generation: int

    @classmethod
    def from_outcome(cls, outcome: ApplyOutcome) -> Self:
        return cls.model_validate(outcome)


class ApplyResult(BaseModel):
    """What applying a batch did, one entry per document in order."""

    outcomes: list[AppliedResource]


#: the most resources one ``POST /v1/resources/delete`` deletes
MAX_DELETED_TOGETHER = 100


class ResourceKey(Request):
    """One resource of the token's namespace: its kind (any spelling ``GET`` takes) and name."""

    kind: str = Field(min_length=1, max_length=64, json_schema_extra={"enum": list(KIND_NAMES)})
    name: Name


class ResourceDeletion(Request):
    """Resources to delete together, all or none (``POST /v1/resources/delete``)."""

    items: list[ResourceKey] = Field(min_length=1, max_length=MAX_DELETED_TOGETHER)
