"""What one pass of a system run's coordinator knows, and the position it leaves behind.

A pass (:mod:`corral.runtime.systems`) needs the run's unfinished messages, their node
runs and which of their events the journal has; the finished part of the run matters
only for a few counts (how many messages, what the taken node runs spent) and once at
the end (the output node's last output). Rereading all of it on every pass made a long
run quadratic, so each pass saves a :class:`Position` with the run (``runs.position``,
in the save that parks it, with the pass's last events):

- ``token``: the fencing token of the claim the pass ran under;
- ``seq``: the seq of its last event (the journal is whole up to there);
- ``messages``: how many messages the run has;
- ``open``: its unfinished messages, each with the node run whose ``message.deliver``
  and ``child.start`` the journal has (``None``: only its ``message.send``).

The run's ``usage``, ``cost_usd`` and ``steps`` (the node runs taken so far) are saved
in the same row. A pass under the very next claim (``token + 1``: nothing ran the run in
between) trusts the position and reads only the unfinished messages and their node
runs (:meth:`SystemPass.fresh`). Under any other claim - the last pass crashed, or was
released, or the run was parked before positions existed - the position may be behind
the store, and the pass rebuilds from everything, as each pass did before: all the
messages, node runs and events (:meth:`SystemPass.rebuilt`). Either way the store stays the
source of truth: a position only ever spares reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from corral.core.agent_messages import AgentMessage, MessageState
from corral.core.events import (
    AnyEventData,
    BranchJoinData,
    ChildFinishData,
    ChildStartData,
    Event,
    EventType,
    MessageDeliverData,
    MessageSendData,
)
from corral.core.messages import Usage
from corral.core.runs import RunRecord
from corral.resources.systems import AgentSystemSpec
from corral.store.base import Store

#: the messages a pass reads when it trusts its position: the unfinished ones, and
#: those dead-lettered (each fails the run, so at most one pass sees one)
LIVE = (MessageState.PENDING, MessageState.DELIVERED, MessageState.DEAD_LETTER)
#: the states of a message whose node run's spend the run has taken
TAKEN = (MessageState.DONE, MessageState.FAILED)


@dataclass(frozen=True)
class Position:
    """What the last pass of a system run knew (see the module docstring)."""

    token: int
    seq: int
    messages: int
    open: dict[str, str | None]

    @classmethod
    def of(cls, record: RunRecord) -> Position | None:
        """The position ``record`` was saved with, when its claim is the next one after
        that pass's (else ``None``: rebuild)."""
        saved = record.position
        if not isinstance(saved, dict):
            return None
        try:
            position = cls(
                int(saved["token"]), int(saved["seq"]), int(saved["messages"]), dict(saved["open"])
            )
        except (KeyError, TypeError, ValueError):
            return None
        return position if position.token + 1 == record.fencing_token else None

    def dump(self) -> dict[str, Any]:
        return {"token": self.token, "seq": self.seq, "messages": self.messages, "open": self.open}


