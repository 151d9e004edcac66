"""The blocking client of the HTTP API: :class:`Client`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx

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
from corral.client.calls import Call, Documents, Page, Submitted
from corral.core.errors import ApiError

T = TypeVar("T")


class Client:
    """A blocking client of a Corral server.

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
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url, self.token = wire.resolve(base_url, token)
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=wire.headers(self.token),
            timeout=timeout,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def send(self, call: Call[T]) -> T:
        """Send one call and read its answer (an error answer raises)."""
        timeout = call.timeout if call.timeout is not None else httpx.USE_CLIENT_DEFAULT
        try:
            response = self._http.request(
                call.method,
                call.path,
                params=call.params,
                json=call.json,
                content=call.content,
                headers=call.headers,
                timeout=timeout,
            )
        except httpx.TransportError as exc:
            raise wire.connection_error(self.base_url, exc) from None
        if response.status_code >= 400 and response.status_code not in call.accept:
            raise wire.error_from(response)
        return call.parse(response)

    def _all(self, first: Call[Page[T]], next_call: Callable[[str], Call[Page[T]]]) -> Iterator[T]:
        page = self.send(first)
        while True:
            yield from page.items
            if page.next_cursor is None or not page.items:
                return
            page = self.send(next_call(page.next_cursor))

    # ----------------------------------------------------------------------- operations

    def health(self) -> Health:
        """Liveness (no token needed)."""
        return self.send(calls.health())

    def ready(self) -> Readiness:
        """Readiness: ``not_ready`` while the server shuts down or its store is down."""
        return self.send(calls.ready())

    # ----------------------------------------------------------------------- resources

    def apply(self, documents: Documents) -> ApplyResult:
        """Apply YAML text, one document or a list of them; all or nothing."""
        return self.send(calls.apply(documents))

    def list_resources(
        self, kind: str | None = None, *, limit: int | None = None, cursor: str | None = None
    ) -> ResourcePage:
        return self.send(calls.list_resources(kind, limit=limit, cursor=cursor))

    def iter_resources(
        self, kind: str | None = None, *, page_size: int = 100
    ) -> Iterator[ResourceOut]:
        """Every resource (of ``kind``), page after page."""
        return self._all(
            calls.list_resources(kind, limit=page_size),
            lambda c: calls.list_resources(kind, limit=page_size, cursor=c),
        )

    def get_resource(self, kind: str, name: str) -> ResourceOut:
        return self.send(calls.get_resource(kind, name))

    def delete_resource(self, kind: str, name: str) -> None:
        """Delete; ``ConflictError`` while another resource references it."""
        self.send(calls.delete_resource(kind, name))

    # ----------------------------------------------------------------------- tasks

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
    ) -> Submitted:
        """Queue a run; ``created`` is false when the idempotency key was seen before."""
        return self.send(
            calls.submit(
                agent,
                input,
                session=session,
                idempotency_key=idempotency_key,
                priority=priority,
                delay_seconds=delay_seconds,
                output_schema=output_schema,
            )
        )

    def list_tasks(
        self,
        *,
        state: str | Sequence[str] | None = None,
        agent: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> TaskPage:
        return self.send(calls.list_tasks(state=state, agent=agent, limit=limit, cursor=cursor))

    def iter_tasks(
        self,
        *,
        state: str | Sequence[str] | None = None,
        agent: str | None = None,
        page_size: int = 50,
    ) -> Iterator[Task]:
        """Every task (newest first), page after page."""
        return self._all(
            calls.list_tasks(state=state, agent=agent, limit=page_size),
            lambda c: calls.list_tasks(state=state, agent=agent, limit=page_size, cursor=c),
        )

    def get_task(self, task_id: str) -> TaskDetail:
        return self.send(calls.get_task(task_id))

    def cancel_task(self, task_id: str) -> Task:
        return self.send(calls.cancel_task(task_id))

    def events(
        self, run_id: str, *, after: int = 0, cursor: str | None = None, limit: int | None = None
    ) -> EventPage:
        """One page of stored events; ``next_cursor`` is null once the run finished."""
        return self.send(calls.events(run_id, after=after, cursor=cursor, limit=limit))

    def follow(
        self,
        run_id: str,
        *,
        after: int = 0,
        max_reconnects: int = 10,
        reconnect_seconds: float | None = None,
    ) -> Iterator[EventOut]:
        """The run's events as they happen, until the run finishes (the stream's ``end``).

        A stream that ends early (a network failure, a server shutting down, a 5xx or
        429) is reopened with ``Last-Event-ID``: every event arrives once, in order.
        After ``max_reconnects`` attempts in a row without a new event it raises
        ``ApiConnectionError`` (or the server's error); a 404 or 401 raises at once.
        """
        position = wire.StreamPosition(last_seq=after)
        reconnects = wire.Reconnects(self.base_url, max_reconnects, reconnect_seconds)
        parser = wire.SseParser()
        while True:
            error: httpx.TransportError | ApiError | None = None
            try:
                for event in self._stream(run_id, position, parser):
                    reconnects.progressed()
                    yield event
                if position.ended:
                    return
            except (httpx.TransportError, ApiError) as exc:
                error = exc
            time.sleep(reconnects.wait_after(error, parser))

    def _stream(
        self, run_id: str, position: wire.StreamPosition, parser: wire.SseParser
    ) -> Iterator[EventOut]:
        timeout = httpx.Timeout(wire.DEFAULT_TIMEOUT, read=wire.STREAM_READ_TIMEOUT)
        with self._http.stream(
            "GET", calls.events_path(run_id), headers=position.request_headers(), timeout=timeout
        ) as response:
            if response.status_code >= 400:
                response.read()
                raise wire.error_from(response)
            parser.reset()
            for line in response.iter_lines():
                message = parser.feed(line)
                if message is None:
                    continue
                event = position.take(message)
                if event is not None:
                    yield event
                if position.ended:
                    return

    # ----------------------------------------------------------------------- approvals

    def list_approvals(
        self,
        *,
        state: str | Sequence[str] | None = None,
        run_id: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> ApprovalPage:
        return self.send(
            calls.list_approvals(state=state, run_id=run_id, limit=limit, cursor=cursor)
        )

    def iter_approvals(
        self,
        *,
        state: str | Sequence[str] | None = None,
        run_id: str | None = None,
        page_size: int = 100,
    ) -> Iterator[ApprovalOut]:
        """Every approval (oldest first), page after page."""
        return self._all(
            calls.list_approvals(state=state, run_id=run_id, limit=page_size),
            lambda c: calls.list_approvals(state=state, run_id=run_id, limit=page_size, cursor=c),
        )

    def get_approval(self, approval_id: str) -> ApprovalOut:
        return self.send(calls.get_approval(approval_id))

    def approve(self, approval_id: str, reason: str | None = None) -> ApprovalOut:
        """The run resumes and the call runs once; ``ConflictError`` if already decided."""
        return self.send(calls.decide(approval_id, True, reason))

    def reject(self, approval_id: str, reason: str | None = None) -> ApprovalOut:
        """The model is told (with ``reason``) and the run goes on without the call."""
        return self.send(calls.decide(approval_id, False, reason))

    # ----------------------------------------------------------------------- sessions

    def list_sessions(
        self, *, agent: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> SessionPage:
        return self.send(calls.list_sessions(agent=agent, limit=limit, cursor=cursor))

    def iter_sessions(
        self, *, agent: str | None = None, page_size: int = 100
    ) -> Iterator[SessionOut]:
        return self._all(
            calls.list_sessions(agent=agent, limit=page_size),
            lambda c: calls.list_sessions(agent=agent, limit=page_size, cursor=c),
        )

    def get_session(self, session_id: str) -> SessionOut:
        return self.send(calls.get_session(session_id))

    def session_messages(
        self,
        session_id: str,
        *,
        include_hidden: bool = False,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> SessionMessagePage:
        return self.send(
            calls.session_messages(
                session_id, include_hidden=include_hidden, limit=limit, cursor=cursor
            )
        )

    def iter_session_messages(
        self, session_id: str, *, include_hidden: bool = False, page_size: int = 100
    ) -> Iterator[SessionMessageOut]:
        """The session's messages in conversation order, page after page."""
        return self._all(
            calls.session_messages(session_id, include_hidden=include_hidden, limit=page_size),
            lambda c: calls.session_messages(
                session_id, include_hidden=include_hidden, limit=page_size, cursor=c
            ),
        )

    def delete_session(self, session_id: str) -> None:
        self.send(calls.delete_session(session_id))

    # ----------------------------------------------------------------------- prompts

    def prompt(
        self, agent: str, input: str, *, session: str | None = None, timeout_seconds: float = 60.0
    ) -> Task:
        """Submit and wait: the task once it finished or waits for approval, or still
        going when ``timeout_seconds`` passed first."""
        return self.send(
            calls.prompt(agent, input, session=session, timeout_seconds=timeout_seconds)
        )

    def prompt_object(
        self,
        agent: str,
        input: str,
        *,
        schema: Mapping[str, Any] | None = None,
        session: str | None = None,
        timeout_seconds: float = 60.0,
    ) -> Task:
        """Like :meth:`prompt`; ``output`` is JSON valid against ``schema`` (or the
        agent's ``output_schema``)."""
        return self.send(
            calls.prompt_object(
                agent, input, schema=schema, session=session, timeout_seconds=timeout_seconds
            )
        )

    # ----------------------------------------------------------------------- tokens

    def list_tokens(self, *, limit: int | None = None, cursor: str | None = None) -> TokenPage:
        return self.send(calls.list_tokens(limit=limit, cursor=cursor))

    def create_token(self, role: str, *, name: str = "", description: str = "") -> TokenCreated:
        """A new token of this token's namespace; its secret is in ``token``, this once."""
        return self.send(calls.create_token(role, name=name, description=description))

    def whoami(self) -> TokenOut:
        """This client's own token: its namespace and role (any role may ask)."""
        return self.send(calls.whoami())

    def get_token(self, token_id: str) -> TokenOut:
        return self.send(calls.get_token(token_id))

    def revoke_token(self, token_id: str, *, force: bool = False) -> TokenOut:
        """Revoke; ``ConflictError`` (``own_token``) for this client's own token unless
        ``force``."""
        return self.send(calls.revoke_token(token_id, force=force))
