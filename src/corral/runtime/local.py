"""Run an agent in this process against the store: the embedded mode.

The run is recorded before it starts and saved when it ends; every event is
stored (text deltas are batched until the next other event) and also handed to
an optional observer, which is how the CLI streams a run to the terminal.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, AsyncExitStack, nullcontext
from typing import Any

from corral.core.errors import CorralError
from corral.core.events import Event, EventType
from corral.core.ids import new_id
from corral.core.messages import Message
from corral.core.runs import RunRecord, RunState
from corral.core.settings import Settings
from corral.engine.loop import AgentLoop, RunResult
from corral.runtime.builder import AgentBuilder
from corral.store.base import Store

Observer = Callable[[Event], Awaitable[None]]
Loading = Callable[[str], AbstractContextManager[Any]]


class _StoredSink:
    """Stores events in order; text deltas wait for the next non-delta event."""

    def __init__(self, store: Store, observer: Observer | None) -> None:
        self.store = store
        self.observer = observer
        self.buffer: list[Event] = []
        self.last_seq = 0

    async def __call__(self, event: Event) -> None:
        self.buffer.append(event)
        self.last_seq = event.seq
        if event.type is not EventType.TEXT_DELTA:
            await self.flush()
        if self.observer is not None:
            await self.observer(event)

    async def flush(self) -> None:
        if self.buffer:
            batch, self.buffer = self.buffer, []
            await self.store.append_events(batch)


async def run_agent(
    store: Store,
    settings: Settings,
    agent: str,
    user_input: str,
    *,
    namespace: str = "default",
    history: Sequence[Message] = (),
    output_schema: dict[str, Any] | None = None,
    observer: Observer | None = None,
    loading: Loading | None = None,
) -> RunRecord:
    """Run ``agent`` on ``user_input`` to its end (or a pause for approval) and return the record.

    An unknown agent raises ``NotFoundError`` before any run is recorded; every
    later failure (a model endpoint down, an MCP server that does not start)
    is recorded as a failed run.
    """
    builder = AgentBuilder(store, settings, namespace)
    await builder.agent_spec(agent)  # fail fast, with no run recorded, on an unknown agent
    record = RunRecord(
        id=new_id("run"),
        namespace=namespace,
        agent=agent,
        input=user_input,
        state=RunState.RUNNING,
        started_at=time.time(),
    )
    await store.create_run(record)
    sink = _StoredSink(store, observer)
    try:
        async with AsyncExitStack() as stack:
            try:
                definition = await builder.build(agent, stack, output_schema=output_schema)
                with (loading or _no_loading)(definition.model.name):
                    await definition.model.prepare()
            except CorralError as exc:
                result = await _failed_before_start(record, sink, exc)
            else:
                result = await AgentLoop(definition, record.id, sink).run(user_input, history)
    finally:
        await sink.flush()
    _apply_result(record, result)
    await store.save_run(record)
    return record


def _no_loading(name: str) -> AbstractContextManager[Any]:
    return nullcontext()


async def _failed_before_start(record: RunRecord, sink: _StoredSink, exc: CorralError) -> RunResult:
    error = exc.to_dict()
    await sink(
        Event(record.id, 1, EventType.RUN_START, {"agent": record.agent, "input": record.input})
    )
    await sink(Event(record.id, 2, EventType.ERROR, error))
    await sink(Event(record.id, 3, EventType.RUN_FINISH, {"state": RunState.FAILED.value}))
    return RunResult(state=RunState.FAILED, error=error)


def _apply_result(record: RunRecord, result: RunResult) -> None:
    record.state = result.state
    record.output = result.output
    record.error = result.error
    record.messages = result.messages
    record.pending_approvals = result.pending_approvals
    record.steps = result.steps
    record.usage = result.usage
    record.cost_usd = result.cost_usd
    if result.state.finished:
        record.finished_at = time.time()
