"""Every call of the HTTP API as data: what to send and how to read the answer.

Each function here returns a :class:`Call`: the method, path, parameters and
body of one request, and the function that turns its response into a model of
:mod:`corral.api` (or the :class:`Pages` of a list, or a run's event stream to
:class:`Follow`). Each is also the method of the same name of
:class:`~corral.client.Client` and :class:`~corral.client.AsyncClient`
(:mod:`corral.client.methods`), its signature and docstring theirs; the clients
only send calls, so the two cannot disagree about a path, a parameter or a body:
the API's knowledge lives here once, and neither sync nor async I/O does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, Protocol, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from corral.api import (
    RESOURCE_OUT,
    AgentMessageOut,
    AgentMessagePage,
    ApplyResult,
    ApprovalOut,
    ApprovalPage,
    CapabilitiesOut,
    EventOut,
    EventPage,
    Health,
    LinkInfo,
    LinkPage,
    MemoryEntryOut,
    MemoryEntryPage,
    MemoryIngestOut,
    MemorySearchResult,
    MemoryStatsOut,
    Readiness,
    ResourceOut,
    ResourcePage,
    SessionMessageOut,
    SessionMessagePage,
    SessionOut,
    SessionPage,
    Task,
    TaskDetail,
    TaskPage,
    TokenCreated,
    TokenOut,
    TokenPage,
)
from corral.core.memory import MemoryScope
from corral.resources.kinds import STORED

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
M = TypeVar("M", bound=BaseModel)

Params = list[tuple[str, str | int | float | bool | None]]
#: Documents to apply: YAML text, one document, or a list of documents.
Documents = str | Mapping[str, Any] | Sequence[Mapping[str, Any]]


class Page(Protocol[T_co]):
    """A page of a list: its items and where the next page starts (``None``: no more)."""

    @property
    def items(self) -> Sequence[T_co]: ...

    @property
    def next_cursor(self) -> str | None: ...


@dataclass(frozen=True)
class Call(Generic[T_co]):
    """One request and how to read its answer; ``timeout`` overrides the client's."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T_co]
    params: Params = field(default_factory=Params)
    json: Any = None
    content: str | None = None
    headers: dict[str, str] = field(default_factory=dict[str, str])
    timeout: float | None = None
    #: statuses whose body is the answer although they are not 2xx (readiness: 503)
    accept: tuple[int, ...] = ()


class Source(Generic[T_co]):
    """What a client iterates rather than sends: a list's pages (:class:`Pages`) or a
    run's event stream (:class:`Follow`)."""


@dataclass(frozen=True)
class Pages(Source[T_co]):
    """Every item of a list, page after page: ``call`` asks for the page at a cursor
    (``None``: the first)."""

    call: Callable[[str | None], Call[Page[T_co]]]

    @staticmethod
    def next_cursor(page: Page[Any]) -> str | None:
        """Where the page after ``page`` starts; ``None`` when there is none (an empty
        page ends the list too, whatever its cursor)."""
        return page.next_cursor if page.items else None


@dataclass(frozen=True)
class Follow(Source[EventOut]):
    """A run's event stream to follow from after ``after`` (the client reconnects as
    :class:`~corral.client.wire.EventStream` says)."""

    path: str
    after: int
    max_reconnects: int
    reconnect_seconds: float | None


class Submitted(NamedTuple):
    """A submitted task, and whether this call created it (``False``: the idempotency
    key was seen before and ``task`` is the first task submitted with it)."""

    task: Task
    created: bool


# An answer holds what the server stored: apply-only checks (e.g. an http tool's url, made
# stricter since it was stored) are not run on it again (the STORED validation context).
def _model(model: type[M]) -> Callable[[httpx.Response], M]:
    def parse(response: httpx.Response) -> M:
        return model.model_validate_json(response.content, context=STORED)

    return parse


def _resource(response: httpx.Response) -> ResourceOut:
    return RESOURCE_OUT.validate_json(response.content, context=STORED)


