"""Corral runs as A2A tasks: the request handler behind each agent's A2A endpoint.

The A2A SDK (``a2a-sdk``) parses JSON-RPC, checks the protocol version and renders
answers and SSE; :class:`CorralRequestHandler` implements its ``RequestHandler``
over the operations of :mod:`corral.runtime.operations`, so an A2A task *is* a
Corral run (its id is the run id) and nothing is kept beside the store.

State mapping (run -> A2A ``TaskState``)::

    queued                        SUBMITTED
    running, waiting_children     WORKING
    waiting_approval              WORKING   (status message: waiting for approval)
    succeeded                     COMPLETED (the output as the artifact "output")
    failed, dead_letter           FAILED    (status message "CODE: message", metadata.error)
    cancelled                     CANCELED

A message's text parts are the run's input; ``contextId`` is the Corral session
(one is made when the message has none, so a follow-up continues the conversation);
``messageId`` is the run's idempotency key (a client retry never starts a second
run). File and data parts are refused (``ContentTypeNotSupportedError``).

``ListTasks`` lists the runs of the endpoint's agent in the caller's namespace, newest
first (by creation; ``Store.list_runs``), filtered in the store: ``contextId`` is the
session, ``status`` maps back through the table above (WORKING: running, waiting for
children or for approval; FAILED: failed or dead-lettered; a state no run has, such as
INPUT_REQUIRED, lists nothing), ``statusTimestampAfter`` compares the status timestamp
(``RunRecord.status_at``: finished, else started, else created). ``pageToken`` is the
keyset position ``(created_at, id)`` of the previous page's last task, base64url JSON,
checked strictly (anything else is ``InvalidParamsError``). ``totalSize`` is exact: one
``COUNT`` over the same filters (``Store.count_matching_runs``), read beside the page,
so a run submitted between the two reads may be counted and not listed.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator
from contextlib import aclosing, contextmanager, suppress
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event as A2AEvent
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types.a2a_pb2 import (
    AgentCard,
    Artifact,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE
from a2a.utils.errors import (
    A2AError,
    ContentTypeNotSupportedError,
    ExtendedAgentCardNotConfiguredError,
    InternalError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.task import apply_history_length, validate_history_length, validate_page_size
from google.protobuf.json_format import ParseDict, ParseError
from google.protobuf.message import DecodeError
from google.protobuf.struct_pb2 import Struct, Value
from starlette.requests import Request

from corral.api.common import ID_PATTERN, surrogate_path
from corral.core.errors import ConflictError, NotFoundError, UserError
from corral.core.events import ApprovalRequestedData, Event, TextDeltaData, ToolCallData
from corral.core.ids import new_id
from corral.core.runs import RunRecord, RunState
from corral.core.sessions import check_session_id
from corral.runtime import operations
from corral.runtime.follow import RunFollower, Until
from corral.server import pagination
from corral.server.context import ServerContext
from corral.store.base import StoreError

log = logging.getLogger("corral.server")
P = ParamSpec("P")
T = TypeVar("T")

#: the key of :class:`Caller` in the SDK's ``ServerCallContext.state``
CALLER = "corral_caller"
#: the key of the HTTP request there (a blocking send stops waiting when its client left)
REQUEST = "corral_request"
#: the longest messageId taken (it becomes the run's idempotency key)
MAX_MESSAGE_ID_CHARS = 200
#: the deepest JSON output answered as a data part: protobuf decodes 100 message levels, a
#: JSON level takes about three (Value, Struct or ListValue) and the answer's envelope more
MAX_DATA_DEPTH = 24
#: the longest ListTasks pageToken taken (the server's own are well under it)
MAX_PAGE_TOKEN_CHARS = 512
#: a run id, as a page token may name one (the runs table keeps 64 characters)
_RUN_ID = re.compile(ID_PATTERN.removesuffix("$") + r"\Z")
MAX_RUN_ID_CHARS = 64

_STATES: dict[RunState, TaskState] = {
    RunState.QUEUED: TaskState.TASK_STATE_SUBMITTED,
    RunState.RUNNING: TaskState.TASK_STATE_WORKING,
    RunState.WAITING_CHILDREN: TaskState.TASK_STATE_WORKING,
    RunState.WAITING_APPROVAL: TaskState.TASK_STATE_WORKING,
    RunState.SUCCEEDED: TaskState.TASK_STATE_COMPLETED,
    RunState.FAILED: TaskState.TASK_STATE_FAILED,
    RunState.DEAD_LETTER: TaskState.TASK_STATE_FAILED,
    RunState.CANCELLED: TaskState.TASK_STATE_CANCELED,
}


@dataclass(frozen=True)
class Caller:
    """Whom an A2A request is for: the agent of the URL, in the token's namespace."""

    namespace: str
    agent: str


