"""Where the CLI's commands get their data: the store here, or a Corral server.

Every command that reads or changes state calls a :class:`Backend` and renders
the API's bodies (``Task``, ``ApprovalOut``, ``ResourceOut``... of
:mod:`corral.api`), so its output and exit codes do not depend on where the
data came from:

- :class:`EmbeddedBackend`, the store of ``CORRAL_HOME`` / ``CORRAL_DB_URL``: the
  operations of :mod:`corral.runtime.operations`, their records turned into API
  bodies as the server does; ``corral run`` executes the agent in this process.
- :class:`~corral.cli.backend_remote.RemoteBackend` (``CORRAL_URL``): the client;
  runs execute on the server's workers.

:func:`corral.cli.connect.open_backend` chooses once per command.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from corral.api import (
        AgentMessageOut,
        AppliedResource,
        ApprovalOut,
        EventOut,
        MemoryEntryOut,
        MemoryHitOut,
        MemoryIngestOut,
        MemoryStatsOut,
        ResourceOut,
        SessionMessageOut,
        SessionOut,
        Task,
        TaskDetail,
    )
    from corral.bus.base import Bus
    from corral.core.events import Event
    from corral.core.memory import MemoryScope
    from corral.core.runs import RunRecord
    from corral.core.selectors import Selector
    from corral.core.settings import Settings
    from corral.resources.loader import LoadedResource
    from corral.runtime.local import Steering
    from corral.runtime.memory import Memories
    from corral.store.base import Store, StoredResource

#: Receives each event of a followed run, in order.
Show = Callable[["EventOut"], Awaitable[None]]


@dataclass
class RunControl:
    """What ``corral run`` asks of the run it sees through, beyond its events.

    ``run_id`` is set as soon as the run is stored. With ``on_pause`` (``--wait``) a
    run that pauses for approval is followed on until it finishes, and ``on_pause``
    is called each time it pauses. Setting ``stop`` (Ctrl-C) ends seeing it through:
    embedded, a run executing in this process is released with its journal for any
    worker; remote, the server's workers go on with it.
    """

    on_pause: Callable[[TaskDetail], Awaitable[None]] | None = None
    stop: anyio.Event = field(default_factory=anyio.Event)
    run_id: str | None = None


async def load_files(
    paths: Sequence[Path], namespace: str, settings: Settings, stdin: str | None = None
) -> list[LoadedResource]:
    """The documents of YAML files or directories (``-``: the text ``stdin``), within the
    settings' document limits (in a thread: parsing is CPU work); what both backends'
    ``apply`` sends on, and what ``delete -f`` deletes."""
    import asyncio

    from corral.resources.loader import load_paths

    return await asyncio.to_thread(
        lambda: load_paths(
            list(paths),
            default_namespace=namespace,
            limits=settings.document_limits,
            stdin=stdin,
        )
    )


class Backend(ABC):
    """What the commands need from Corral; the contract is the API's (``corral.client``)."""

    #: the most resources one :meth:`delete_resources` deletes together (``None``: no bound)
    max_deleted_together: int | None = None

    # ----------------------------------------------------------------------- resources

    @abstractmethod
    async def apply(
        self,
        paths: Sequence[Path],
        namespace: str,
        *,
        stdin: str | None = None,
        dry_run: bool = False,
    ) -> list[AppliedResource]:
        """Load YAML files or directories (``-``: ``stdin``; errors with file and line) and
        apply them at once; with ``dry_run`` say what would happen, change nothing."""

    @abstractmethod
    async def load(
        self, paths: Sequence[Path], namespace: str, *, stdin: str | None = None
    ) -> list[LoadedResource]:
        """The documents of YAML files or directories (``-``: ``stdin``), documents without
        a namespace in this backend's default one (see :meth:`default_namespace`)."""

    @abstractmethod
    async def default_namespace(self, namespace: str) -> str:
        """The namespace a command works in: ``namespace`` (remote: the token's unless
        ``-n`` or the context named one, which :func:`~corral.cli.connect.open_backend`
        checked)."""

    @abstractmethod
    async def list_resources(
        self, namespace: str | None, kind: str | None, *, selector: Selector | None = None
    ) -> list[ResourceOut]:
        """Resources of a namespace (``None``: of every namespace the caller may see),
        of one kind, whose labels meet ``selector``, when given."""

    @abstractmethod
    async def get_resource(self, namespace: str, kind: str, name: str) -> ResourceOut | None: ...

    @abstractmethod
    async def delete_resource(self, namespace: str, kind: str, name: str) -> None: ...

    @abstractmethod
    async def delete_resources(self, namespace: str, keys: Sequence[tuple[str, str]]) -> None:
        """Delete ``(kind, name)`` resources of ``namespace`` together, all or none."""

    # ----------------------------------------------------------------------- runs

    @abstractmethod
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
        labels: dict[str, str] | None = None,
    ) -> tuple[Task, bool]:
        """Queue a run; ``False`` when the idempotency key was seen (the first run)."""

    @abstractmethod
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
        control: RunControl | None = None,
        labels: dict[str, str] | None = None,
    ) -> TaskDetail:
        """Submit a run and see it through until it ends or waits for approval (see
        :class:`RunControl`)."""

    @abstractmethod
    async def list_runs(
        self,
        namespace: str,
        agent: str | None,
        limit: int,
        states: list[str] | None,
        selector: Selector | None = None,
    ) -> list[Task]:
        """The newest runs (of ``agent``, in ``states``, whose labels match ``selector``)."""

    @abstractmethod
    async def get_run(self, run_id: str) -> TaskDetail:
        """The run; ``NotFoundError`` when there is none."""

    @abstractmethod
    async def cancel(self, run_id: str) -> Task: ...

    @abstractmethod
    async def children(self, run_id: str) -> list[Task]:
        """The run's child runs, oldest first; ``NotFoundError`` when there is no such run."""

    @abstractmethod
    async def follow(self, run_id: str, show: Show, *, follow: bool) -> TaskDetail:
        """Hand each event to ``show``; with ``follow`` until the run ends or pauses.
        ``NotFoundError`` when the run does not exist (or is deleted meanwhile)."""

    # ----------------------------------------------------------------------- systems

    @abstractmethod
    async def run_system(
        self, system: str, prompt: str, *, namespace: str, show: Show, loading: Any
    ) -> TaskDetail:
        """Submit a run of an AgentSystem and see it through with its node runs, handing
        ``show`` the events of all of them, until it ends (or a node waits for a human)."""

    @abstractmethod
    async def messages(self, run_id: str) -> list[AgentMessageOut]:
        """The agent messages of a system run, oldest first (``NotFoundError``: no run)."""

    @abstractmethod
    async def see_through(
        self, run_id: str, show: Show, *, loading: Any, control: RunControl
    ) -> TaskDetail:
        """See a stored run through as :meth:`run` does (``corral chat`` after a decision):
        embedded, execute it here whenever it is runnable, unless a worker gets it first;
        remote, follow the server's workers. ``show`` gets every event from the first."""

    # ----------------------------------------------------------------------- approvals

    @abstractmethod
    async def list_approvals(
        self, namespace: str, states: list[str] | None, *, run_id: str | None = None
    ) -> list[ApprovalOut]:
        """Approvals of a namespace, oldest first (of one run, in some states, when given)."""

    @abstractmethod
    async def decide(self, approval_id: str, approved: bool, reason: str | None) -> ApprovalOut: ...

    # ----------------------------------------------------------------------- sessions

    @abstractmethod
    async def list_sessions(self, namespace: str) -> list[SessionOut]: ...

    @abstractmethod
    async def get_session(self, namespace: str, session_id: str) -> SessionOut | None: ...

    @abstractmethod
    async def session_messages(
        self, namespace: str, session_id: str, *, include_hidden: bool
    ) -> list[SessionMessageOut]:
        """The messages; ``NotFoundError`` when there is no such session."""

    @abstractmethod
    async def delete_session(self, namespace: str, session_id: str) -> None:
        """Delete a session; ``ConflictError`` naming the run while one of it is unfinished."""

    # ----------------------------------------------------------------------- memories

    @abstractmethod
    async def memory_stats(self, namespace: str, name: str) -> MemoryStatsOut:
        """What a Memory holds; ``NotFoundError`` when there is no such Memory."""

    @abstractmethod
    async def write_memory(
        self, at: MemoryAt, text: str, *, key: str | None, metadata: dict[str, Any]
    ) -> MemoryEntryOut:
        """Write one entry; ``NotFoundError`` when there is no such Memory."""

    @abstractmethod
    async def ingest_memory(
        self,
        at: MemoryAt,
        text: str,
        *,
        source: str,
        key_prefix: str | None,
        metadata: dict[str, Any],
        progress: Callable[[int, int], None] | None = None,
    ) -> MemoryIngestOut:
        """Ingest one document, chunked; ``NotFoundError`` when there is no such Memory.
        ``progress(done, chunks)`` as chunks are written (remote: once, when the server
        answers)."""

    @abstractmethod
    async def read_memory(self, at: MemoryAt, key: str) -> MemoryEntryOut | None: ...

    @abstractmethod
    async def delete_memory(self, at: MemoryAt, key: str) -> bool:
        """Delete one entry; whether it was there."""

    @abstractmethod
    async def memory_entries(
        self, at: MemoryAt, *, prefix: str, limit: int
    ) -> list[MemoryEntryOut]:
        """The first ``limit`` entries by key (those starting with ``prefix``)."""

    @abstractmethod
    async def search_memory(
        self, at: MemoryAt, query: str, *, top_k: int, filters: dict[str, Any]
    ) -> list[MemoryHitOut]: ...


