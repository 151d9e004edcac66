"""Following a run executed elsewhere: ``operations.follow_run`` (``corral logs -f``) and
``LocalRunner.see_through`` (``corral run`` when another worker holds the run).

Real SQLite store and in-process bus. "Elsewhere" is a second executor in this
process holding the run's lease, as a ``corral worker`` would.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from corral.bus import LocalBus
from corral.core.errors import NotFoundError
from corral.core.events import Event, EventType, StepStartData
from corral.core.runs import Lease, RunRecord, RunState
from corral.core.settings import Settings
from corral.resources.loader import load_text
from corral.runtime import operations
from corral.runtime.executor import RunExecutor
from corral.runtime.local import LocalRunner
from corral.store import Store
from databases import delete_run

AGENT = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: script}
spec:
  provider: scripted
  script:
    - text: "one"
---
apiVersion: corral/v1
kind: Agent
metadata: {name: helper}
spec:
  model: script
"""

#: longer than any test: a follower here only moves when the bus wakes it
NO_POLL = 3600.0

Observe = Callable[[Event], Awaitable[None]]
Follow = Callable[[Store, Settings, LocalBus, str, Observe], Awaitable[RunRecord]]


async def follow_run(
    store: Store, settings: Settings, bus: LocalBus, run_id: str, observe: Observe
) -> RunRecord:
    return await operations.follow_run(store, bus, run_id, observe, poll_seconds=NO_POLL)


async def see_through(
    store: Store, settings: Settings, bus: LocalBus, run_id: str, observe: Observe
) -> RunRecord:
    async with LocalRunner(
        store, settings, observer=observe, bus=bus, poll_seconds=NO_POLL
    ) as runner:
        return await runner.see_through(run_id)


FOLLOWERS = [pytest.param(follow_run, id="follow_run"), pytest.param(see_through, id="runner")]


async def held_elsewhere(store: Store, *, lease_seconds: float = 60.0) -> tuple[RunRecord, Lease]:
    """A submitted run, claimed by another worker (which has not started it)."""
    await store.apply(load_text(AGENT, "agent.yaml"))
    record, _ = await operations.submit(store, "helper", "hi")
    [claim] = await store.claim_runs("elsewhere", lease_seconds, 1, run_ids=[record.id])
    return claim


@pytest.mark.parametrize("follow", FOLLOWERS)
async def test_a_run_executed_elsewhere_is_followed_as_its_events_are_announced(
    env: tuple[Store, Settings], follow: Follow
) -> None:
    store, settings = env
    bus = LocalBus()
    record, lease = await held_elsewhere(store)
    seen: list[Event] = []
    ended: list[RunRecord] = []

    async def observe(event: Event) -> None:
        seen.append(event)

    async def follower() -> None:
        ended.append(await follow(store, settings, bus, record.id, observe))

    with anyio.fail_after(30):
        async with (
            RunExecutor(store, settings, bus=bus) as elsewhere,
            anyio.create_task_group() as g,
        ):
            g.start_soon(follower)
            assert await elsewhere.execute(record, lease) == "done"
    [final] = ended
    assert (final.state, final.output) == (RunState.SUCCEEDED, "one")
    stored = await store.list_events(record.id)
    assert [e.seq for e in seen] == [e.seq for e in stored]
    assert seen[-1].type is EventType.RUN_FINISH


async def test_the_runner_claims_a_run_whose_holder_went_silent(
    env: tuple[Store, Settings],
) -> None:
    store, settings = env
    record, _ = await held_elsewhere(store, lease_seconds=0.5)  # then never renewed
    async with LocalRunner(store, settings, bus=LocalBus(), poll_seconds=0.05) as runner:
        final = await runner.see_through(record.id)
    assert (final.state, final.output, final.attempts) == (RunState.SUCCEEDED, "one", 2)


@pytest.mark.parametrize("follow", FOLLOWERS)
async def test_a_run_deleted_while_followed_is_not_found(
    env: tuple[Store, Settings], follow: Follow
) -> None:
    store, settings = env
    bus = LocalBus()
    record, lease = await held_elsewhere(store)
    await store.append_events([Event(record.id, 1, StepStartData(step=1))], lease)
    seen: list[Event] = []

    async def observe(event: Event) -> None:
        """The follower has read the run: delete it, and tell the follower to look again."""
        seen.append(event)
        await delete_run(settings.db_url, record.id)
        await bus.announce_events(record.id, 2)

    with anyio.fail_after(30), pytest.raises(NotFoundError, match=f"task '{record.id}' not found"):
        await follow(store, settings, bus, record.id, observe)
    assert [e.seq for e in seen] == [1]
