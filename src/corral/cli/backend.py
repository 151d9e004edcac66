"""Where the CLI's commands get their data: the store here, or a Corral server.

Every command that reads or changes state calls a :class:`Backend` and renders
the library's own records (``RunRecord``, ``StoredResource``, ``Approval``...),
so its output and exit codes do not depend on where the data came from.
:func:`open_backend` chooses once per command:

- ``CORRAL_URL`` unset: :class:`EmbeddedBackend`, the store of ``CORRAL_HOME`` /
  ``CORRAL_DB_URL``; ``corral run`` executes the agent in this process.
- ``CORRAL_URL`` set (with ``CORRAL_TOKEN``): :class:`~corral.cli.backend_remote.RemoteBackend`
  over the HTTP API; runs execute on the server's workers. The token decides the
  namespace there, so ``-n`` must name the token's namespace (or be left out).

Commands that work on the store itself (``worker``, ``gc``, ``serve``, ``token``)
have no remote mode: with ``CORRAL_URL`` set they stop with exit code 2
(:func:`require_local`) instead of quietly using a local store.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.cli.main import EXIT_BAD_INPUT, fail

if TYPE_CHECKING:
    from corral.core.events import Event
    from corral.core.runs import Approval, RunRecord
    from corral.core.sessions import Session, SessionMessage
    from corral.core.settings import Settings
    from corral.resources.loader import LoadedResource
    from corral.store.base import ApplyOutcome, Store, StoredResource

URL_ENV = "CORRAL_URL"

#: Receives each event of a followed run, in order.
Show = Callable[["Event"], Awaitable[None]]


def remote_url() -> str | None:
    """The API URL when the CLI runs in remote mode."""
    return os.environ.get(URL_ENV) or None


def require_local(command: str) -> None:
    """Stop (exit 2) when ``command``, which works on the store, is asked for in remote mode."""
    if remote_url() is not None:
        fail(
            f"'corral {command}' works on the store directly and has no remote mode; "
            f"unset {URL_ENV} to run it on a machine that reaches the store",
            EXIT_BAD_INPUT,
        )


async def load_files(
    paths: Sequence[Path], namespace: str, settings: Settings
) -> list[LoadedResource]:
    """The documents of YAML files or directories, within the settings' document limits
    (in a thread: parsing is CPU work); what both backends' ``apply`` sends on."""
    import asyncio

    from corral.resources.loader import load_paths

    return await asyncio.to_thread(
        load_paths, list(paths), default_namespace=namespace, limits=settings.document_limits
    )


class Backend(ABC):
    """What the commands need from Corral; the contract is the store's (see ``store/base.py``)."""

    # ----------------------------------------------------------------------- resources

    @abstractmethod
    async def apply(self, paths: Sequence[Path], namespace: str) -> list[ApplyOutcome]:
        """Load YAML files or directories (errors with file and line) and apply them at once."""

    @abstractmethod
    async def list_resources(self, namespace: str, kind: str | None) -> list[StoredResource]: ...

    @abstractmethod
    async def get_resource(self, namespace: str, kind: str, name: str) -> StoredResource | None: ...

    @abstractmethod
    async def delete_resource(self, namespace: str, kind: str, name: str) -> None: ...

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
    ) -> tuple[RunRecord, bool]:
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
    ) -> RunRecord:
        """Submit a run and see it through until it ends or waits for approval."""

    @abstractmethod
    async def list_runs(
        self, namespace: str, agent: str | None, limit: int, states: list[str] | None
    ) -> list[RunRecord]: ...

    @abstractmethod
    async def get_run(self, run_id: str) -> RunRecord | None: ...

    @abstractmethod
    async def cancel(self, run_id: str) -> RunRecord: ...

    @abstractmethod
    async def follow(self, run_id: str, show: Show, *, follow: bool) -> RunRecord:
        """Hand each event to ``show``; with ``follow`` until the run ends or pauses."""

    # ----------------------------------------------------------------------- approvals

    @abstractmethod
    async def list_approvals(self, namespace: str, states: list[str] | None) -> list[Approval]: ...

    @abstractmethod
    async def decide(self, approval_id: str, approved: bool, reason: str | None) -> Approval: ...

    # ----------------------------------------------------------------------- sessions

    @abstractmethod
    async def list_sessions(self, namespace: str) -> list[Session]: ...

    @abstractmethod
    async def session_messages(
        self, namespace: str, session_id: str, *, include_hidden: bool
    ) -> list[SessionMessage]:
        """The messages; ``NotFoundError`` when there is no such session."""

    @abstractmethod
    async def delete_session(self, namespace: str, session_id: str) -> None:
        """Delete a session; ``ConflictError`` naming the run while one of it is unfinished."""