@dataclass(frozen=True)
class MemoryAt:
    """A Memory of a namespace, and whose entries in it (the agent, session or agent
    system run of a Memory of that scope)."""

    namespace: str
    name: str
    scope: MemoryScope


class EmbeddedBackend(Backend):
    """The store of this machine; runs execute in this process."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings

    @asynccontextmanager
    async def _bus(self) -> AsyncIterator[Bus]:
        """The bus of the settings (NATS when ``CORRAL_NATS_URL`` is set: workers and
        followers elsewhere hear of what this command does), for one operation."""
        from corral.bus import open_settings_bus

        async with await open_settings_bus(self.settings) as bus:
            yield bus

    async def apply(
        self,
        paths: Sequence[Path],
        namespace: str,
        *,
        stdin: str | None = None,
        dry_run: bool = False,
    ) -> list[AppliedResource]:
        from corral.api import AppliedResource

        loaded = await self.load(paths, namespace, stdin=stdin)
        outcomes = await self.store.apply(loaded, dry_run=dry_run)
        return [AppliedResource.from_outcome(o) for o in outcomes]

    async def load(
        self, paths: Sequence[Path], namespace: str, *, stdin: str | None = None
    ) -> list[LoadedResource]:
        return await load_files(paths, namespace, self.settings, stdin)

    async def default_namespace(self, namespace: str) -> str:
        return namespace

    async def list_resources(
        self, namespace: str | None, kind: str | None, *, selector: Selector | None = None
    ) -> list[ResourceOut]:
        found = await self.store.list_resources(namespace, kind, selector=selector)
        return [_resource(s) for s in found]

    async def get_resource(self, namespace: str, kind: str, name: str) -> ResourceOut | None:
        stored = await self.store.get_resource(namespace, kind, name)
        return _resource(stored) if stored is not None else None

    async def delete_resource(self, namespace: str, kind: str, name: str) -> None:
        await self.store.delete_resource(namespace, kind, name)

    async def delete_resources(self, namespace: str, keys: Sequence[tuple[str, str]]) -> None:
        await self.store.delete_resources(namespace, keys)

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
        labels: dict[str, str] | None = None,
    ) -> tuple[Task, bool]:
        from corral.api import Task
        from corral.runtime import operations

        async with self._bus() as bus:  # wakes a worker now
            record, created = await operations.submit(
                self.store,
                agent,
                prompt,
                namespace=namespace,
                session=session,
                idempotency_key=idempotency_key,
                priority=priority,
                delay=delay,
                labels=labels,
                bus=bus,
            )
        return Task.from_record(record), created

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
        control: RunControl | None = None,
        labels: dict[str, str] | None = None,
    ) -> TaskDetail:
        from corral.api import TaskDetail
        from corral.runtime.local import run_agent

        steering = _steering(control) if control is not None else None
        async with self._bus() as bus:
            record = await run_agent(
                self.store,
                self.settings,
                agent,
                prompt,
                namespace=namespace,
                session=session,
                output_schema=output_schema,
                labels=labels,
                observer=_observer(show) if show is not None else None,
                loading=loading,
                bus=bus,
                steering=steering,
            )
        return TaskDetail.from_record(record)

    async def list_runs(
        self,
        namespace: str,
        agent: str | None,
        limit: int,
        states: list[str] | None,
        selector: Selector | None = None,
    ) -> list[Task]:
        from corral.api import Task
        from corral.core.runs import RunState

        chosen = [RunState(s) for s in states] if states else None
        found = await self.store.list_runs(namespace, agent, limit, chosen, selector=selector)
        return [Task.from_record(r) for r in found]

    async def get_run(self, run_id: str) -> TaskDetail:
        from corral.api import TaskDetail
        from corral.runtime import operations

        return TaskDetail.from_record(await operations.get_run(self.store, run_id))

    async def children(self, run_id: str) -> list[Task]:
        from corral.api import Task
        from corral.runtime import operations

        return [Task.from_record(r) for r in await operations.children(self.store, run_id)]

    async def cancel(self, run_id: str) -> Task:
        from corral.api import Task
        from corral.runtime import operations

        async with self._bus() as bus:  # a parent the cancelled child queued is woken
            return Task.from_record(await operations.cancel(self.store, run_id, bus=bus))

    async def follow(self, run_id: str, show: Show, *, follow: bool) -> TaskDetail:
        from corral.api import TaskDetail
        from corral.runtime import operations

        async with self._bus() as bus:
            record = await operations.follow_run(
                self.store, bus, run_id, _observer(show), follow=follow
            )
        return TaskDetail.from_record(record)

    async def run_system(
        self, system: str, prompt: str, *, namespace: str, show: Show, loading: Any
    ) -> TaskDetail:
        from corral.api import TaskDetail
        from corral.runtime.local import LocalRunner
        from corral.runtime.system_runs import submit_system

        async with self._bus() as bus:
            record, _ = await submit_system(
                self.store, system, prompt, namespace=namespace, bus=bus
            )
            async with LocalRunner(
                self.store,
                self.settings,
                observer=_observer(show),
                loading=loading,
                bus=bus,
                descendants=True,
            ) as runner:
                record = await runner.see_through(record.id)
        return TaskDetail.from_record(record)

    async def messages(self, run_id: str) -> list[AgentMessageOut]:
        from corral.api import AgentMessageOut
        from corral.runtime.system_runs import messages

        return [AgentMessageOut.from_record(m) for m in await messages(self.store, run_id)]

    async def see_through(
        self, run_id: str, show: Show, *, loading: Any, control: RunControl
    ) -> TaskDetail:
        from corral.api import TaskDetail
        from corral.runtime.local import LocalRunner

        async with (
            self._bus() as bus,
            LocalRunner(
                self.store, self.settings, observer=_observer(show), loading=loading, bus=bus
            ) as runner,
        ):
            record = await runner.see_through(run_id, _steering(control))
        return TaskDetail.from_record(record)

    async def list_approvals(
        self, namespace: str, states: list[str] | None, *, run_id: str | None = None
    ) -> list[ApprovalOut]:
        from corral.api import ApprovalOut

        return [
            ApprovalOut.from_approval(a)
            for a in await self.store.list_approvals(namespace, run_id=run_id, states=states)
        ]

    async def decide(self, approval_id: str, approved: bool, reason: str | None) -> ApprovalOut:
        import getpass

        from corral.api import ApprovalOut
        from corral.runtime import operations

        async with self._bus() as bus:
            decided = await operations.decide(
                self.store, bus, approval_id, approved, by=getpass.getuser(), reason=reason
            )
        return ApprovalOut.from_approval(decided)

    async def list_sessions(self, namespace: str) -> list[SessionOut]:
        from corral.api import SessionOut

        return [SessionOut.from_session(s) for s in await self.store.list_sessions(namespace)]

    async def get_session(self, namespace: str, session_id: str) -> SessionOut | None:
        from corral.api import SessionOut

        found = await self.store.get_session(namespace, session_id)
        return SessionOut.from_session(found) if found is not None else None

    async def session_messages(
        self, namespace: str, session_id: str, *, include_hidden: bool
    ) -> list[SessionMessageOut]:
        from corral.api import SessionMessageOut
        from corral.core.errors import NotFoundError

        if await self.store.get_session(namespace, session_id) is None:
            raise NotFoundError(f"session {session_id!r} not found in namespace {namespace!r}")
        messages = await self.store.session_messages(
            namespace, session_id, include_hidden=include_hidden
        )
        return [SessionMessageOut.from_stored(m) for m in messages]

    async def delete_session(self, namespace: str, session_id: str) -> None:
        await self.store.delete_session(namespace, session_id)

    def _memories(self) -> Memories:
        from corral.runtime.memory import Memories

        return Memories(self.store, self.settings)

    async def memory_stats(self, namespace: str, name: str) -> MemoryStatsOut:
        from corral.api import MemoryStatsOut

        return MemoryStatsOut.from_stats(await self._memories().stats(namespace, name))

    async def write_memory(
        self, at: MemoryAt, text: str, *, key: str | None, metadata: dict[str, Any]
    ) -> MemoryEntryOut:
        from corral.api import MemoryEntryOut
        from corral.core.ids import new_id

        entry = await self._memories().write(
            at.namespace,
            at.name,
            text,
            key=key or new_id("mem"),
            metadata=metadata,
            scope=at.scope,
        )
        return MemoryEntryOut.from_entry(entry)

    async def ingest_memory(
        self,
        at: MemoryAt,
        text: str,
        *,
        source: str,
        key_prefix: str | None,
        metadata: dict[str, Any],
        progress: Callable[[int, int], None] | None = None,
    ) -> MemoryIngestOut:
        from corral.api import MemoryIngestOut

        prefix, done = await self._memories().ingest(
            at.namespace,
            at.name,
            text,
            source=source,
            key_prefix=key_prefix,
            metadata=metadata,
            scope=at.scope,
            progress=progress,
        )
        return MemoryIngestOut(
            key_prefix=prefix, chunks=done.chunks, written=done.written, keys=done.keys
        )

    async def read_memory(self, at: MemoryAt, key: str) -> MemoryEntryOut | None:
        from corral.api import MemoryEntryOut
        from corral.core.memory import MemoryEntryNotFoundError

        try:
            entry = await self._memories().read(
                at.namespace,
                at.name,
                key,
                scope=at.scope,
            )
        except MemoryEntryNotFoundError:
            return None
        return MemoryEntryOut.from_entry(entry)

    async def delete_memory(self, at: MemoryAt, key: str) -> bool:
        from corral.core.memory import MemoryEntryNotFoundError

        try:
            await self._memories().delete(
                at.namespace,
                at.name,
                key,
                scope=at.scope,
            )
        except MemoryEntryNotFoundError:
            return False
        return True

    async def memory_entries(
        self, at: MemoryAt, *, prefix: str, limit: int
    ) -> list[MemoryEntryOut]:
        from corral.api import MemoryEntryOut

        found = await self._memories().list_entries(
            at.namespace,
            at.name,
            prefix=prefix,
            limit=limit,
            scope=at.scope,
        )
        return [MemoryEntryOut.from_entry(e) for e in found]

    async def search_memory(
        self, at: MemoryAt, query: str, *, top_k: int, filters: dict[str, Any]
    ) -> list[MemoryHitOut]:
        from corral.api import MemoryHitOut

        hits = await self._memories().search(
            at.namespace,
            at.name,
            query,
            top_k=top_k,
            filters=filters,
            scope=at.scope,
        )
        return [MemoryHitOut.from_hit(h) for h in hits]


def _resource(stored: StoredResource) -> ResourceOut:
    """A stored resource as the API shows it (secret values redacted)."""
    from corral.api import resource_out
    from corral.resources.secrets import redacted

    return resource_out(stored, redacted(stored.resource.to_document()))


def _steering(control: RunControl) -> Steering:
    """What the runtime is asked (:class:`~corral.runtime.local.Steering`) for ``control``."""
    from corral.api import TaskDetail
    from corral.runtime.local import Steering

    def submitted(run_id: str) -> None:
        control.run_id = run_id

    steering = Steering(submitted=submitted, stop=control.stop)
    if control.on_pause is not None:
        on_pause = control.on_pause

        async def paused(record: RunRecord) -> None:
            await on_pause(TaskDetail.from_record(record))

        steering.on_pause = paused
    return steering


def _observer(show: Show) -> Callable[[Event], Awaitable[None]]:
    """The runtime's events handed to ``show`` as the API's."""
    from corral.api import EventOut

    async def observe(event: Event) -> None:
        await show(EventOut.from_event(event))

    return observe