def shown(value: str, limit: int = 80) -> str:
    """A caller's id as an error message quotes it: its repr, cut to ``limit`` characters
    (the answer, and the SDK's log line of it, never grow with what the caller sent)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 4]}...'"


def is_run_id(value: str) -> bool:
    """Whether ``value`` is an id a run may have: what the ``/v1`` task routes take."""
    return len(value) <= MAX_RUN_ID_CHARS and _RUN_ID.match(value) is not None


def task_state(state: RunState) -> TaskState:
    """The A2A state of a run state (see the module docstring)."""
    return _STATES[state]


def run_states(state: TaskState) -> list[RunState] | None:
    """The run states an A2A state filter selects: ``None`` for no filter (UNSPECIFIED),
    none for a state no run has (INPUT_REQUIRED, REJECTED, AUTH_REQUIRED)."""
    if state == TaskState.TASK_STATE_UNSPECIFIED:
        return None
    if state not in TaskState.values():
        raise InvalidParamsError(f"status {state} is not a task state")
    return [run for run, task in _STATES.items() if task == state]


def page_token(record: RunRecord) -> str:
    """The ListTasks page token after ``record``: its keyset position, opaque to clients."""
    return pagination.encode((record.created_at, record.id))


def page_position(token: str) -> tuple[float, str]:
    """The keyset position of a ListTasks page token; ``InvalidParamsError`` for one this
    server did not issue (garbage, another shape, a value no run has)."""
    refused = InvalidParamsError("pageToken is not one this server issued: list from the start")
    if len(token) > MAX_PAGE_TOKEN_CHARS:
        raise refused
    try:
        created_at, run_id = pagination.parse(token, (float, str))
    except pagination.NotACursorError:
        raise refused from None
    if created_at < 0 or not is_run_id(run_id):
        raise refused
    return created_at, run_id


def _struct(data: dict[str, Any]) -> Struct:
    struct = Struct()
    struct.update(json.loads(json.dumps(data, default=str)))
    return struct


def _agent_message(record: RunRecord, text: str, **metadata: Any) -> Message:
    message = Message(
        message_id=new_id("msg"),
        context_id=record.session_id or "",
        task_id=record.id,
        role=Role.ROLE_AGENT,
        parts=[Part(text=text)],
    )
    if metadata:
        message.metadata.CopyFrom(_struct(metadata))
    return message


def output_part(output: Any) -> Part:
    """A run's output as one part: text as a text part, JSON data as a data part - as its
    JSON text when it nests deeper than :data:`MAX_DATA_DEPTH`."""
    if isinstance(output, str):
        return Part(text=output)
    data = json.loads(json.dumps(output, default=str))
    if json_depth(data) <= MAX_DATA_DEPTH:
        value = Value()
        # protobuf refusing it anyway (the bound above should prevent it): JSON text below
        with suppress(ParseError, DecodeError):
            ParseDict(data, value)
            return Part(data=value, media_type="application/json")
    return Part(text=json.dumps(data, ensure_ascii=False), media_type="application/json")


def json_depth(data: Any) -> int:
    """How deep JSON data nests (a scalar: 0), without recursion."""
    deepest, stack = 0, [(data, 0)]
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(value, dict):
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
    return deepest


def output_artifact(record: RunRecord) -> Artifact:
    """The output of a succeeded run, as the artifact ``output``."""
    return Artifact(artifact_id="output", name="output", parts=[output_part(record.output)])


def task_status(record: RunRecord) -> TaskStatus:
    """The run's state, with a status message where there is something to say."""
    status = TaskStatus(state=task_state(record.state))
    # to the microsecond, rounded down: a client's statusTimestampAfter of a task's own
    # timestamp lists that task (RunRecord.status_at is what ListTasks compares)
    status.timestamp.FromMicroseconds(math.floor(record.status_at * 1_000_000))
    if record.state in (RunState.FAILED, RunState.DEAD_LETTER):
        error = record.error or {"code": record.state.value, "message": "the run failed"}
        text = f"{error.get('code', 'error')}: {error.get('message', '')}"
        status.message.CopyFrom(_agent_message(record, text, error=error))
    elif record.state is RunState.WAITING_APPROVAL:
        tools = ", ".join(p.tool for p in record.pending_approvals) or "a tool call"
        text = f"waiting for a human to approve {tools}"
        status.message.CopyFrom(_agent_message(record, text, corral_state=record.state.value))
    elif record.cancel_requested and not record.state.finished:
        status.message.CopyFrom(_agent_message(record, "cancel requested"))
    return status


