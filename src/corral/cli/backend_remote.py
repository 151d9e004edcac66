"""The CLI's remote mode: :class:`RemoteBackend` over the HTTP API (``CORRAL_URL``).

The API's bodies are what the commands render, in both modes. Files are loaded
here, as in embedded mode (the same file/line errors, relative paths made
absolute against the file), and the server receives the loaded documents:
program paths then name files on this machine, which the server must see at
the same place.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

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
from corral.api.resources import MAX_DELETED_TOGETHER
from corral.cli.backend import Backend, MemoryAt, RunControl, Show, load_files
from corral.client import AsyncClient
from corral.core.errors import Location, NotFoundError, ResourceError
from corral.core.limits import MAX_TREE_TASKS
from corral.core.memory import MemoryEntryNotFoundError
from corral.core.runs import RunState
from corral.core.selectors import Selector
from corral.resources.loader import LoadedResource

OnPause = Callable[[TaskDetail], Awaitable[None]]

#: how often a follower asks whether the run paused for approval (its stream stays open then)
PAUSE_CHECK_SECONDS = 0.25
#: the largest page the API serves
PAGE = 500


#: how :mod:`corral.client.wire` names the document of a problem (its index in the body)
_DOCUMENT = re.compile(r"document (\d+)")
_FIELD_PART = re.compile(r"\[(\d+)\]|([^.\[\]]+)")


def _in_file(loaded: list[LoadedResource], where: Location, reason: str) -> tuple[Location, str]:
    """A problem the server found in document ``i`` of the body, at its file and line."""
    match = _DOCUMENT.fullmatch(where.file or "")
    if match is None or int(match.group(1)) >= len(loaded):
        return where, reason
    item = loaded[int(match.group(1))]
    path = tuple(
        int(index) if index else key for index, key in _FIELD_PART.findall(where.field or "")
    )
    return Location(item.file, item.line_of(path), where.field), reason


async def _ignore(event: EventOut) -> None:
    return None


class RemoteBackend(Backend):
    """A Corral server; runs execute on its workers (or on ``corral worker`` processes)."""

    max_deleted_together = MAX_DELETED_TOGETHER  # POST /v1/resources/delete's bound

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self._namespace: str | None = None

    # ----------------------------------------------------------------------- resources

    async def apply(
        self,
        paths: Sequence[Path],
        namespace: str,
        *,
        stdin: str | None = None,
        dry_run: bool = False,
    ) -> list[AppliedResource]:
        loaded = await self.load(paths, namespace, stdin=stdin)
        if not loaded:
            return []
        documents = [item.resource.to_document() for item in loaded]
        try:
            result = await self.client.apply(documents, dry_run=dry_run)
        except ResourceError as exc:  # the server's problems name documents: name lines
            raise ResourceError([_in_file(loaded, *problem) for problem in exc.problems]) from None
        return result.outcomes

    async def load(
        self, paths: Sequence[Path], namespace: str, *, stdin: str | None = None
    ) -> list[LoadedResource]:
        from corral.core.settings import Settings

        namespace = await self.default_namespace(namespace)
        return await load_files(paths, namespace, Settings.from_env(), stdin)

    async def default_namespace(self, namespace: str) -> str:
        from corral.cli.common import connection

        if connection().namespace_source is None:  # no -n, no context's: the token's
            return await self._token_namespace()
        return namespace

    async def _token_namespace(self) -> str:
        if self._namespace is None:
            self._namespace = (await self.client.whoami()).namespace
        return self._namespace

    async def list_resources(
        self, namespace: str | None, kind: str | None, *, selector: Selector | None = None
    ) -> list[ResourceOut]:
        # a token works in one namespace: "every namespace it may see" is that one
        text = str(selector) if selector is not None else None
        return [r async for r in self.client.iter_resources(kind, selector=text, page_size=PAGE)]

    async def get_resource(self, namespace: str, kind: str, name: str) -> ResourceOut | None:
        try:
            return await self.client.get_resource(kind, name)
        except NotFoundError:
            return None

    async def delete_resource(self, namespace: str, kind: str, name: str) -> None:
        await self._deletable_in(namespace, f"{kind} {name!r}")
        await self.client.delete_resource(kind, name)

    async def delete_resources(self, namespace: str, keys: Sequence[tuple[str, str]]) -> None:
        await self._deletable_in(namespace, ", ".join(f"{k} {n!r}" for k, n in keys))
        await self.client.delete_resources(keys)

    async def _deletable_in(self, namespace: str, what: str) -> None:
        token_namespace = await self._token_namespace()
        if namespace != token_namespace:  # the server would delete the token namespace's
            raise NotFoundError(
                f"{what} not found in namespace {namespace!r}: the token works in "
                f"namespace {token_namespace!r} only"
            )

    # ----------------------------------------------------------------------- runs

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
        task, created = await self.client.submit(
            agent,
            prompt,
            session=session,
            idempotency_key=idempotency_key,
            priority=priority,
            delay_seconds=delay,
            labels=labels,
        )
        return task, created

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
        submitted = await self.client.submit(
            agent, prompt, session=session, output_schema=output_schema, labels=labels
        )
        run_id = submitted.task.id
        if control is None:
            return await self.follow(run_id, show or _ignore, follow=True)
        control.run_id = run_id
        return await self.see_through(run_id, show or _ignore, loading=loading, control=control)

    async def see_through(
        self, run_id: str, show: Show, *, loading: Any, control: RunControl
    ) -> TaskDetail:
        async with anyio.create_task_group() as group:

            async def stop_following() -> None:
                await control.stop.wait()
                group.cancel_scope.cancel()  # the server's workers go on with the run

            group.start_soon(stop_following)
            record = await self._follow(run_id, show, control.on_pause)
            group.cancel_scope.cancel()
        if control.stop.is_set():
            return await self.client.get_task(run_id)
        return record

    async def list_runs(
        self,
        namespace: str,
        agent: str | None,
        limit: int,
        states: list[str] | None,
        selector: Selector | None = None,
    ) -> list[Task]:
        found: list[Task] = []
        async for task in self.client.iter_tasks(
            state=states,
            agent=agent,
            selector=str(selector) if selector is not None else None,
            page_size=min(limit, PAGE),
        ):
            found.append(task)
            if len(found) >= limit:
                break
        return found

    async def get_run(self, run_id: str) -> TaskDetail:
        return await self.client.get_task(run_id)

    async def cancel(self, run_id: str) -> Task:
        return await self.client.cancel_task(run_id)

    async def children(self, run_id: str) -> list[Task]:
        return (await self.client.task_children(run_id)).items

    async def run_system(
        self, system: str, prompt: str, *, namespace: str, show: Show, loading: Any
    ) -> TaskDetail:
        del namespace, loading  # the token's namespace; the server's workers execute it
        from corral.cli.systems_view import follow_tree

        submitted = await self.client.submit_system(system, prompt)
        return await follow_tree(self.follow, submitted.task.id, show, live=True)

    async def messages(self, run_id: str) -> list[AgentMessageOut]:
        return [m async for m in self.client.iter_task_messages(run_id)]

    async def follow(self, run_id: str, show: Show, *, follow: bool) -> TaskDetail:
        if follow:
            return await self._follow(run_id, show, None)
        return await self._pages(run_id, show, 0)

    async def _follow(self, run_id: str, show: Show, on_pause: OnPause | None) -> TaskDetail:
        return await self._pages(run_id, show, await self._stream(run_id, show, on_pause))

    async def _pages(self, run_id: str, show: Show, last: int) -> TaskDetail:
        # the stored events after the last one shown (all of them without --follow); a run
        # that is gone is a NotFoundError here
        cursor: str | None = None
        while True:
            page = await self.client.events(run_id, after=last, cursor=cursor, limit=PAGE)
            for event in page.items:
                last = event.seq
                await show(event)
            if page.next_cursor is None or not page.items:
                break
            cursor = page.next_cursor
        return await self.client.get_task(run_id)

    async def _stream(self, run_id: str, show: Show, on_pause: OnPause | None) -> int:
        """Show the events over SSE until the stream ends or the run waits for approval
        (its stream stays open then: a watcher ends it, or with ``on_pause`` tells it and
        lets the stream go on); returns the last seq shown."""
        last = 0
        async with anyio.create_task_group() as group:
            group.start_soon(self._until_paused, run_id, group.cancel_scope, on_pause)
            # absent or deleted: the page read after the stream says so, outside this group
            with contextlib.suppress(NotFoundError):
                async for event in self.client.follow(run_id):
                    last = event.seq
                    await show(event)
            group.cancel_scope.cancel()
        return last

    async def _until_paused(
        self, run_id: str, stream: anyio.CancelScope, on_pause: OnPause | None
    ) -> None:
        told: tuple[str, ...] = ()  # the calls of the pause last told to on_pause
        while True:
            await anyio.sleep(PAUSE_CHECK_SECONDS)
            try:
                task: TaskDetail | None = await self.client.get_task(run_id)
            except NotFoundError:  # deleted: nothing more will come
                task = None
            if task is None or (task.state is RunState.WAITING_APPROVAL and on_pause is None):
                stream.cancel()
                return
            if (
                task.state is RunState.WAITING_CHILDREN
                and on_pause is None
                and await self._descendant_waits(run_id)
            ):  # as embedded mode ends: nothing more happens without a human
                stream.cancel()
                return
            if task.state is RunState.WAITING_APPROVAL:
                pause = tuple(p.call_id for p in task.pending_approvals)
                if pause != told:
                    told = pause
                    assert on_pause is not None
                    await on_pause(task)

    async def _descendant_waits(self, run_id: str) -> bool:
        """Whether a child task below ``run_id`` (breadth first, at most a tree's worth)
        waits for approval."""
        level, seen = [run_id], 0
        while level and seen < MAX_TREE_TASKS:
            below: list[str] = []
            for parent in level:
                for child in (await self.client.task_children(parent)).items:
                    seen += 1
                    if child.state is RunState.WAITING_APPROVAL:
                        return True
                    if child.state is RunState.WAITING_CHILDREN:
                        below.append(child.id)
            level = below
        return False

    # ----------------------------------------------------------------------- approvals

    async def list_approvals(
        self, namespace: str, states: list[str] | None, *, run_id: str | None = None
    ) -> list[ApprovalOut]:
        return [
            a async for a in self.client.iter_approvals(state=states, run_id=run_id, page_size=PAGE)
        ]

    async def decide(self, approval_id: str, approved: bool, reason: str | None) -> ApprovalOut:
        if approved:
            return await self.client.approve(approval_id, reason)
        return await self.client.reject(approval_id, reason)

    # ----------------------------------------------------------------------- sessions

    async def list_sessions(self, namespace: str) -> list[SessionOut]:
        return [s async for s in self.client.iter_sessions(page_size=PAGE)]

    async def get_session(self, namespace: str, session_id: str) -> SessionOut | None:
        try:
            return await self.client.get_session(session_id)
        except NotFoundError:
            return None

    async def session_messages(
        self, namespace: str, session_id: str, *, include_hidden: bool
    ) -> list[SessionMessageOut]:
        return [
            m
            async for m in self.client.iter_session_messages(
                session_id, include_hidden=include_hidden, page_size=PAGE
            )
        ]

    async def delete_session(self, namespace: str, session_id: str) -> None:
        await self.client.delete_session(session_id)

    # ----------------------------------------------------------------------- memories
    # (the namespace is the token's: open_backend checked that -n names it)

    async def memory_stats(self, namespace: str, name: str) -> MemoryStatsOut:
        return await self.client.memory_stats(name)

    async def write_memory(
        self, at: MemoryAt, text: str, *, key: str | None, metadata: dict[str, Any]
    ) -> MemoryEntryOut:
        return await self.client.write_memory(
            at.name,
            text,
            key=key,
            metadata=metadata,
            **at.scope.fields(),
        )

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
        done = await self.client.ingest_memory(
            at.name,
            text,
            source=source,
            key_prefix=key_prefix,
            metadata=metadata,
            **at.scope.fields(),
        )
        if progress is not None:  # the server cuts and writes in one request
            progress(done.chunks, done.chunks)
        return done

    async def read_memory(self, at: MemoryAt, key: str) -> MemoryEntryOut | None:
        try:
            return await self.client.read_memory(at.name, key, **at.scope.fields())
        except NotFoundError as exc:
            if exc.code != MemoryEntryNotFoundError.code:  # the Memory itself is missing: say so
                raise
            return None

    async def delete_memory(self, at: MemoryAt, key: str) -> bool:
        try:
            await self.client.delete_memory(at.name, key, **at.scope.fields())
        except NotFoundError as exc:
            if exc.code != MemoryEntryNotFoundError.code:
                raise
            return False
        return True

    async def memory_entries(
        self, at: MemoryAt, *, prefix: str, limit: int
    ) -> list[MemoryEntryOut]:
        page = await self.client.memory_entries(
            at.name,
            prefix=prefix,
            **at.scope.fields(),
            limit=limit,
        )
        return list(page.items)

    async def search_memory(
        self, at: MemoryAt, query: str, *, top_k: int, filters: dict[str, Any]
    ) -> list[MemoryHitOut]:
        found = await self.client.search_memory(
            at.name,
            query,
            top_k=top_k,
            filter=filters,
            **at.scope.fields(),
        )
        return list(found.items)
