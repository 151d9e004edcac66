"""The client's methods, written once for :class:`~corral.client.Client` and
:class:`~corral.client.AsyncClient`.

Each method is a function of :mod:`corral.client.calls` - its signature and
docstring are the method's - that only says what to send: a
:class:`~corral.client.calls.Call`, the :class:`~corral.client.calls.Pages` of a
list or a run's stream to :class:`~corral.client.calls.Follow`. The descriptor
it is wrapped in here makes it the method of the client it is read from: on a
``Client`` it sends the call and returns the answer (iterates the items, follows
the stream); on an ``AsyncClient`` it returns a coroutine of the answer (an async
iterator). Each client provides only its I/O (:class:`SyncIO`, :class:`AsyncIO`),
so the two have one set of methods, and typing stays exact for both (``await
client.get_task(...)`` is a ``TaskDetail`` on an ``AsyncClient``).

    calls        what each method sends, its signature and docstring
    Methods      the table of methods: calls wrapped in sends / iterates
    SyncIO       Client: send, walk pages, follow       (sync.py)
    AsyncIO      AsyncClient: the same, awaited          (aio.py)
    wire         requests, answers, errors, SSE          (both)
"""

from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Generic, ParamSpec, Self, TypeVar, cast, overload

from corral.api import EventOut
from corral.client import calls, wire
from corral.client.calls import Call, Follow, Pages, Source

P = ParamSpec("P")
T = TypeVar("T")
#: what a method builds: a call, or what to iterate
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
    def _follow(self, follow: Follow) -> Iterator[EventOut]: ...


class AsyncIO(ABC):
    """The asyncio I/O under :class:`Methods`."""

    @abstractmethod
    async def send(self, call: Call[T]) -> T:
        """Send one call and read its answer (an error answer raises)."""

    @abstractmethod
    def _walk(self, pages: Pages[T]) -> AsyncIterator[T]: ...

    @abstractmethod
    def _follow(self, follow: Follow) -> AsyncIterator[EventOut]: ...


class _Method(Generic[P, B]):
    """A method of both clients from ``build`` (its signature and docstring)."""

    def __init__(self, build: Callable[P, B]) -> None:
        self.build = build
        functools.update_wrapper(cast(Any, self), build)  # its name and docstring
        # what inspect and help() show of the method: build's parameters (its return
        # annotation, what to send, is not what the method returns)
        self.signature = inspect.signature(build).replace(return_annotation=inspect.Signature.empty)

    def _as_method(self, method: Callable[P, object]) -> Callable[..., Any]:
        functools.update_wrapper(method, self.build)
        method.__signature__ = self.signature  # type: ignore[attr-defined]
        return method


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
            sender = client

            async def send_async(*args: P.args, **kwargs: P.kwargs) -> T:
                return await sender.send(build(*args, **kwargs))

            return self._as_method(send_async)

        def send(*args: P.args, **kwargs: P.kwargs) -> T:
            return client.send(build(*args, **kwargs))

        return self._as_method(send)


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

        def iterate(*args: P.args, **kwargs: P.kwargs) -> object:
            source = build(*args, **kwargs)
            if isinstance(source, Follow):
                return client._follow(source)
            assert isinstance(source, Pages)
            return client._walk(source)

        return self._as_method(iterate)


class Methods(ABC, Generic[Transport]):
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

    @abstractmethod
    def _connect(self, options: wire.HttpOptions, transport: Transport | None) -> None:
        """Open the client's httpx client."""

    # operations
    health = sends(calls.health)
    ready = sends(calls.ready)
    # resources
    apply = sends(calls.apply)
    list_resources = sends(calls.list_resources)
    iter_resources = iterates(calls.iter_resources)
    get_resource = sends(calls.get_resource)
    delete_resource = sends(calls.delete_resource)
    delete_resources = sends(calls.delete_resources)
    # tasks
    submit = sends(calls.submit)
    list_tasks = sends(calls.list_tasks)
    iter_tasks = iterates(calls.iter_tasks)
    get_task = sends(calls.get_task)
    cancel_task = sends(calls.cancel_task)
    task_children = sends(calls.task_children)
    # agent systems
    submit_system = sends(calls.submit_system)
    task_messages = sends(calls.task_messages)
    iter_task_messages = iterates(calls.iter_task_messages)
    events = sends(calls.events)
    follow = iterates(calls.follow)
    # approvals
    list_approvals = sends(calls.list_approvals)
    iter_approvals = iterates(calls.iter_approvals)
    get_approval = sends(calls.get_approval)
    approve = sends(calls.approve)
    reject = sends(calls.reject)
    # sessions
    list_sessions = sends(calls.list_sessions)
    iter_sessions = iterates(calls.iter_sessions)
    get_session = sends(calls.get_session)
    session_messages = sends(calls.session_messages)
    iter_session_messages = iterates(calls.iter_session_messages)
    delete_session = sends(calls.delete_session)
    # memories
    memory_stats = sends(calls.memory_stats)
    memory_entries = sends(calls.memory_entries)
    iter_memory_entries = iterates(calls.iter_memory_entries)
    write_memory = sends(calls.write_memory)
    ingest_memory = sends(calls.ingest_memory)
    read_memory = sends(calls.read_memory)
    delete_memory = sends(calls.delete_memory)
    search_memory = sends(calls.search_memory)
    # prompts
    prompt = sends(calls.prompt)
    prompt_object = sends(calls.prompt_object)
    # linked agents (with an agent token)
    links = sends(calls.links)
    link_info = sends(calls.link_info)
    link_exec = sends(calls.link_exec)
    # tokens
    list_tokens = sends(calls.list_tokens)
    create_token = sends(calls.create_token)
    whoami = sends(calls.whoami)
    capabilities = sends(calls.capabilities)
    get_token = sends(calls.get_token)
    revoke_token = sends(calls.revoke_token)