def to_task(record: RunRecord) -> Task:
    """A run as an A2A task: state, output artifact, and its text history."""
    task = Task(id=record.id, context_id=record.session_id or "", status=task_status(record))
    task.metadata.CopyFrom(
        _struct({"corral": {"state": record.state.value, "agent": record.agent}})
    )
    if record.state is RunState.SUCCEEDED and record.output is not None:
        task.artifacts.append(output_artifact(record))
    for index, message in enumerate(record.messages):
        if message.role in ("user", "assistant") and message.content:
            role = Role.ROLE_USER if message.role == "user" else Role.ROLE_AGENT
            task.history.append(
                Message(
                    message_id=f"{record.id}-{index}",  # the same in every answer
                    context_id=task.context_id,
                    task_id=record.id,
                    role=role,
                    parts=[Part(text=message.content)],
                )
            )
    if not task.history:
        user = Message(
            message_id=f"{record.id}-input", role=Role.ROLE_USER, parts=[Part(text=record.input)]
        )
        user.task_id, user.context_id = record.id, task.context_id
        task.history.append(user)
    return task


def input_text(message: Message) -> str:
    """The run input of an A2A message: its text parts; anything else is refused."""
    texts: list[str] = []
    for index, part in enumerate(message.parts):
        kind = part.WhichOneof("content")
        if kind != "text":
            raise ContentTypeNotSupportedError(
                f"part {index} is {kind or 'empty'}: Corral agents take text parts only"
            )
        texts.append(part.text)
    text = "\n".join(texts)
    if not text.strip():
        raise InvalidParamsError("the message has no text: send at least one text part")
    if "\x00" in text or surrogate_path(text) is not None:
        raise InvalidParamsError("the message text holds NUL or a lone surrogate")
    return text


@contextmanager
def internal_errors() -> Iterator[None]:
    """What is not an A2A error becomes a plain internal one: the SDK would answer
    ``str(exc)`` (a driver's message, a path) to the client; the details go to the log."""
    try:
        yield
    except A2AError:
        raise
    except StoreError as exc:
        log.warning("A2A request: the store could not complete %s", exc.message)
        raise InternalError("the store could not complete the request; try again") from None
    except Exception:
        log.exception("A2A request failed")
        raise InternalError("internal error; see the server log") from None


def _answered(
    method: Callable[P, Coroutine[Any, Any, T]],
) -> Callable[P, Coroutine[Any, Any, T]]:
    """A handler method with :func:`internal_errors`."""

    @functools.wraps(method)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        with internal_errors():
            return await method(*args, **kwargs)

    return wrapper


def _streamed(
    method: Callable[P, AsyncGenerator[T, None]],
) -> Callable[P, AsyncGenerator[T, None]]:
    """A streaming handler method with :func:`internal_errors`."""

    @functools.wraps(method)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> AsyncGenerator[T, None]:
        with internal_errors():
            async with aclosing(method(*args, **kwargs)) as items:
                async for item in items:
                    yield item

    return wrapper


def _caller(context: ServerCallContext) -> Caller:
    caller = context.state.get(CALLER)
    if not isinstance(caller, Caller):  # the routes always set it: a bug if not
        raise UnsupportedOperationError("no caller")
    return caller