def _nothing(response: httpx.Response) -> None:
    return None


def _seg(value: str) -> str:
    """A path segment: ids and names come from callers, so they are quoted."""
    return quote(value, safe="")


def _paging(limit: int | None, cursor: str | None) -> Params:
    params: Params = []
    if limit is not None:
        params.append(("limit", limit))
    if cursor is not None:
        params.append(("cursor", cursor))
    return params


def _states(states: str | Sequence[str] | None) -> Params:
    if states is None:
        return []
    return [("state", s) for s in ([states] if isinstance(states, str) else states)]


# --------------------------------------------------------------------------- operations


def health() -> Call[Health]:
    """Liveness (no token needed)."""
    return Call("GET", "/healthz", _model(Health))


def ready() -> Call[Readiness]:
    """Readiness: ``not_ready`` while the server shuts down or its store is down."""
    return Call("GET", "/readyz", _model(Readiness), accept=(503,))


# --------------------------------------------------------------------------- resources


def apply(documents: Documents, *, dry_run: bool = False) -> Call[ApplyResult]:
    """Apply YAML text, one document or a list of them; all or nothing. With ``dry_run``
    the outcomes say what applying would do, and nothing is stored."""
    params: Params = [("dry_run", True)] if dry_run else []
    if isinstance(documents, str):
        return Call(
            "POST",
            "/v1/resources",
            _model(ApplyResult),
            params=params,
            content=documents,
            headers={"Content-Type": "application/yaml"},
        )
    body = dict(documents) if isinstance(documents, Mapping) else [dict(d) for d in documents]
    return Call("POST", "/v1/resources", _model(ApplyResult), params=params, json=body)


def list_resources(
    kind: str | None = None,
    *,
    selector: str | None = None,
    limit: int | None = None,
    cursor: str | None = None,
) -> Call[ResourcePage]:
    """A page of resources (of ``kind``, whose labels match ``selector``: ``team=a,!old``)."""
    params: Params = [("kind", kind)] if kind is not None else []
    if selector is not None:
        params.append(("selector", selector))
    return Call("GET", "/v1/resources", _model(ResourcePage), params + _paging(limit, cursor))


def iter_resources(
    kind: str | None = None, *, selector: str | None = None, page_size: int = 100
) -> Pages[ResourceOut]:
    """Every resource (of ``kind``, matching ``selector``), page after page."""
    return Pages(lambda c: list_resources(kind, selector=selector, limit=page_size, cursor=c))


def get_resource(kind: str, name: str) -> Call[ResourceOut]:
    return Call("GET", f"/v1/resources/{_seg(kind)}/{_seg(name)}", _resource)


def delete_resource(kind: str, name: str) -> Call[None]:
    """Delete; ``ConflictError`` while another resource references it."""
    return Call("DELETE", f"/v1/resources/{_seg(kind)}/{_seg(name)}", _nothing)


def delete_resources(keys: Sequence[tuple[str, str]]) -> Call[None]:
    """Delete ``(kind, name)`` resources together, all or none (references among them do
    not hold them back); ``ConflictError`` while a resource not among them references one."""
    body = {"items": [{"kind": kind, "name": name} for kind, name in keys]}
    return Call("POST", "/v1/resources/delete", _nothing, json=body)


# --------------------------------------------------------------------------- tasks


