"""Tasks (durable runs) and their events: submit, list, get, cancel; events as pages or SSE."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from corral.api import (
    ID_PATTERN,
    EventOut,
    EventPage,
    SubmitTask,
    Task,
    TaskDetail,
    TaskPage,
)
from corral.core.errors import ConflictError, NotFoundError
from corral.core.runs import RunRecord, RunState
from corral.core.selectors import MAX_SELECTOR_CHARS, InvalidSelectorError, parse_selector
from corral.resources.kinds import NAME_PATTERN, json_schema_problem
from corral.runtime import operations
from corral.server import pagination
from corral.server.auth import Operator, Viewer
from corral.server.context import context_of
from corral.server.problems import FieldProblem, ProblemError, responses
from corral.server.sse import MEDIA_TYPE, event_stream

router = APIRouter(prefix="/v1")

TaskId = Annotated[str, Path(max_length=64, pattern=ID_PATTERN, description="The task (run) id.")]
RunId = Annotated[str, Path(max_length=64, pattern=ID_PATTERN, description="The run (task) id.")]


def check_schema(schema: dict[str, Any] | None, field: str) -> None:
    """422 naming ``field`` unless ``schema`` is a valid JSON Schema."""
    problem = json_schema_problem(schema) if schema is not None else None
    if problem is not None:
        raise ProblemError(
            422,
            "not a valid JSON Schema",
            code="invalid_request",
            errors=[FieldProblem(field=field, reason=problem)],
        )


@router.post(
    "/tasks",
    status_code=201,
    response_model=Task,
    tags=["tasks"],
    summary="Submit a task",
    responses={
        200: {"model": Task, "description": "The idempotency key was seen before: that task."},
        **responses(409),
    },
)
async def submit_task(
    body: SubmitTask, who: Operator, request: Request, response: Response
) -> Task:
    """Queue a run of an agent for a worker. With `idempotency_key`, submitting again
    returns the first task (200) instead of creating one (201)."""
    context = context_of(request)
    check_schema(body.output_schema, "body.output_schema")
    try:
        record, created = await operations.submit(
            context.store,
            body.agent,
            body.input,
            namespace=who.namespace,
            session=body.session,
            idempotency_key=body.idempotency_key,
            priority=body.priority,
            delay=body.delay_seconds,
            output_schema=body.output_schema,
            labels=body.labels,
            bus=context.bus,
        )
    except NotFoundError as exc:
        raise ProblemError(
            422,
            exc.message,
            code="unknown_agent",
            errors=[FieldProblem(field="body.agent", reason=exc.message)],
        ) from None
    return submitted(record, created, response)


def submitted(record: RunRecord, created: bool, response: Response) -> Task:
    """The answer to a task submission: 201 when ``created``, 200 when its idempotency key
    was seen before, with the task's ``Location``."""
    response.status_code = 201 if created else 200
    response.headers["Location"] = f"/v1/tasks/{record.id}"
    return Task.from_record(record)


@router.get(
    "/tasks", response_model=TaskPage, tags=["tasks"], summary="List tasks", responses=responses()
)
async def list_tasks(
    who: Viewer,
    request: Request,
    state: Annotated[
        list[RunState] | None, Query(description="Only tasks in these states.")
    ] = None,
    agent: Annotated[
        str | None, Query(pattern=NAME_PATTERN, description="Only this agent's tasks.")
    ] = None,
    selector: Annotated[
        str | None,
        Query(
            max_length=MAX_SELECTOR_CHARS,
            description="Only tasks whose labels match: `key=value`, `key!=value`, `key` "
            "(has the label), `!key` (has not), joined by commas (all must hold).",
        ),
    ] = None,
    limit: pagination.Limit = 50,
    cursor: pagination.Cursor = None,
) -> TaskPage:
    """The namespace's tasks, newest first."""
    try:
        chosen = parse_selector(selector) if selector is not None else None
    except InvalidSelectorError as exc:
        raise ProblemError(
            422,
            exc.message,
            code="invalid_request",
            errors=[FieldProblem(field="query.selector", reason=exc.message)],
        ) from None
    records = await context_of(request).store.list_runs(
        who.namespace,
        agent,
        limit + 1,
        state or None,
        before=pagination.position(cursor, (float, str)),
        selector=chosen,
    )
    page, next_cursor = pagination.keyset_page(records, limit, lambda r: (r.created_at, r.id))
    return TaskPage(items=[Task.from_record(r) for r in page], next_cursor=next_cursor)