@dataclass
class SystemPass:
    """What one pass of the coordinator knows: the messages and node runs it read (all of
    them when ``complete``, else the unfinished ones), the journal's events by key, and
    the run's counts."""

    record: RunRecord
    spec: AgentSystemSpec
    messages: dict[str, AgentMessage]
    children: dict[str, RunRecord]
    #: (event type, key) of the events the journal has: what not to write again
    journaled: set[tuple[str, str]] = field(default_factory=set[tuple[str, str]])
    #: whether ``messages`` and ``children`` are all of the run's
    complete: bool = True
    #: how many messages the run has (``max_messages``)
    total: int = 0
    #: what the node runs taken so far spent, and how many they are
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    taken: int = 0

    @classmethod
    async def rebuilt(
        cls, store: Store, record: RunRecord, spec: AgentSystemSpec, events: list[Event]
    ) -> SystemPass:
        """A pass that reads the whole run (``events``: its whole journal)."""
        state = cls(
            record,
            spec,
            {m.id: m for m in await store.list_agent_messages(record.id)},
            {c.id: c for c in await store.list_children(record.id)},
            {(e.type.value, event_key(e.data)) for e in events},
        )
        state.total = len(state.messages)
        for message in state.messages.values():
            child = state.child_of(message)
            if message.state in TAKEN and child is not None and child.state.finished:
                state.charge(child)
        return state

    @classmethod
    async def fresh(
        cls, store: Store, record: RunRecord, spec: AgentSystemSpec, position: Position
    ) -> SystemPass:
        """A pass that trusts ``position``: it reads the live messages and their node runs."""
        messages = {m.id: m for m in await store.list_agent_messages(record.id, states=LIVE)}
        ids = [m.child_run_id for m in messages.values() if m.child_run_id is not None]
        children = {c.id: c for c in await store.list_children(record.id, ids=ids)} if ids else {}
        journaled: set[tuple[str, str]] = set()
        for message_id, child_id in position.open.items():
            journaled.add((EventType.MESSAGE_SEND.value, message_id))
            if child_id is not None:
                journaled.add((EventType.MESSAGE_DELIVER.value, message_id))
                journaled.add((EventType.CHILD_START.value, child_id))
        return cls(
            record,
            spec,
            messages,
            children,
            journaled,
            complete=False,
            total=position.messages,
            usage=record.usage,
            cost_usd=record.cost_usd,
            taken=record.steps,
        )

    async def complete_from(self, store: Store) -> None:
        """Read the whole run (the end of it needs the finished part too); what this pass
        changed is in the store already."""
        if self.complete:
            return
        self.messages = {m.id: m for m in await store.list_agent_messages(self.record.id)}
        self.children = {c.id: c for c in await store.list_children(self.record.id)}
        self.complete = True

    def charge(self, child: RunRecord) -> None:
        """Count the spend of a node run taken (its message marked done or failed)."""
        self.usage = self.usage + child.usage
        self.cost_usd += child.cost_usd
        self.taken += 1

    def position(self, seq: int) -> Position:
        """The position this pass leaves (``seq``: its last event's)."""
        open_: dict[str, str | None] = {}
        for message in self.messages.values():
            if message.state.finished:
                continue
            if (EventType.MESSAGE_SEND.value, message.id) not in self.journaled:
                continue  # (the next pass writes its message.send)
            child = message.child_run_id
            started = child is not None and (
                (EventType.MESSAGE_DELIVER.value, message.id) in self.journaled
                and (EventType.CHILD_START.value, child) in self.journaled
            )
            open_[message.id] = child if started else None
        return Position(self.record.fencing_token, seq, self.total, open_)

    def ordered(self) -> list[AgentMessage]:
        return sorted(self.messages.values(), key=lambda m: (m.created_at, m.id))

    def child_of(self, message: AgentMessage) -> RunRecord | None:
        return self.children.get(message.child_run_id) if message.child_run_id else None

    def unfinished_children(self) -> Iterable[RunRecord]:
        return (c for c in self.children.values() if not c.state.finished)


#: the events a system run's coordinator journals about its messages and node runs
SystemEventData = (
    MessageSendData | MessageDeliverData | BranchJoinData | ChildStartData | ChildFinishData
)


def event_key(data: AnyEventData) -> str:
    """What an event of a system run is about (one event of each type per key): a node
    run's id, a message's id (``None`` for the run's own events)."""
    match data:
        case ChildStartData(run_id=run_id) | ChildFinishData(run_id=run_id):
            return run_id
        case MessageSendData(message_id=ident) | MessageDeliverData(message_id=ident):
            return ident
        case BranchJoinData(message_id=ident):
            return ident
        case _:
            return "None"


__all__ = ["LIVE", "TAKEN", "Position", "SystemEventData", "SystemPass", "event_key"]