def submit(
    agent: str,
    input: str,
    *,
    session: str | None = None,
    idempotency_key: str | None = None,
    priority: int = 0,
    delay_seconds: float = 0.0,
    output_schema: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Call[Submitted]:
    """Queue a run (with ``labels``: ``{key: value}``); ``created`` is false when the
    idempotency key was seen before."""
    body: dict[str, Any] = {"agent": agent, "input": input}
    if session is not None:
        body["session"] = session
    if idempotency_key is not None:
        body["idempotency_key"] = idempotency_key
    if priority:
        body["priority"] = priority
    if delay_seconds:
        body["delay_seconds"] = delay_seconds
    if output_schema is not None:
        body["output_schema"] = dict(output_schema)
    if labels:
        body["labels"] = dict(labels)

    def parse(response: httpx.Response) -> Submitted:
        task = Task.model_validate_json(response.content)
        return Submitted(task, response.status_code == 201)

    return Call("POST", "/v1/tasks", parse, json=body)


def list_tasks(
    *,
    state: str | Sequence[str] | None = None,
    agent: str | None = None,
    selector: str | None = None,
    limit: int | None = None,
    cursor: str | None = None,
) -> Call[TaskPage]:
    """A page of tasks (in ``state``, of ``agent``, whose labels match ``selector``:
    ``"team=ml,!draft"``)."""
    params = _states(state) + ([("agent", agent)] if agent is not None else [])
    if selector is not None:
        params.append(("selector", selector))
    return Call("GET", "/v1/tasks", _model(TaskPage), params + _paging(limit, cursor))


def iter_tasks(
    *,
    state: str | Sequence[str] | None = None,
    agent: str | None = None,
    selector: str | None = None,
    page_size: int = 50,
) -> Pages[Task]:
    """Every task (newest first, matching ``selector``), page after page."""
    return Pages(
        lambda c: list_tasks(state=state, agent=agent, selector=selector, limit=page_size, cursor=c)
    )


def get_task(task_id: str) -> Call[TaskDetail]:
    return Call("GET", f"/v1/tasks/{_seg(task_id)}", _model(TaskDetail))


def task_children(task_id: str) -> Call[TaskPage]:
    """The tasks the task's ``agents_exec`` calls started, oldest first (one page)."""
    return Call("GET", f"/v1/tasks/{_seg(task_id)}/children", _model(TaskPage))


def submit_system(
    system: str,
    input: str,
    *,
    idempotency_key: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> Call[Submitted]:
    """Queue a run of the AgentSystem ``system``; ``created`` is false when the
    idempotency key was seen before."""
    body: dict[str, Any] = {"input": input}
    if idempotency_key is not None:
        body["idempotency_key"] = idempotency_key
    if labels:
        body["labels"] = dict(labels)

    def parse(response: httpx.Response) -> Submitted:
        task = Task.model_validate_json(response.content)
        return Submitted(task, response.status_code == 201)

    return Call("POST", f"/v1/systems/{_seg(system)}/tasks", parse, json=body)


def task_messages(
    task_id: str, *, limit: int | None = None, cursor: str | None = None
) -> Call[AgentMessagePage]:
    """A page of a system task's agent messages, oldest first."""
    return Call(
        "GET",
        f"/v1/tasks/{_seg(task_id)}/messages",
        _model(AgentMessagePage),
        _paging(limit, cursor),
    )


def iter_task_messages(task_id: str, *, page_size: int = 50) -> Pages[AgentMessageOut]:
    """Every agent message of a system task, page after page."""
    return Pages(lambda c: task_messages(task_id, limit=page_size, cursor=c))


def cancel_task(task_id: str) -> Call[Task]:
    return Call("POST", f"/v1/tasks/{_seg(task_id)}/cancel", _model(Task))


def events(
    run_id: str, *, after: int = 0, cursor: str | None = None, limit: int | None = None
) -> Call[EventPage]:
    """One page of stored events; ``next_cursor`` is null once the run finished."""
    params: Params = [("after", after)] if after else []
    return Call(
        "GET",
        events_path(run_id),
        _model(EventPage),
        params + _paging(limit, cursor),
        headers={"Accept": "application/json"},
    )


def events_path(run_id: str) -> str:
    return f"/v1/runs/{_seg(run_id)}/events"


def follow(
    run_id: str,
    *,
    after: int = 0,
    max_reconnects: int = 10,
    reconnect_seconds: float | None = None,
) -> Follow:
    """The run's events as they happen, until the run finishes (the stream's ``end``).

    A stream that ends early (a network failure, a server shutting down, a 5xx or
    429) is reopened with ``Last-Event-ID``: every event arrives once, in order.
    After ``max_reconnects`` attempts in a row without a new event it raises
    ``ApiConnectionError`` (or the server's error); a 404 or 401 raises at once.
    """
    return Follow(events_path(run_id), after, max_reconnects, reconnect_seconds)


# --------------------------------------------------------------------------- approvals


def list_approvals(
    *,
    state: str | Sequence[str] | None = None,
    run_id: str | None = None,
    limit: int | None = None,
    cursor: str | None = None,
) -> Call[ApprovalPage]:
    params = _states(state) + ([("run_id", run_id)] if run_id is not None else [])
    return Call("GET", "/v1/approvals", _model(ApprovalPage), params + _paging(limit, cursor))


def iter_approvals(
    *,
    state: str | Sequence[str] | None = None,
    run_id: str | None = None,
    page_size: int = 100,
) -> Pages[ApprovalOut]:
    """Every approval (oldest first), page after page."""
    return Pages(lambda c: list_approvals(state=state, run_id=run_id, limit=page_size, cursor=c))


def get_approval(approval_id: str) -> Call[ApprovalOut]:
    return Call("GET", f"/v1/approvals/{_seg(approval_id)}", _model(ApprovalOut))


def approve(approval_id: str, reason: str | None = None) -> Call[ApprovalOut]:
    """The run resumes and the call runs once; ``ConflictError`` if already decided."""
    return _decide(approval_id, "approve", reason)


def reject(approval_id: str, reason: str | None = None) -> Call[ApprovalOut]:
    """The model is told (with ``reason``) and the run goes on without the call."""
    return _decide(approval_id, "reject", reason)


def _decide(approval_id: str, verb: str, reason: str | None) -> Call[ApprovalOut]:
    body = {"reason": reason} if reason is not None else {}
    return Call("POST", f"/v1/approvals/{_seg(approval_id)}/{verb}", _model(ApprovalOut), json=body)


# --------------------------------------------------------------------------- sessions


def list_sessions(
    *, agent: str | None = None, limit: int | None = None, cursor: str | None = None
) -> Call[SessionPage]:
    params: Params = [("agent", agent)] if agent is not None else []
    return Call("GET", "/v1/sessions", _model(SessionPage), params + _paging(limit, cursor))


def iter_sessions(*, agent: str | None = None, page_size: int = 100) -> Pages[SessionOut]:
    return Pages(lambda c: list_sessions(agent=agent, limit=page_size, cursor=c))


def get_session(session_id: str) -> Call[SessionOut]:
    return Call("GET", f"/v1/sessions/{_seg(session_id)}", _model(SessionOut))


def session_messages(
    session_id: str,
    *,
    include_hidden: bool = False,
    limit: int | None = None,
    cursor: str | None = None,
) -> Call[SessionMessagePage]:
    params: Params = [("include_hidden", "true")] if include_hidden else []
    return Call(
        "GET",
        f"/v1/sessions/{_seg(session_id)}/messages",
        _model(SessionMessagePage),
        params + _paging(limit, cursor),
    )


def iter_session_messages(
    session_id: str, *, include_hidden: bool = False, page_size: int = 100
) -> Pages[SessionMessageOut]:
    """The session's messages in conversation order, page after page."""
    return Pages(
        lambda c: session_messages(
            session_id, include_hidden=include_hidden, limit=page_size, cursor=c
        )
    )


def delete_session(session_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/sessions/{_seg(session_id)}", _nothing)


# --------------------------------------------------------------------------- memories


def memory_stats(name: str) -> Call[MemoryStatsOut]:
    """What a Memory holds (every scope) and how it is searched."""
    return Call("GET", f"/v1/memories/{_seg(name)}", _model(MemoryStatsOut))


def memory_entries(
    name: str,
    *,
    prefix: str = "",
    agent: str | None = None,
    session: str | None = None,
    system_run: str | None = None,
    limit: int | None = None,
    cursor: str | None = None,
) -> Call[MemoryEntryPage]:
    """A page of a Memory's entries, by key."""
    params: Params = [("prefix", prefix)] if prefix else []
    params += MemoryScope(agent, session, system_run).query()
    return Call(
        "GET",
        f"/v1/memories/{_seg(name)}/entries",
        _model(MemoryEntryPage),
        params + _paging(limit, cursor),
    )


def iter_memory_entries(
    name: str,
    *,
    prefix: str = "",
    agent: str | None = None,
    session: str | None = None,
    system_run: str | None = None,
    page_size: int = 100,
) -> Pages[MemoryEntryOut]:
    """A Memory's entries by key, page after page."""
    return Pages(
        lambda c: memory_entries(
            name,
            prefix=prefix,
            agent=agent,
            session=session,
            system_run=system_run,
            limit=page_size,
            cursor=c,
        )
    )


def write_memory(
    name: str,
    text: str,
    *,
    key: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    agent: str | None = None,
    session: str | None = None,
    system_run: str | None = None,
) -> Call[MemoryEntryOut]:
    """Write one entry (replacing the entry of ``key``; a new key without one)."""
    body: dict[str, Any] = {"text": text, **MemoryScope(agent, session, system_run).fields()}
    if key is not None:
        body["key"] = key
    if metadata:
        body["metadata"] = dict(metadata)
    return Call("POST", f"/v1/memories/{_seg(name)}/entries", _model(MemoryEntryOut), json=body)


def ingest_memory(
    name: str,
    text: str,
    *,
    source: str = "api",
    key_prefix: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    agent: str | None = None,
    session: str | None = None,
    system_run: str | None = None,
) -> Call[MemoryIngestOut]:
    """Cut ``text`` by the Memory's chunking, each chunk one entry ``KEY_PREFIX#N``."""
    body: dict[str, Any] = {
        "text": text,
        "source": source,
        **MemoryScope(agent, session, system_run).fields(),
    }
    if key_prefix is not None:
        body["key_prefix"] = key_prefix
    if metadata:
        body["metadata"] = dict(metadata)
    return Call("POST", f"/v1/memories/{_seg(name)}/ingest", _model(MemoryIngestOut), json=body)


def read_memory(
    name: str,
    key: str,
    *,
    agent: str | None = None,
    session: str | None = None,
    system_run: str | None = None,
) -> Call[MemoryEntryOut]:
    """One entry (``NotFoundError`` when absent: code ``memory_entry_not_found``, or
    ``not_found`` when the Memory is)."""
    path = f"/v1/memories/{_seg(name)}/entries/{_seg(key)}"
    scope: Params = [*MemoryScope(agent, session, system_run).query()]
    return Call("GET", path, _model(MemoryEntryOut), scope)


def delete_memory(
    name: str,
    key: str,
    *,
    agent: str | None = None,
    session: str | None = None,
    system_run: str | None = None,
) -> Call[None]:
    """Delete one entry (``NotFoundError`` when absent: code ``memory_entry_not_found``, or
    ``not_found`` when the Memory is)."""
    path = f"/v1/memories/{_seg(name)}/entries/{_seg(key)}"
    scope: Params = [*MemoryScope(agent, session, system_run).query()]
    return Call("DELETE", path, _nothing, scope)


def search_memory(
    name: str,
    query: str,
    *,
    top_k: int = 5,
    filter: Mapping[str, Any] | None = None,
    agent: str | None = None,
    session: str | None = None,
    system_run: str | None = None,
) -> Call[MemorySearchResult]:
    """Entries matching words of ``query``, best first (``filter``: metadata equality)."""
    body: dict[str, Any] = {
        "query": query,
        "top_k": top_k,
        **MemoryScope(agent, session, system_run).fields(),
    }
    if filter:
        body["filter"] = dict(filter)
    return Call("POST", f"/v1/memories/{_seg(name)}/search", _model(MemorySearchResult), json=body)


# --------------------------------------------------------------------------- prompts

#: added to a prompt's own timeout for the HTTP wait: the server answers 202 at its timeout
PROMPT_GRACE_SECONDS = 30.0


def prompt(
    agent: str, input: str, *, session: str | None = None, timeout_seconds: float = 60.0
) -> Call[Task]:
    """Submit and wait: the task once it finished or waits for approval, or still
    going when ``timeout_seconds`` passed first."""
    body: dict[str, Any] = {"input": input, "timeout_seconds": timeout_seconds}
    if session is not None:
        body["session"] = session
    return Call(
        "POST",
        f"/v1/agents/{_seg(agent)}/prompt",
        _model(Task),
        json=body,
        timeout=timeout_seconds + PROMPT_GRACE_SECONDS,
    )


def prompt_object(
    agent: str,
    input: str,
    *,
    schema: Mapping[str, Any] | None = None,
    session: str | None = None,
    timeout_seconds: float = 60.0,
) -> Call[Task]:
    """Like :meth:`prompt`; ``output`` is JSON valid against ``schema`` (or the
    agent's ``output_schema``)."""
    body: dict[str, Any] = {"input": input, "timeout_seconds": timeout_seconds}
    if schema is not None:
        body["schema"] = dict(schema)
    if session is not None:
        body["session"] = session
    return Call(
        "POST",
        f"/v1/agents/{_seg(agent)}/prompt-object",
        _model(Task),
        json=body,
        timeout=timeout_seconds + PROMPT_GRACE_SECONDS,
    )


# --------------------------------------------------------------------------- tokens


def links() -> Call[LinkPage]:
    """The calling agent's linked agents (a client made with ``CORRAL_AGENT_TOKEN``)."""
    return Call("GET", "/v1/links", _model(LinkPage))


def link_info(agent: str) -> Call[LinkInfo]:
    """What a linked agent is: its description, tools and output schema."""
    return Call("GET", f"/v1/links/{_seg(agent)}", _model(LinkInfo))


def link_exec(
    agent: str,
    input: str,
    *,
    session: str | None = None,
    wait: bool = True,
    timeout_seconds: float = 60.0,
    idempotency_key: str | None = None,
) -> Call[Task]:
    """Run a linked agent as a child task of the token's run: the task once it settled,
    or still going (``wait=False``, or ``timeout_seconds`` passed first). The same
    ``idempotency_key`` finds the child a retried call started."""
    body: dict[str, Any] = {"input": input, "wait": wait, "timeout_seconds": timeout_seconds}
    if session is not None:
        body["session"] = session
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
    return Call(
        "POST",
        f"/v1/links/{_seg(agent)}/exec",
        _model(Task),
        json=body,
        headers=headers,
        timeout=(timeout_seconds if wait else 0.0) + PROMPT_GRACE_SECONDS,
    )


def list_tokens(*, limit: int | None = None, cursor: str | None = None) -> Call[TokenPage]:
    return Call("GET", "/v1/tokens", _model(TokenPage), _paging(limit, cursor))


def create_token(role: str, *, name: str = "", description: str = "") -> Call[TokenCreated]:
    """A new token of this token's namespace; its secret is in ``token``, this once."""
    body = {"role": role, "name": name, "description": description}
    return Call("POST", "/v1/tokens", _model(TokenCreated), json=body)


def capabilities() -> Call[CapabilitiesOut]:
    """What the server's machine offers: the tool sandbox, wasmtime, providers, store, bus."""
    return Call("GET", "/v1/capabilities", _model(CapabilitiesOut))


def whoami() -> Call[TokenOut]:
    """This client's own token: its namespace and role (any role may ask)."""
    return Call("GET", "/v1/whoami", _model(TokenOut))


def get_token(token_id: str) -> Call[TokenOut]:
    return Call("GET", f"/v1/tokens/{_seg(token_id)}", _model(TokenOut))


def revoke_token(token_id: str) -> Call[TokenOut]:
    """Revoke; ``ConflictError`` (``own_token``) for this client's own token (a token never
    revokes itself)."""
    return Call("POST", f"/v1/tokens/{_seg(token_id)}/revoke", _model(TokenOut))
