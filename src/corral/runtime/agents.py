"""Live agents shared by the runs of one executor, rebuilt when their resources change.

Building an agent reads and validates its resources, resolves secrets, opens
model clients, imports tools, starts MCP servers and may load a local model:
milliseconds to seconds, for a result that is the same for every run of the
agent until someone applies or deletes a resource. So an executor keeps one live
agent per (namespace, name) and checks, once per run, a fingerprint of the
namespace's resources (:meth:`~corral.store.base.Store.resources_fingerprint`);
any change builds a fresh agent for the runs that start from then on. The old
one is closed when its last run ends.

Sharing is what a user expects of the parts: one connection pool per model
endpoint, one circuit breaker per tool across runs, one MCP session per server
(opened anew by the next call when it is lost, without a rebuild: see
:mod:`corral.tools.mcp`), one copy of a local model in memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, AsyncExitStack, asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Self

import anyio
import anyio.abc
import anyio.lowlevel

from corral.core.settings import Settings
from corral.engine.loop import AgentDefinition
from corral.runtime.builder import AgentBuilder
from corral.store.base import Store
from corral.tools.agents import Delegation

Loading = Callable[[str], AbstractContextManager[Any]]
Fingerprint = tuple[int, int, float]


@dataclass(eq=False)
class _Entry:
    agent: AgentDefinition
    fingerprint: Fingerprint
    done: anyio.Event = field(default_factory=anyio.Event)
    users: int = 0
    retired: bool = False

    def release(self) -> None:
        self.users -= 1
        if self.retired and self.users == 0:
            self.done.set()

    def retire(self) -> None:
        self.retired = True
        if self.users == 0:
            self.done.set()


@dataclass(eq=False)
class _Read:
    """A read of one namespace's fingerprint that runs share (see AgentCache._fingerprint)."""

    done: anyio.Event = field(default_factory=anyio.Event)
    value: Fingerprint | None = None  # None: the read failed or was cancelled
    shared: bool = False  # whether another run waits for it


@dataclass
class _Slot:
    """The live agent of one (namespace, name), and the lock its builders take turns on."""

    lock: anyio.Lock = field(default_factory=anyio.Lock)
    entry: _Entry | None = None


class AgentCache:
    """Hands out live agents, building each once per configuration of its resources.

    Use it as an async context: each live agent is built, and later closed, by a
    task of its own in the cache's task group, because what an agent opens (an MCP
    session's task group, a subprocess) must be closed by the task that opened
    it, and no single run outlives the others. Leaving the context closes every
    agent once its runs have ended.
    """

    def __init__(
        self,
        store: Store,
        settings: Settings,
        loading: Loading | None = None,
        delegation: Delegation | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.delegation = delegation
        self.loading = loading or (lambda name: nullcontext())
        self._slots: dict[tuple[str, str], _Slot] = {}
        self._reads: dict[str, _Read] = {}  # per namespace: a read not started yet
        self._group: anyio.abc.TaskGroup | None = None
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Self:
        self._group = await self._stack.enter_async_context(anyio.create_task_group())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        slots, self._slots = self._slots, {}
        for slot in slots.values():
            if slot.entry is not None:
                slot.entry.retire()
        self._group = None
        await self._stack.aclose()

    @asynccontextmanager
    async def agent(
        self, namespace: str, name: str, *, output_schema: dict[str, Any] | None = None
    ) -> AsyncIterator[AgentDefinition]:
        """The live agent for one run; ``CorralError`` when it cannot be built.

        ``output_schema`` (a run's own) overrides the agent's for this run only.
        """
        agent, release = await self.acquire(namespace, name, output_schema=output_schema)
        try:
            yield agent
        finally:
            release()

    async def acquire(
        self, namespace: str, name: str, *, output_schema: dict[str, Any] | None = None
    ) -> tuple[AgentDefinition, Callable[[], None]]:
        """:meth:`agent` without the context manager: the live agent and the function that
        gives it back (call it exactly once, when the run is done with the agent)."""
        entry = await self._acquire(namespace, name)
        agent = entry.agent
        if output_schema is not None:
            agent = dataclasses.replace(agent, output_schema=output_schema)
        return agent, entry.release

    async def _acquire(self, namespace: str, name: str) -> _Entry:
        fingerprint = await self._fingerprint(namespace)
        slot = self._slots.get((namespace, name))
        if slot is None:
            slot = self._slots[namespace, name] = _Slot()
        entry = slot.entry
        if entry is None or entry.fingerprint != fingerprint:
            async with slot.lock:  # one build per change, however many runs start at once
                entry = slot.entry
                if entry is None or entry.fingerprint != fingerprint:
                    fresh = await self._build(namespace, name, fingerprint)
                    if entry is not None:
                        entry.retire()
                    slot.entry = entry = fresh
        entry.users += 1
        return entry

    async def _fingerprint(self, namespace: str) -> Fingerprint:
        """The namespace's resources fingerprint, read once for the runs that start together.

        A worker starts the runs of one claim together, and each would read the same
        row. The first lets the others ask (one turn of the event loop), then reads for
        all of them. Each still sees the resources as they were when it asked: the
        read starts after every run that shares it asked. If the read fails, or its
        run is cancelled, the others read for themselves. The reader goes on in the
        same turn as the others (they go on in the turn after the read): runs that
        keep step write together, and their writes share a commit.
        """
        shared = self._reads.get(namespace)
        if shared is not None:  # not started yet: share it
            shared.shared = True
            await shared.done.wait()
            if shared.value is not None:
                return shared.value
            return await self.store.resources_fingerprint(namespace)
        shared = self._reads[namespace] = _Read()
        try:
            await anyio.lowlevel.checkpoint()  # the runs started with this one ask meanwhile
            del self._reads[namespace]  # whoever asks from now on needs a later read
            shared.value = value = await self.store.resources_fingerprint(namespace)
        finally:
            if self._reads.get(namespace) is shared:  # cancelled before the read started
                del self._reads[namespace]
            shared.done.set()
        if shared.shared:
            await anyio.lowlevel.checkpoint()
        return value

    async def _build(self, namespace: str, name: str, fingerprint: Fingerprint) -> _Entry:
        if self._group is None:
            raise RuntimeError("AgentCache used outside its `async with` block")
        built: list[_Entry | BaseException] = []
        await self._group.start(self._keep, namespace, name, fingerprint, built)
        if isinstance(built[0], BaseException):
            raise built[0]
        return built[0]

    async def _keep(
        self,
        namespace: str,
        name: str,
        fingerprint: Fingerprint,
        built: list[_Entry | BaseException],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Build one live agent, hand it over, and close it once it is retired and unused."""
        async with AsyncExitStack() as stack:
            try:
                builder = AgentBuilder(self.store, self.settings, namespace, self.delegation)
                agent = await builder.build(name, stack)
                with self.loading(agent.model.name):
                    await agent.model.prepare()
            except Exception as exc:  # noqa: BLE001 - handed to the run that asked, which reports it
                built.append(exc)
                task_status.started()
                return
            entry = _Entry(agent, fingerprint)
            built.append(entry)
            task_status.started()
            await entry.done.wait()
            # Leaving the block closes what the build opened, in this task. (Not in a
            # shielded scope of its own: an MCP session's task group must be exited while
            # its own cancel scope is the innermost one.)
