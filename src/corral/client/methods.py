"""The client's methods, written once for :class:`~corral.client.Client` and
:class:`~corral.client.AsyncClient`.

A method here only says what to send: it returns a :class:`~corral.client.calls.Call`,
the pages of a list or a run's event stream. The descriptor it is wrapped in makes
it the method of the client it is read from: on a ``Client`` it sends the call and
returns the answer (iterates the items, follows the stream); on an ``AsyncClient``
it returns a coroutine of the answer (an async iterator). Each client provides only
its I/O (:class:`SyncIO`, :class:`AsyncIO`), so the two have one set of methods, with
one signature and one docstring each, and typing stays exact for both (``await
AsyncClient.get_task(...)`` is a ``TaskDetail``).

    Methods            the endpoints as methods        (this module)
    SyncIO | AsyncIO   send, walk pages, follow        (sync.py, aio.py)
    calls, wire        requests, answers, errors, SSE  (both)
"""

from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from types import MethodType
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, cast, overload

from corral.api import (
    ApplyResult,
    ApprovalOut,
    ApprovalPage,
    EventOut,
    EventPage,
    Health,
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
from corral.client import calls, wire
from corral.client.calls import Call, Documents, Pages, Source, Submitted

P = ParamSpec("P")
T = TypeVar("T")
#: what a method builds: a call, the pages of a list, or an event stream
B = TypeVar("B")
#: an httpx transport, sync or async
Transport = TypeVar("Transport")


class SyncIO(ABC):
    """The blocking I/O under :class:`Methods`."""

    @abstractmethod
    def send(self, call: Call[T]) -> T:
        """Send one call and read its answer (an error answer raises)."""

    @abstractmethod
    def _walk(self, pages: Pages[T]) -> Iterator[T]: ...

    @abstractmethod
    def _follow(self, stream: wire.EventStream) -> Iterator[EventOut]: ...


class AsyncIO(ABC):
    """The asyncio I/O under :class:`Methods`."""

    @abstractmethod
    async def send(self, call: Call[T]) -> T:
        """Send one call and read its answer (an error answer raises)."""

    @abstractmethod
    def _walk(self, pages: Pages[T]) -> AsyncIterator[T]: ...

    @abstractmethod
    def _follow(self, stream: wire.EventStream) -> AsyncIterator[EventOut]: ...


class _Method(Generic[P, B]):
    """A method of both clients from ``build`` (its signature and docstring)."""

    def __init__(self, build: Callable[Concatenate[Any, P], B]) -> None:
        self.build = build
        functools.update_wrapper(cast(Any, self), build)  # its name and docstring
        # what inspect and help() show of the bound method: build's parameters (its
        # return annotation, the call, is not what the method returns)
        self.signature = inspect.signature(build).replace(return_annotation=inspect.Signature.empty)

    def _bind(
        self, client: object, run: Callable[Concatenate[Any, P], object]
    ) -> Callable[..., Any]:
        functools.update_wrapper(run, self.build)
        run.__signature__ = self.signature  # type: ignore[attr-defined]
        return MethodType(run, client)


class sends(_Method[P, Call[T]]):
    """A method that sends the call it builds: the answer, or a coroutine of it."""

    @overload
    def __get__(self, client: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, client: AsyncIO, owner: type[Any]) -> Callable[P, Coroutine[Any, Any, T]]: ...
    @overload
    def __get__(self, client: SyncIO, owner: type[Any]) -> Callable[P, T]: ...
    def __get__(self, client: SyncIO | AsyncIO | None, owner: type[Any]) -> object:
        if client is None:
            return self
        build = self.build
        if isinstance(client, AsyncIO):

            async def send_async(client: AsyncIO, /, *args: P.args, **kwargs: P.kwargs) -> T:
                return await client.send(build(client, *args, **kwargs))

            return self._bind(client, send_async)

        def send(client: SyncIO, /, *args: P.args, **kwargs: P.kwargs) -> T:
            return client.send(build(client, *args, **kwargs))

        return self._bind(client, send)


class iterates(_Method[P, Source[T]]):
    """A method that iterates what it builds (a list's pages, a run's events): an
    iterator, or an async iterator."""

    @overload
    def __get__(self, client: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, client: AsyncIO, owner: type[Any]) -> Callable[P, AsyncIterator[T]]: ...
    @overload
    def __get__(self, client: SyncIO, owner: type[Any]) -> Callable[P, Iterator[T]]: ...
    def __get__(self, client: SyncIO | AsyncIO | None, owner: type[Any]) -> object:
        if client is None:
            return self
        build = self.build

        def iterate(client: SyncIO | AsyncIO, /, *args: P.args, **kwargs: P.kwargs) -> object:
            source = build(client, *args, **kwargs)
            if isinstance(source, wire.EventStream):
                return client._follow(source)
            assert isinstance(source, Pages)
            return client._walk(source)

        return self._bind(client, iterate)


class Methods(Generic[Transport]):
    """The API's endpoints as the methods of both clients (see the module docstring).

    ``base_url`` and ``token`` default to ``CORRAL_URL`` and ``CORRAL_TOKEN``.
    Errors arrive as the library's own (``NotFoundError``, ``ConflictError``,
    ``ResourceError`` with field paths, ``AuthError``, ``RateLimitedError``,
    ``ApiConnectionError``): see :mod:`corral.client.wire`. ``transport`` is
    handed to httpx (tests inject one that drops connections).
    """

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = wire.DEFAULT_TIMEOUT,
        transport: Transport | None = None,
    ) -> None:
        self.base_url, self.token = wire.resolve(base_url, token)
        options = wire.HttpOptions(
            base_url=self.base_url, headers=wire.headers(self.token), timeout=timeout
        )
        self._connect(options, transport)

    def _connect(self, options: wire.HttpOptions, transport: Transport | None) -> None:
        """Open the client's httpx client."""
        raise NotImplementedError

    # ------------------------------------------------------------------- operations

    @sends
    def health(self) -> Call[Health]:
        """Liveness (no token needed)."""
        return calls.health()

    @sends
    def ready(self) -> Call[Readiness]:
        """Readiness: ``not_ready`` while the server shuts down or its store is down."""
        return calls.ready()

    # ------------------------------------------------------------------- resources

    @sends
    def apply(self, documents: Documents) -> Call[ApplyResult]:
        """Apply YAML text, one document or a list of them; all or nothing."""
        return calls.apply(documents)

    @sends
    def list_resources(
        self, kind: str | None = None, *, limit: int | None = None, cursor: str | None = None
    ) -> Call[ResourcePage]:
        return calls.list_resources(kind, limit=limit, cursor=cursor)

    @iterates
    def iter_resources(
        self, kind: str | None = None, *, page_size: int = 100
    ) -> Pages[ResourceOut]:
        """Every resource (of ``kind``), page after page."""
        return Pages(lambda c: calls.list_resources(kind, limit=page_size, cursor=c))

    @sends
    def get_resource(self, kind: str, name: str) -> Call[ResourceOut]:
        return calls.get_resource(kind, name)

    @sends
    def delete_resource(self, kind: str, name: str) -> Call[None]:
        """Delete; ``ConflictError`` while another resource references it."""
        return calls.delete_resource(kind, name)

    # ------------------------------------------------------------------- tasks

    @sends
    def submit(
        self,
        agent: str,
        input: str,
        *,
        session: str | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
        delay_seconds: float = 0.0,
        output_schema: Mapping[str, Any] | None = None,
    ) -> Call[Submitted]:
        """Queue a run; ``created`` is false when the idempotency key was seen before."""
        return calls.submit(
            agent,
            input,
            session=session,
            idempotency_key=idempotency_key,
            priority=priority,
            delay_seconds=delay_seconds,
            output_schema=output_schema,
        )

    @sends
    def list_tasks(
        self,
        *,
        state: str | Sequence[str] | None = None,
        agent: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Call[TaskPage]:
        return calls.list_tasks(state=state, agent=agent, limit=limit, cursor=cursor)

    @iterates
    def iter_tasks(
        self,
        *,
        state: str | Sequence[str] | None = None,
        agent: str | None = None,
        page_size: int = 50,
    ) -> Pages[Task]:
        """Every task (newest first), page after page."""
        return Pages(
            lambda c: calls.list_tasks(state=state, agent=agent, limit=page_size, cursor=c)
        )

    @sends
    def get_task(self, task_id: str) -> Call[TaskDetail]:
        return calls.get_task(task_id)

    @sends
    def cancel_task(self, task_id: str) -> Call[Task]:
        return calls.cancel_task(task_id)

    @sends
    def events(
        self, run_id: str, *, after: int = 0, cursor: str | None = None, limit: int | None = None
    ) -> Call[EventPage]:
        """One page of stored events; ``next_cursor`` is null once the run finished."""
        return calls.events(run_id, after=after, cursor=cursor, limit=limit)

    @iterates
    def follow(
        self,
        run_id: str,
        *,
        after: int = 0,
        max_reconnects: int = 10,
        reconnect_seconds: float | None = None,
    ) -> Source[EventOut]:
        """The run's events as they happen, until the run finishes (the stream's ``end``).

        A stream that ends early (a network failure, a server shutting down, a 5xx or
        429) is reopened with ``Last-Event-ID``: every event arrives once, in order.
        After ``max_reconnects`` attempts in a row without a new event it raises
        ``ApiConnectionError`` (or the server's error); a 404 or 401 raises at once.
        """
        return wire.EventStream(
            calls.events_path(run_id),
            wire.StreamPosition(last_seq=after),
            wire.Reconnects(self.base_url, max_reconnects, reconnect_seconds),
        )

    # ------------------------------------------------------------------- approvals

    @sends
    def list_approvals(
        self,
        *,
        state: str | Sequence[str] | None = None,
        run_id: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Call[ApprovalPage]:
        return calls.list_approvals(state=state, run_id=run_id, limit=limit, cursor=cursor)

    @iterates
    def iter_approvals(
        self,
        *,
        state: str | Sequence[str] | None = None,
        run_id: str | None = None,
        page_size: int = 100,
    ) -> Pages[ApprovalOut]:
        """Every approval (oldest first), page after page."""
        return Pages(
            lambda c: calls.list_approvals(state=state, run_id=run_id, limit=page_size, cursor=c)
        )

    @sends
    def get_approval(self, approval_id: str) -> Call[ApprovalOut]:
        return calls.get_approval(approval_id)

    @sends
    def approve(self, approval_id: str, reason: str | None = None) -> Call[ApprovalOut]:
        """The run resumes and the call runs once; ``ConflictError`` if already decided."""
        return calls.decide(approval_id, True, reason)

    @sends
    def reject(self, approval_id: str, reason: str | None = None) -> Call[ApprovalOut]:
        """The model is told (with ``reason``) and the run goes on without the call."""
        return calls.decide(approval_id, False, reason)

    # ------------------------------------------------------------------- sessions

    @sends
    def list_sessions(
        self, *, agent: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> Call[SessionPage]:
        return calls.list_sessions(agent=agent, limit=limit, cursor=cursor)

    @iterates
    def iter_sessions(self, *, agent: str | None = None, page_size: int = 100) -> Pages[SessionOut]:
        return Pages(lambda c: calls.list_sessions(agent=agent, limit=page_size, cursor=c))

    @sends
    def get_session(self, session_id: str) -> Call[SessionOut]:
        return calls.get_session(session_id)

    @sends
    def session_messages(
        self,
        session_id: str,
        *,
        include_hidden: bool = False,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Call[SessionMessagePage]:
        return calls.session_messages(
            session_id, include_hidden=include_hidden, limit=limit, cursor=cursor
        )

    @iterates
    def iter_session_messages(
        self, session_id: str, *, include_hidden: bool = False, page_size: int = 100
    ) -> Pages[SessionMessageOut]:
        """The session's messages in conversation order, page after page."""
        return Pages(
            lambda c: calls.session_messages(
                session_id, include_hidden=include_hidden, limit=page_size, cursor=c
            )
        )

    @sends
    def delete_session(self, session_id: str) -> Call[None]:
        return calls.delete_session(session_id)

    # ------------------------------------------------------------------- prompts

    @sends
    def prompt(
        self, agent: str, input: str, *, session: str | None = None, timeout_seconds: float = 60.0
    ) -> Call[Task]:
        """Submit and wait: the task once it finished or waits for approval, or still
        going when ``timeout_seconds`` passed first."""
        return calls.prompt(agent, input, session=session, timeout_seconds=timeout_seconds)

    @sends
    def prompt_object(
        self,
        agent: str,
        input: str,
        *,
        schema: Mapping[str, Any] | None = None,
        session: str | None = None,
        timeout_seconds: float = 60.0,
    ) -> Call[Task]:
        """Like :meth:`prompt`; ``output`` is JSON valid against ``schema`` (or the
        agent's ``output_schema``)."""
        return calls.prompt_object(
            agent, input, schema=schema, session=session, timeout_seconds=timeout_seconds
        )

    # ------------------------------------------------------------------- tokens

    @sends
    def list_tokens(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> Call[TokenPage]:
        return calls.list_tokens(limit=limit, cursor=cursor)

    @sends
    def create_token(
        self, role: str, *, name: str = "", description: str = ""
    ) -> Call[TokenCreated]:
        """A new token of this token's namespace; its secret is in ``token``, this once."""
        return calls.create_token(role, name=name, description=description)

    @sends
    def get_token(self, token_id: str) -> Call[TokenOut]:
        return calls.get_token(token_id)

    @sends
    def revoke_token(self, token_id: str, *, force: bool = False) -> Call[TokenOut]:
        """Revoke; ``ConflictError`` (``own_token``) for this client's own token unless
        ``force``."""
        return calls.revoke_token(token_id, force=force)