class CorralRequestHandler(RequestHandler):
    """The A2A operations over Corral runs; see the module docstring."""

    def __init__(
        self,
        context: ServerContext,
        extended_card: Callable[[Caller], AgentCard] | None = None,
    ) -> None:
        self.server = context
        #: the card a viewer gets from GetExtendedAgentCard
        self.extended_card = extended_card

    # ------------------------------------------------------------------ helpers

    async def _run(self, task_id: str, caller: Caller) -> RunRecord:
        """The run of this agent; ``TaskNotFoundError`` for another namespace's or agent's,
        and for an id no run can have (the ``/v1`` rule: NUL, a newline or a lone surrogate
        never reaches the store, where PostgreSQL would refuse it)."""
        if not is_run_id(task_id):
            raise TaskNotFoundError(f"task {shown(task_id)} not found")
        try:
            record = await operations.get_run(
                self.server.store, task_id, namespace=caller.namespace
            )
        except NotFoundError:
            raise TaskNotFoundError(f"task {shown(task_id)} not found") from None
        if record.agent != caller.agent:
            raise TaskNotFoundError(f"task {shown(task_id)} not found")
        return record

    async def _submit(self, params: SendMessageRequest, caller: Caller) -> RunRecord:
        message = params.message
        if message.task_id:
            await self._run(message.task_id, caller)  # 404 for a task not ours
            raise UnsupportedOperationError(
                "a Corral task takes no further messages: send a new message with its contextId"
            )
        text = input_text(message)
        if len(message.message_id) > MAX_MESSAGE_ID_CHARS:
            raise InvalidParamsError(f"messageId is longer than {MAX_MESSAGE_ID_CHARS} characters")
        if "\x00" in message.message_id:  # as the API's idempotency key: no store keeps NUL
            raise InvalidParamsError("messageId holds NUL")
        session = message.context_id or new_id("ctx")
        try:
            record, _ = await operations.submit(
                self.server.store,
                caller.agent,
                text,
                namespace=caller.namespace,
                session=session,
                idempotency_key=f"a2a:{message.message_id}" if message.message_id else None,
                bus=self.server.bus,
            )
        except NotFoundError:  # the agent was deleted since the route looked
            raise InvalidParamsError(f"agent {caller.agent!r} not found") from None
        except (ConflictError, UserError) as exc:  # a context of another agent, a bad id
            raise InvalidParamsError(f"contextId {shown(session)}: {exc.message}") from None
        return record

    def _follower(self, run_id: str, until: Until, after: int = 0) -> RunFollower:
        return RunFollower(
            self.server.store,
            self.server.bus,
            run_id,
            after=after,
            until=until,
            poll_seconds=self.server.poll_seconds,
            stop=self.server.followers_stop,
            fan_out=self.server.fan_out,
        )

    async def _current(self, record: RunRecord) -> RunRecord:
        return await self.server.store.get_run(record.id) or record

    # ------------------------------------------------------------------ messages

    @_answered
    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        caller = _caller(context)
        validate_history_length(params.configuration)
        record = await self._submit(params, caller)
        if not params.configuration.return_immediately:
            request = context.state.get(REQUEST)
            assert isinstance(request, Request)  # the routes' context builder sets it
            seconds = self.server.max_prompt_timeout_seconds
            record = await self.server.settle(record.id, seconds, request) or record
        task = to_task(record)
        return apply_history_length(task, params.configuration)

    @_streamed
    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[A2AEvent]:
        caller = _caller(context)
        record = await self._submit(params, caller)
        async for event in self._stream(record):
            yield event

    @_streamed
    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[A2AEvent]:
        record = await self._run(params.id, _caller(context))
        if record.state.finished:
            raise UnsupportedOperationError(f"task {record.id} has finished: use GetTask")
        async for event in self._stream(record):
            yield event

    async def _stream(self, record: RunRecord) -> AsyncGenerator[A2AEvent]:
        """The task, then each run event as a status update, then the outcome."""
        yield to_task(record)
        follower = self._follower(record.id, Until.FINISHED)
        async for batch in follower.batches():
            for event in batch:
                yield self._update(record, event)
        if not follower.ended:  # the server shuts down: the client resubscribes
            return
        final = await self._current(record)
        if final.state is RunState.SUCCEEDED and final.output is not None:
            yield TaskArtifactUpdateEvent(
                task_id=final.id,
                context_id=final.session_id or "",
                artifact=output_artifact(final),
                last_chunk=True,
            )
        yield TaskStatusUpdateEvent(
            task_id=final.id, context_id=final.session_id or "", status=task_status(final)
        )

    @staticmethod
    def _update(record: RunRecord, event: Event) -> TaskStatusUpdateEvent:
        """One run event as a WORKING status update; the event in ``metadata.corral``."""
        status = TaskStatus(state=TaskState.TASK_STATE_WORKING)
        status.timestamp.FromSeconds(int(event.ts))
        text = None
        match event.data:
            case TextDeltaData(text=delta):
                text = delta
            case ToolCallData(tool=tool):
                text = f"calling {tool}"
            case ApprovalRequestedData(tool=tool):
                text = f"waiting for a human to approve {tool}"
            case _:
                pass  # (the other events go out as a WORKING update without a message)
        if text:
            status.message.CopyFrom(_agent_message(record, text))
        update = TaskStatusUpdateEvent(
            task_id=record.id, context_id=record.session_id or "", status=status
        )
        update.metadata.CopyFrom(_struct({"corral": {"event": event.type.value, "seq": event.seq}}))
        return update

    # ------------------------------------------------------------------ tasks

    @_answered
    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        validate_history_length(params)
        record = await self._run(params.id, _caller(context))
        return apply_history_length(to_task(record), params)

    @_answered
    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        caller = _caller(context)
        await self._run(params.id, caller)
        try:
            record = await operations.cancel(
                self.server.store, params.id, namespace=caller.namespace, bus=self.server.bus
            )
        except ConflictError as exc:
            raise TaskNotCancelableError(exc.message) from None
        # answered at once: a running run stops at its worker's next heartbeat, seconds
        # later; until then the task is WORKING with the status message "cancel requested"
        # (A2A has no cancelling state), and GetTask or a subscription sees it CANCELED
        return to_task(record)

    @_answered
    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        caller = _caller(context)
        validate_history_length(params)
        size = DEFAULT_LIST_TASKS_PAGE_SIZE
        if params.HasField("page_size"):
            validate_page_size(params.page_size)  # 1 to 100, as the specification says
            size = params.page_size
        before = page_position(params.page_token) if params.page_token else None
        states = run_states(params.status)
        session = None
        if params.context_id:
            try:
                session = check_session_id(params.context_id)
            except UserError as exc:
                message = f"contextId {shown(params.context_id)}: {exc.message}"
                raise InvalidParamsError(message) from None
        status_since = None
        if params.HasField("status_timestamp_after"):
            after = params.status_timestamp_after
            status_since = after.seconds + after.nanos / 1e9
        if states == []:  # a state no run has
            return ListTasksResponse(page_size=size, total_size=0)
        store, namespace, agent = self.server.store, caller.namespace, caller.agent
        records = await store.list_runs(
            namespace,
            agent,
            size + 1,
            states,
            before=before,
            session=session,
            status_since=status_since,
        )
        total = await store.count_matching_runs(
            namespace, agent, states, session=session, status_since=status_since
        )
        more = len(records) > size
        page = records[:size]
        answer = ListTasksResponse(
            next_page_token=page_token(page[-1]) if more else "",
            page_size=size,
            total_size=total,
        )
        for record in page:
            task = to_task(record)
            if not params.include_artifacts:
                task.ClearField("artifacts")
            answer.tasks.append(apply_history_length(task, params))
        return answer

    # ------------------------------------------------------------------ not offered

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        """The full card, to a viewer, when the public one is served without a token
        (``CORRAL_A2A_PUBLIC_CARDS``): the A2A authenticated extended card."""
        if not self.server.settings.a2a_public_cards or self.extended_card is None:
            raise ExtendedAgentCardNotConfiguredError
        return self.extended_card(_caller(context))