class EmbeddedBackend(Backend):
    """The store of this machine; runs execute in this process."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings

    async def apply(self, paths: Sequence[Path], namespace: str) -> list[ApplyOutcome]:
        return await self.store.apply(await load_files(paths, namespace, self.settings))

    async def list_resources(self, namespace: str, kind: str | None) -> list[StoredResource]:
        return await self.store.list_resources(namespace, kind)

    async def get_resource(self, namespace: str, kind: str, name: str) -> StoredResource | None:
        return await self.store.get_resource(namespace, kind, name)

    async def delete_resource(self, namespace: str, kind: str, name: str) -> None:
        await self.store.delete_resource(namespace, kind, name)

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
        from corral.bus import open_settings_bus
        from corral.runtime.local import submit

        # The bus of the settings (NATS when CORRAL_NATS_URL is set) wakes a worker now.
        async with await open_settings_bus(self.settings) as bus:
            return await submit(
                self.store,
                agent,
                prompt,
                namespace=namespace,
                session=session,
                idempotency_key=idempotency_key,
                priority=priority,
                delay=delay,
                bus=bus,
            )

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
        from corral.runtime.local import run_agent

        return await run_agent(
            self.store,
            self.settings,
            agent,
            prompt,
            namespace=namespace,
            session=session,
            output_schema=output_schema,
            observer=show,
            loading=loading,
        )

    async def list_runs(
        self, namespace: str, agent: str | None, limit: int, states: list[str] | None
    ) -> list[RunRecord]:
        from corral.core.runs import RunState

        chosen = [RunState(s) for s in states] if states else None
        return await self.store.list_runs(namespace, agent, limit, chosen)

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self.store.get_run(run_id)

    async def cancel(self, run_id: str) -> RunRecord:
        return await self.store.request_cancel(run_id)

    async def follow(self, run_id: str, show: Show, *, follow: bool) -> RunRecord:
        import anyio

        from corral.core.runs import RunState

        after = 0
        while True:
            for event in await self.store.list_events(run_id, after):
                after = event.seq
                await show(event)
            record = await self.store.get_run(run_id)
            assert record is not None
            if not follow or record.state.finished or record.state is RunState.WAITING_APPROVAL:
                for event in await self.store.list_events(run_id, after):  # written just before
                    after = event.seq
                    await show(event)
                return record
            await anyio.sleep(0.2)

    async def list_approvals(self, namespace: str, states: list[str] | None) -> list[Approval]:
        return await self.store.list_approvals(namespace, states=states)

    async def decide(self, approval_id: str, approved: bool, reason: str | None) -> Approval:
        import getpass

        from corral.bus import open_settings_bus

        decided = await self.store.decide_approval(
            approval_id, approved, by=getpass.getuser(), reason=reason
        )
        if self.settings.nats_url:  # wake a worker now (the decision may have queued the run)
            async with await open_settings_bus(self.settings) as bus:
                await bus.announce_runnable([decided.run_id], mark=decided.id)
        return decided

    async def list_sessions(self, namespace: str) -> list[Session]:
        return await self.store.list_sessions(namespace)

    async def session_messages(
        self, namespace: str, session_id: str, *, include_hidden: bool
    ) -> list[SessionMessage]:
        from corral.core.errors import NotFoundError

        if await self.store.get_session(namespace, session_id) is None:
            raise NotFoundError(f"session {session_id!r} not found in namespace {namespace!r}")
        return await self.store.session_messages(
            namespace, session_id, include_hidden=include_hidden
        )

    async def delete_session(self, namespace: str, session_id: str) -> None:
        await self.store.delete_session(namespace, session_id)


@asynccontextmanager
async def open_backend() -> AsyncIterator[Backend]:
    """The backend of this environment: a server when ``CORRAL_URL`` is set, else the store."""
    if remote_url() is not None:
        from corral.cli.backend_remote import RemoteBackend
        from corral.client import AsyncClient

        async with AsyncClient() as client:
            yield RemoteBackend(client)
        return
    from corral.cli.resources_cmd import open_cli_store

    async with open_cli_store() as (store, settings):
        yield EmbeddedBackend(store, settings)