@router.get(
    "/tasks/{task_id}",
    response_model=TaskDetail,
    tags=["tasks"],
    summary="Get a task",
    responses=responses(404),
)
async def get_task(task_id: TaskId, who: Viewer, request: Request) -> TaskDetail:
    """One task with its conversation."""
    record = await operations.get_run(context_of(request).store, task_id, namespace=who.namespace)
    return TaskDetail.from_record(record)


@router.get(
    "/tasks/{task_id}/children",
    response_model=TaskPage,
    tags=["tasks"],
    summary="List a task's child tasks",
    responses=responses(404),
)
async def task_children(task_id: TaskId, who: Viewer, request: Request) -> TaskPage:
    """The tasks this task's `agents_exec` calls started, oldest first, all in one page
    (`next_cursor` is null): a run has at most as many as it made calls."""
    records = await operations.children(context_of(request).store, task_id, namespace=who.namespace)
    return TaskPage(items=[Task.from_record(r) for r in records], next_cursor=None)


@router.post(
    "/tasks/{task_id}/cancel",
    response_model=Task,
    tags=["tasks"],
    summary="Cancel a task",
    responses=responses(404, 409),
)
async def cancel_task(task_id: TaskId, who: Operator, request: Request) -> Task:
    """A queued or waiting task is cancelled at once; a running one stops at its
    worker's next heartbeat (`cancel_requested` is true until then). Its unfinished
    child tasks (and theirs) are cancelled with it. A task that has already finished is
    left as it is: 409 `already_finished` ("task ... already succeeded; nothing
    cancelled")."""
    context = context_of(request)
    try:
        record = await operations.cancel(
            context.store, task_id, namespace=who.namespace, bus=context.bus
        )
    except ConflictError as exc:
        raise ProblemError(409, exc.message, code="already_finished") from None
    return Task.from_record(record)


_EVENTS_DOC = """The run's events after `after` (or `cursor`, or the `Last-Event-ID` header,
which wins), in order.

With `Accept: text/event-stream` the answer is a Server-Sent Events stream: each
event's `id` is its `seq`, so a client reconnecting with `Last-Event-ID` misses
none and sees none twice. The stream stays open while the run goes on (also while
it waits for approval), sends `: keep-alive` comments when idle, and ends with an
`end` event (`{"state": ...}`) once the run has finished. Otherwise the answer is
one JSON page: `next_cursor` is null once the run has finished and every event
was listed."""


@router.get(
    "/runs/{run_id}/events",
    response_model=EventPage,
    tags=["tasks"],
    summary="Read or follow a run's events",
    description=_EVENTS_DOC,
    responses={
        200: {
            "description": "A page of events (JSON) or an event stream (SSE).",
            "content": {MEDIA_TYPE: {"schema": {"type": "string"}}},
        },
        **responses(404),
    },
)
async def run_events(
    run_id: RunId,
    who: Viewer,
    request: Request,
    after: Annotated[int, Query(ge=0, le=2**31 - 1, description="Events with seq > after.")] = 0,
    cursor: pagination.Cursor = None,
    limit: pagination.Limit = 100,
    last_event_id: Annotated[
        str | None,
        Header(pattern=r"^[0-9]{1,9}$", description="The last event seen (SSE reconnect)."),
    ] = None,
) -> Any:
    context = context_of(request)
    record = await operations.get_run(context.store, run_id, namespace=who.namespace)
    position = after
    if cursor is not None:
        position = int(pagination.decode(cursor, (int,))[0])
    if last_event_id is not None:
        position = int(last_event_id)
    if MEDIA_TYPE in request.headers.get("accept", ""):
        return StreamingResponse(
            event_stream(context, run_id, position),
            media_type=MEDIA_TYPE,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    # The state is read before the events: a run finished by then has all of them stored.
    events = await context.store.list_events(run_id, position, limit + 1)
    page = events[:limit]
    if len(events) > limit:
        next_cursor: str | None = pagination.encode((page[-1].seq,))
    elif record.state.finished:
        next_cursor = None
    else:
        next_cursor = pagination.encode((page[-1].seq if page else position,))
    return EventPage(items=[EventOut.from_event(e) for e in page], next_cursor=next_cursor)
