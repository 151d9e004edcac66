"""Agent systems: submit a system task, and list the agent messages of one."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from corral.api import AgentMessageOut, AgentMessagePage, SubmitSystemTask, Task
from corral.resources.kinds import NAME_PATTERN
from corral.runtime import system_runs
from corral.server import pagination
from corral.server.auth import Operator, Viewer
from corral.server.context import context_of
from corral.server.problems import responses
from corral.server.routes_tasks import TaskId, submitted

router = APIRouter(prefix="/v1")

SystemName = Annotated[
    str, Path(max_length=63, pattern=NAME_PATTERN, description="The AgentSystem's name.")
]


@router.post(
    "/systems/{name}/tasks",
    status_code=201,
    response_model=Task,
    tags=["systems"],
    summary="Submit a system task",
    responses={
        200: {"model": Task, "description": "The idempotency key was seen before: that task."},
        **responses(404, 409),
    },
)
async def submit_system_task(
    name: SystemName, body: SubmitSystemTask, who: Operator, request: Request, response: Response
) -> Task:
    """Queue a run of an AgentSystem: its coordinator sends the input to the entry agent
    and each output on along the graph, one node task (a child task) per message. With
    `idempotency_key`, submitting again returns the first task (200); 409 when the key is
    a task's of the Agent of the same name."""
    context = context_of(request)
    record, created = await system_runs.submit_system(
        context.store,
        name,
        body.input,
        namespace=who.namespace,
        idempotency_key=body.idempotency_key,
        labels=body.labels,
        bus=context.bus,
    )
    return submitted(record, created, response)


@router.get(
    "/tasks/{task_id}/messages",
    response_model=AgentMessagePage,
    tags=["systems"],
    summary="List a system task's agent messages",
    responses=responses(404),
)
async def task_messages(
    task_id: TaskId,
    who: Viewer,
    request: Request,
    limit: pagination.Limit = 50,
    cursor: pagination.Cursor = None,
) -> AgentMessagePage:
    """The agent messages of a system task, oldest first (none for a task of one agent).
    A message is created with the time its sender finished, so a page of a task still
    going may be followed by messages placed before its cursor: list again from the
    start to see them all."""
    found = await system_runs.messages(
        context_of(request).store,
        task_id,
        namespace=who.namespace,
        limit=limit + 1,
        after=pagination.position(cursor, (float, str)),
    )
    page, next_cursor = pagination.keyset_page(found, limit, lambda m: (m.created_at, m.id))
    return AgentMessagePage(
        items=[AgentMessageOut.from_record(m) for m in page], next_cursor=next_cursor
    )
