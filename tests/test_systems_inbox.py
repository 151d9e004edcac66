"""The inbox consumer (runtime/inbox.py) over the in-process bus, which delivers agent
messages with the NATS bus's semantics: a delivery becomes one node run keyed by the
message id, duplicates find it, an unknown message is terminated, an undeliverable one
is dead-lettered and fails its system run with a clear error."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.bus.local import LocalBus
from corral.core.agent_messages import AgentMessage, MessageState
from corral.core.errors import NotFoundError
from corral.core.runs import RunRecord, RunState
from corral.core.settings import Settings
from corral.resources.loader import load_text
from corral.resources.secrets import SecretCipher
from corral.runtime.inbox import InboxConsumer
from corral.runtime.system_messages import deliver
from corral.runtime.system_runs import submit_system
from corral.runtime.systems import (
    BUS_DELIVERY_FIRST_POLL_SECONDS,
    BUS_DELIVERY_POLL_SECONDS,
    DELIVERY_GRACE_SECONDS,
    delivery_polls,
)
from corral.runtime.worker import Worker
from corral.store import Store, StoreError
from corral.store.sql import SqlStore
from systems_helpers import deliver_all, input_message

TEAM = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: m}
spec: {provider: scripted, script: [{text: "an answer"}]}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: solo}
spec: {model: m}
---
apiVersion: corral/v1
kind: AgentSystem
metadata: {name: team}
spec: {entry: solo}
"""


async def stored_input(store: Store, to: str = "solo") -> tuple[RunRecord, AgentMessage]:
    """The system ``team`` applied and run on "hello"; the run, and its input message to
    ``to`` as its coordinator stores it (not yet published)."""
    await store.apply(load_text(TEAM, "team.yaml"))
    run, _ = await submit_system(store, "team", "hello")
    message = input_message(run.id, to)
    await store.add_agent_messages([message])
    return run, message


async def test_a_delivery_becomes_one_node_run_however_often_it_comes(
    env: tuple[Store, Settings],
) -> None:
    store, _ = env
    run, message = await stored_input(store)
    bus = LocalBus()
    consumer = InboxConsumer(store, bus)
    await bus.send_agent_message("default", "solo", message.id)
    await deliver_all(bus, consumer)
    stored = await store.get_agent_message(message.id)
    assert stored is not None and stored.state is MessageState.DELIVERED
    assert stored.attempt == 1 and stored.child_run_id is not None
    (child,) = await store.list_children(run.id)
    assert (child.id, child.agent, child.input, child.branch_id) == (
        stored.child_run_id,
        "solo",
        "hello",
        "1",
    )
    # delivered again (a redelivery, a second publish after the duplicate window): acked
    delivery_count = consumer.delivered
    again = LocalBus()
    await again.send_agent_message("default", "solo", message.id)
    await deliver_all(again, InboxConsumer(store, again))
    assert consumer.delivered == delivery_count
    assert len(await store.list_children(run.id)) == 1


async def test_a_delivery_wakes_the_coordinator_waiting_on_its_system_runs_events(
    env: tuple[Store, Settings],
) -> None:
    # the coordinator waits for the consumers' deliveries on the system run's events: a
    # delivery announces there, so the coordinator looks then instead of at its next poll
    store, _ = env
    run, message = await stored_input(store)
    bus = LocalBus()
    async with bus.watch_events(run.id) as watch:
        await bus.send_agent_message("default", "solo", message.id)
        assert not await watch.wait(0)
        await deliver_all(bus, InboxConsumer(store, bus))
        assert await watch.wait(0)


async def test_an_unknown_message_is_terminated(env: tuple[Store, Settings]) -> None:
    store, _ = env
    bus = LocalBus()
    await bus.send_agent_message("default", "solo", "msg_nope")
    await deliver_all(bus, InboxConsumer(store, bus))
    assert await bus.take_agent_messages(10, 0.1) == []  # never delivered again
    assert list(bus.dead_letters) == []


async def test_an_undeliverable_message_fails_its_system_run_clearly(
    env: tuple[Store, Settings],
) -> None:
    store, settings = env
    run, message = await stored_input(store, "ghost")  # no such Agent: it can never be delivered
    bus = LocalBus()
    await bus.send_agent_message("default", "ghost", message.id)
    await deliver_all(bus, InboxConsumer(store, bus))
    stored = await store.get_agent_message(message.id)
    assert stored is not None and stored.state is MessageState.DEAD_LETTER
    assert stored.error is not None and "ghost" in stored.error["message"]
    worker = Worker(store, settings, bus=bus, poll_seconds=0.05)
    with anyio.fail_after(20):
        await worker.serve(anyio.Event(), until_idle=True)
    failed = await store.get_run(run.id)
    assert failed is not None and failed.state is RunState.FAILED and failed.error is not None
    assert "could not be delivered" in failed.error["message"]
    assert "'ghost'" in failed.error["message"]


class LockedStore(SqlStore):
    """A real store whose run submits fail (a locked database) while ``locked`` is set."""

    locked = False

    async def submit_agent_run(self, *args: Any, **kwargs: Any) -> Any:
        if self.locked:
            raise StoreError("cannot submit a run: the database stayed locked")
        return await super().submit_agent_run(*args, **kwargs)


