"""The CLI's remote mode: :class:`RemoteBackend` over the HTTP API (``CORRAL_URL``).

The API's bodies become the library's records here, so the commands render
them exactly as they render the store's. Files are loaded here, as in embedded
mode (the same file/line errors, relative paths made absolute against the file),
and the server receives the loaded documents: program paths then name files on
this machine, which the server must see at the same place.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from corral.api import ApprovalOut, EventOut, MessageOut, ResourceOut, Task, TaskDetail
from corral.cli.backend import Backend, Show, load_files
from corral.client import AsyncClient
from corral.core.errors import NotFoundError
from corral.core.events import Event, EventType
from corral.core.messages import Message, ToolCall, Usage
from corral.core.runs import Approval, ApprovalState, PendingApproval, RunRecord, RunState
from corral.core.sessions import Session, SessionMessage
from corral.resources.kinds import Metadata, Resource
from corral.store.base import ApplyAction, ApplyOutcome, StoredResource

#: how often a follower asks whether the run paused for approval (its stream stays open then)
PAUSE_CHECK_SECONDS = 0.25
#: the largest page the API serves
PAGE = 500


class RemoteBackend(Backend):
    """A Corral server; runs execute on its workers (or on ``corral worker`` processes)."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    # ----------------------------------------------------------------------- resources

    async def apply(self, paths: Sequence[Path], namespace: str) -> list[ApplyOutcome]:
        from corral.core.settings import Settings

        loaded = await load_files(paths, namespace, Settings.from_env())
        if not loaded:
            return []
        result = await self.client.apply([item.resource.to_document() for item in loaded])
        return [
            ApplyOutcome(o.namespace, o.kind, o.name, ApplyAction(o.action), o.generation)
            for o in result.outcomes
        ]

    async def list_resources(self, namespace: str, kind: str | None) -> list[StoredResource]:
        return [stored(r) async for r in self.client.iter_resources(kind, page_size=PAGE)]

    async def get_resource(self, namespace: str, kind: str, name: str) -> StoredResource | None:
        try:
            return stored(await self.client.get_resource(kind, name))
        except NotFoundError:
            return None

    async def delete_resource(self, namespace: str, kind: str, name: str) -> None:
        await self.client.delete_resource(kind, name)

    # ----------------------------------------------------------------------- runs

    async def submit(
        self,
        agent: str,
        prompt: str,
        *,
        namespace: str,
        session: str | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
        delay: float = 0.0,
    ) -> tuple[RunRecord, bool]:
        task, created = await self.client.submit(
            agent,
            prompt,
            session=session,
            idempotency_key=idempotency_key,
            priority=priority,
            delay_seconds=delay,
        )
        return run_record(task), created

    async def run(
        self,
        agent: str,
        prompt: str,
        *,
        namespace: str,
        session: str | None,
        output_schema: dict[str, Any] | None,
        show: Show | None,
        loading: Any,
    ) -> RunRecord:
        submitted = await self.client.submit(
            agent, prompt, session=session, output_schema=output_schema
        )

        async def ignore(event: Event) -> None:
            return None

        return await self.follow(submitted.task.id, show or ignore, follow=True)

    async def list_runs(
        self, namespace: str, agent: str | None, limit: int, states: list[str] | None
    ) -> list[RunRecord]:
        found: list[RunRecord] = []
        async for task in self.client.iter_tasks(
            state=states, agent=agent, page_size=min(limit, PAGE)
        ):
            found.append(run_record(task))
            if len(found) >= limit:
                break
        return found

    async def get_run(self, run_id: str) -> RunRecord | None:
        try:
            return run_record(await self.client.get_task(run_id))
        except NotFoundError:
            return None

    async def cancel(self, run_id: str) -> RunRecord:
        return run_record(await self.client.cancel_task(run_id))

    async def follow(self, run_id: str, show: Show, *, follow: bool) -> RunRecord:
        """The events over SSE; a run that pauses for approval keeps its stream open, so
        a watcher ends the stream once the run's state says it waits."""
        last = 0
        if follow:
            async with anyio.create_task_group() as group:

                async def until_paused() -> None:
                    while True:
                        await anyio.sleep(PAUSE_CHECK_SECONDS)
                        task = await self.client.get_task(run_id)
                        if task.state is RunState.WAITING_APPROVAL:
                            group.cancel_scope.cancel()
                            return

                group.start_soon(until_paused)
                async for event in self.client.follow(run_id):
                    last = event.seq
                    await show(as_event(event))
                group.cancel_scope.cancel()
        # the stored events after the last one shown (all of them without --follow)
        cursor: str | None = None
        while True:
            page = await self.client.events(run_id, after=last, cursor=cursor, limit=PAGE)
            for event in page.items:
                last = event.seq
                await show(as_event(event))
            if page.next_cursor is None or not page.items:
                break
            cursor = page.next_cursor
        return run_record(await self.client.get_task(run_id))

    # ----------------------------------------------------------------------- approvals

    async def list_approvals(self, namespace: str, states: list[str] | None) -> list[Approval]:
        return [approval(a) async for a in self.client.iter_approvals(state=states, page_size=PAGE)]

    async def decide(self, approval_id: str, approved: bool, reason: str | None) -> Approval:
        if approved:
            return approval(await self.client.approve(approval_id, reason))
        return approval(await self.client.reject(approval_id, reason))

    # ----------------------------------------------------------------------- sessions

    async def list_sessions(self, namespace: str) -> list[Session]:
        return [
            Session(s.id, s.namespace, s.agent, s.created_at, s.updated_at)
            async for s in self.client.iter_sessions(page_size=PAGE)
        ]

    async def session_messages(
        self, namespace: str, session_id: str, *, include_hidden: bool
    ) -> list[SessionMessage]:
        return [
            SessionMessage(m.seq, message(m.message), m.run_id, m.hidden, m.summary, m.created_at)
            async for m in self.client.iter_session_messages(
                session_id, include_hidden=include_hidden, page_size=PAGE
            )
        ]

    async def delete_session(self, namespace: str, session_id: str) -> None:
        await self.client.delete_session(session_id)


