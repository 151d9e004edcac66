"""Rows <-> records for the SQL store: resources, runs, run events, approvals, sessions,
session messages, API tokens.

Messages, usage and pending approvals go through the one serializer of
:mod:`corral.core.messages` (``dump``/``load``), as JSON columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from pydantic import ValidationError

from corral.core.errors import ConfigurationError
from corral.core.events import Event
from corral.core.messages import Message, Usage, dump, dump_messages, load, load_messages
from corral.core.runs import Approval, ApprovalState, PendingApproval, RunRecord, RunState
from corral.core.sessions import Session, SessionMessage
from corral.core.tokens import ApiToken, Role
from corral.resources.kinds import API_VERSION, SPEC_TYPES, STORED, Metadata, Resource, Spec
from corral.store.base import StoredResource


class Columns(Protocol):
    """A row read by either SQL path, its columns as attributes: a SQLAlchemy ``Row``, or
    a row of the SQLite fast path (:class:`corral.store.sqlite.DecodedRow`)."""

    def __getattr__(self, name: str) -> Any: ...


def run_values(record: RunRecord) -> dict[str, Any]:
    """Every column of ``runs`` for ``record``."""
    return {
        "id": record.id,
        "namespace": record.namespace,
        "agent": record.agent,
        "state": record.state.value,
        "input": record.input,
        "output": dump(record.output),
        "error": record.error,
        "usage": dump(record.usage),
        "cost_usd": record.cost_usd,
        "steps": record.steps,
        "messages": dump_messages(record.messages),
        "pending": dump(record.pending_approvals),
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
        "fencing_token": record.fencing_token,
        "output_schema": record.output_schema,
    }


def row_to_run(row: Columns) -> RunRecord:
    """A run record from a full ``runs`` row."""
    return RunRecord(
        id=row.id,
        namespace=row.namespace,
        agent=row.agent,
        input=row.input,
        state=RunState(row.state),
        output=row.output,
        error=row.error,
        usage=load(Usage, row.usage),
        cost_usd=row.cost_usd,
        steps=row.steps,
        messages=load_messages(row.messages),
        pending_approvals=load(list[PendingApproval], row.pending),
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        idempotency_key=row.idempotency_key,
        session_id=row.session_id,
        priority=row.priority,
        not_before=row.not_before,
        attempts=row.attempts,
        max_attempts=row.max_attempts,
        cancel_requested=bool(row.cancel_requested),
        lease_owner=row.lease_owner,
        lease_expires_at=row.lease_expires_at,
        fencing_token=row.fencing_token,
        output_schema=row.output_schema,
    )


def event_values(events: Sequence[Event]) -> list[dict[str, Any]]:
    """Rows of ``run_events`` for ``events``."""
    return [
        {"run_id": e.run_id, "seq": e.seq, "type": str(e.type), "ts": e.ts, "data": e.data}
        for e in events
    ]


def approval_values(approval: Approval) -> dict[str, Any]:
    """Every column of ``approvals`` for ``approval``."""
    return {
        "id": approval.id,
        "run_id": approval.run_id,
        "namespace": approval.namespace,
        "agent": approval.agent,
        "call_id": approval.call_id,
        "tool": approval.tool,
        "arguments": approval.arguments,
        "reason": approval.reason,
        "state": ApprovalState(approval.state).value,
        "requested_at": approval.requested_at,
        "expires_at": approval.expires_at,
        "decided_at": approval.decided_at,
        "decided_by": approval.decided_by,
        "decision_reason": approval.decision_reason,
    }


def row_to_approval(row: Columns) -> Approval:
    """An approval from a full ``approvals`` row."""
    return Approval(
        id=row.id,
        run_id=row.run_id,
        namespace=row.namespace,
        agent=row.agent,
        call_id=row.call_id,
        tool=row.tool,
        arguments=row.arguments,
        reason=row.reason,
        state=ApprovalState(row.state),
        requested_at=row.requested_at,
        expires_at=row.expires_at,
        decided_at=row.decided_at,
        decided_by=row.decided_by,
        decision_reason=row.decision_reason,
    )


def row_to_session(row: Columns) -> Session:
    """A session from a full ``sessions`` row."""
    return Session(
        id=row.id,
        namespace=row.namespace,
        agent=row.agent,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def session_message_values(
    namespace: str, session_id: str, message: SessionMessage, position: float
) -> dict[str, Any]:
    """Every column of ``session_messages`` for ``message``, placed at ``position``."""
    return {
        "namespace": namespace,
        "session_id": session_id,
        "seq": message.seq,
        "position": position,
        "message": dump(message.message),
        "run_id": message.run_id,
        "hidden": message.hidden,
        "summary": message.summary,
        "created_at": message.created_at,
    }


def row_to_session_message(row: Columns) -> SessionMessage:
    """A session message from a full ``session_messages`` row."""
    return SessionMessage(
        seq=row.seq,
        message=load(Message, row.message),
        run_id=row.run_id,
        hidden=bool(row.hidden),
        summary=bool(row.summary),
        created_at=row.created_at,
    )


def spec_json(spec: Spec) -> dict[str, Any]:
    """A resource spec as stored (JSON)."""
    return spec.model_dump(mode="json")


def row_to_stored(row: Columns) -> StoredResource:
    """A stored resource from a ``resources`` row; ``ConfigurationError`` if it no longer validates."""
    spec_type = SPEC_TYPES.get(row.kind)
    if spec_type is None:
        raise ConfigurationError(f"stored resource {row.kind}/{row.name} has an unknown kind")
    try:
        spec = spec_type.model_validate(row.spec, context=STORED)
        metadata = Metadata(name=row.name, namespace=row.namespace, labels=row.labels)
    except ValidationError as exc:
        raise ConfigurationError(
            f"stored {row.kind} {row.name!r} in namespace {row.namespace!r} is no longer valid: {exc}"
        ) from exc
    resource = Resource(apiVersion=API_VERSION, kind=row.kind, metadata=metadata, spec=spec)
    return StoredResource(resource, row.generation, row.created_at, row.updated_at)


def token_values(token: ApiToken) -> dict[str, Any]:
    """Every column of ``api_tokens`` for ``token``."""
    return {
        "id": token.id,
        "namespace": token.namespace,
        "role": Role(token.role).value,
        "name": token.name,
        "description": token.description,
        "secret_hash": token.secret_hash,
        "created_at": token.created_at,
        "last_used_at": token.last_used_at,
        "revoked_at": token.revoked_at,
    }


def row_to_token(row: Columns) -> ApiToken:
    """An API token from a full ``api_tokens`` row."""
    return ApiToken(
        id=row.id,
        namespace=row.namespace,
        role=Role(row.role),
        secret_hash=row.secret_hash,
        name=row.name,
        description=row.description,
        created_at=row.created_at,
        last_used_at=row.last_used_at,
        revoked_at=row.revoked_at,
    )