async def test_a_store_failure_naks_the_delivery_and_a_redelivery_makes_the_node_run(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'corral.db'}"
    store = await LockedStore.open(url, cipher=SecretCipher(key=SecretCipher.generate_key()))
    try:
        run, message = await stored_input(store)
        bus = LocalBus(max_deliver=3)
        consumer = InboxConsumer(store, bus)
        await bus.send_agent_message("default", "solo", message.id)
        store.locked = True
        await deliver_all(bus, consumer)  # first delivery: nak'ed with a delay
        stored = await store.get_agent_message(message.id)
        assert stored is not None and stored.state is MessageState.PENDING
        store.locked = False
        with anyio.fail_after(10):
            while consumer.delivered == 0:
                await deliver_all(bus, consumer)
        stored = await store.get_agent_message(message.id)
        assert stored is not None and stored.state is MessageState.DELIVERED
        assert stored.attempt == 2
        assert len(await store.list_children(run.id)) == 1
        assert list(bus.dead_letters) == []
    finally:
        await store.close()


async def test_the_last_delivery_failing_dead_letters_the_message(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'corral.db'}"
    store = await LockedStore.open(url, cipher=SecretCipher(key=SecretCipher.generate_key()))
    try:
        run, message = await stored_input(store)
        bus = LocalBus(max_deliver=1)  # the first delivery is the last
        await bus.send_agent_message("default", "solo", message.id)
        store.locked = True
        await deliver_all(bus, InboxConsumer(store, bus))
        stored = await store.get_agent_message(message.id)
        assert stored is not None and stored.state is MessageState.DEAD_LETTER
        assert stored.error is not None and "locked" in stored.error["message"]
        assert await store.list_children(run.id) == []
    finally:
        await store.close()


def test_the_coordinator_looks_for_a_published_delivery_soon_then_less_often() -> None:
    # a consumer on an idle worker delivers in milliseconds: the first look is after 2 ms
    # (not a whole poll interval per pass that publishes), the later ones back off to it
    waits = list(itertools.islice(delivery_polls(), 8))
    assert waits[0] == BUS_DELIVERY_FIRST_POLL_SECONDS == 0.002
    assert all(b == min(2 * a, BUS_DELIVERY_POLL_SECONDS) for a, b in itertools.pairwise(waits))
    assert waits[-1] == BUS_DELIVERY_POLL_SECONDS
    # the looks within the grace stay few: a lost publish costs about grace / poll reads
    assert sum(waits[:5]) < BUS_DELIVERY_POLL_SECONDS * 2 < DELIVERY_GRACE_SECONDS


async def test_deliver_hands_back_the_message_as_marked_and_a_second_delivery_none(
    env: tuple[Store, Settings],
) -> None:
    store, _ = env
    run, message = await stored_input(store)
    # the coordinator passes the system run it holds (no read of it)
    first = await deliver(store, None, message, parent=run)
    assert first.message is not None and first.message.state is MessageState.DELIVERED
    assert first.message.child_run_id == first.run.id
    assert first.message == await store.get_agent_message(message.id)
    assert (first.run.parent_run_id, first.run.system) == (run.id, "team")
    # delivered again (a consumer beat it): the same node run, the message not marked again
    second = await deliver(store, None, message)
    assert (second.run.id, second.message) == (first.run.id, None)
    # a parent that is not the message's system run is refused, not used
    (other, _) = await submit_system(store, "team", "another")
    with pytest.raises(NotFoundError):
        await deliver(store, None, input_message(run.id, "solo"), parent=other)


class MeetingStore(SqlStore):
    """A real store whose run submits wait until ``expected`` of them are in at once."""

    expected = 2

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inside = 0
        self.met = anyio.Event()

    async def submit_agent_run(self, *args: Any, **kwargs: Any) -> Any:
        self.inside += 1
        if self.inside >= self.expected:
            self.met.set()
        await self.met.wait()
        return await super().submit_agent_run(*args, **kwargs)


@asynccontextmanager
async def meeting(tmp_path: Path) -> AsyncIterator[tuple[MeetingStore, list[AgentMessage]]]:
    """A :class:`MeetingStore` with two system runs of ``team``, each with its input message
    stored (not yet published)."""
    url = f"sqlite:///{tmp_path / 'corral.db'}"
    store = await MeetingStore.open(url, cipher=SecretCipher(key=SecretCipher.generate_key()))
    try:
        await store.apply(load_text(TEAM, "team.yaml"))
        messages = []
        for n in range(2):
            run, _ = await submit_system(store, "team", f"hello {n}")
            messages.append(input_message(run.id, "solo"))
        await store.add_agent_messages(messages)
        yield store, messages
    finally:
        await store.close()


async def test_the_deliveries_of_one_fetch_are_handled_concurrently(tmp_path: Path) -> None:
    async with meeting(tmp_path) as (store, messages):
        bus = LocalBus()
        for message in messages:
            await bus.send_agent_message("default", "solo", message.id)
        consumer = InboxConsumer(store, bus)
        stop = anyio.Event()
        # one after the other, the first submit would wait for the second forever
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(consumer.serve, stop)
                while consumer.delivered < 2:
                    await anyio.sleep(0.01)
                stop.set()
        for message in messages:
            stored = await store.get_agent_message(message.id)
            assert stored is not None and stored.state is MessageState.DELIVERED
            assert len(await store.list_children(message.system_run_id)) == 1


async def test_a_delivery_is_taken_while_an_earlier_one_is_still_being_handled(
    tmp_path: Path,
) -> None:
    # the second message is published while the first one's node run is being submitted
    # (which waits for a second submit): a consumer that took nothing more until the
    # first was handled would never deliver it
    async with meeting(tmp_path) as (store, messages):
        bus = LocalBus()
        consumer = InboxConsumer(store, bus)
        stop = anyio.Event()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(consumer.serve, stop)
                await bus.send_agent_message("default", "solo", messages[0].id)
                while store.inside < 1:
                    await anyio.sleep(0.01)
                await bus.send_agent_message("default", "solo", messages[1].id)
                while consumer.delivered < 2:
                    await anyio.sleep(0.01)
                stop.set()
        for message in messages:
            assert len(await store.list_children(message.system_run_id)) == 1