# --------------------------------------------------------------------------- API -> records


def stored(out: ResourceOut) -> StoredResource:
    """A resource document of the API as the store's record (secret values stay redacted)."""
    resource = Resource(
        apiVersion=out.apiVersion,
        kind=out.kind,
        metadata=Metadata.model_validate(out.metadata.model_dump()),
        spec=out.spec,
    )
    return StoredResource(
        resource, out.status.generation, out.status.created_at, out.status.updated_at
    )


def message(out: MessageOut) -> Message:
    calls = tuple(ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in out.tool_calls)
    return Message(
        role=out.role,
        content=out.content,
        tool_calls=calls,
        tool_call_id=out.tool_call_id,
        name=out.name,
        is_error=out.is_error,
    )


def run_record(task: Task) -> RunRecord:
    """A task of the API as the store's run record (``fencing_token`` is not exposed: 0)."""
    messages = [message(m) for m in task.messages] if isinstance(task, TaskDetail) else []
    return RunRecord(
        id=task.id,
        namespace=task.namespace,
        agent=task.agent,
        input=task.input,
        state=RunState(task.state),
        output=task.output,
        error=task.error,
        usage=Usage(task.usage.input_tokens, task.usage.output_tokens, task.usage.requests),
        cost_usd=task.cost_usd,
        steps=task.steps,
        messages=messages,
        pending_approvals=[
            PendingApproval(p.call_id, p.tool, p.arguments, p.reason, p.requested_at, p.expires_at)
            for p in task.pending_approvals
        ],
        created_at=task.created_at,
        started_at=task.started_at,
        finished_at=task.finished_at,
        idempotency_key=task.idempotency_key,
        session_id=task.session_id,
        priority=task.priority,
        not_before=task.not_before,
        attempts=task.attempts,
        max_attempts=task.max_attempts,
        cancel_requested=task.cancel_requested,
        lease_owner=task.lease_owner,
        lease_expires_at=task.lease_expires_at,
        output_schema=task.output_schema,
    )


def approval(out: ApprovalOut) -> Approval:
    return Approval(
        id=out.id,
        run_id=out.run_id,
        namespace=out.namespace,
        agent=out.agent,
        call_id=out.call_id,
        tool=out.tool,
        arguments=out.arguments,
        reason=out.reason,
        state=ApprovalState(out.state),
        requested_at=out.requested_at,
        expires_at=out.expires_at,
        decided_at=out.decided_at,
        decided_by=out.decided_by,
        decision_reason=out.decision_reason,
    )


def as_event(out: EventOut) -> Event:
    return Event(run_id=out.run_id, seq=out.seq, type=EventType(out.type), data=out.data, ts=out.ts)
