"""The inbox consumer of a worker: agent messages delivered by the bus become node runs.

A system run's coordinator (:mod:`corral.runtime.systems`) stores each message and,
on a bus that delivers agent messages across workers (NATS JetStream), publishes it
to its agent's inbox. Every worker takes deliveries from the inboxes and, for each:

- reads the message from the store (the source of truth; a delivery grants nothing):
  gone, or an id no message can have (a forged publish) -> ``term``; no longer
  pending (delivered, finished) -> ``ack``;
- creates its node run, keyed by the message id, and marks it ``delivered``
  (:func:`~corral.runtime.systems.deliver`: a duplicate delivery, or the coordinator
  delivering the same message after its grace, finds the same node run), then
  ``ack``. The delivery is acknowledged once the node run is durably created: from
  then on the node run has its own lease and redelivery, like any run;
- a store failure (retryable) -> ``nak`` with a delay, so the message comes again;
  on the ``last`` delivery the message is marked ``dead_letter`` instead and its
  system run announced: the coordinator fails the system run with a clear error
  (the message could not be delivered) at its next pass;
- a message that can never be delivered (its agent or system run gone) -> marked
  ``dead_letter`` with the reason, the same way, and acked.

Deliveries are handled concurrently, up to :data:`HANDLING` at once: the consumer takes
the next while earlier ones are still being handled (the messages a coordinator publishes
one after another, the branches of a fan-out, each reach a worker at once; a fetch
that waited for the last handling of the one before would hold each back by a whole
delivery).
"""

from __future__ import annotations

import logging

import anyio

from corral.bus.base import Bus, MessageDelivery
from corral.core.agent_messages import MessageState
from corral.core.errors import ConflictError, NotFoundError, UserError
from corral.runtime.health import TRANSIENT
from corral.runtime.system_messages import deliver, is_message_id
from corral.store.base import Store

log = logging.getLogger(__name__)

#: how long one fetch of message deliveries waits before looking at ``stop`` again
TAKE_SECONDS = 1.0
#: deliveries taken at once
BATCH = 16
#: deliveries handled at once, at most (each a store transaction or two, then its ack)
HANDLING = 64
#: how soon a delivery that hit a store failure comes again
RETRY_SECONDS = 1.0


class InboxConsumer:
    """Takes agent message deliveries from ``bus`` and turns them into node runs."""

    def __init__(self, store: Store, bus: Bus) -> None:
        self.store = store
        self.bus = bus
        self.delivered = 0  # node runs this consumer created (or found)

    async def serve(self, stop: anyio.Event) -> None:
        """Take and handle deliveries until ``stop`` is set (then finish those taken)."""
        # concurrently: each is its own message and node run (keyed by the message id), and
        # a burst of system runs must not queue behind one store round trip after another
        # while their coordinators wait for the deliveries
        free = anyio.Semaphore(HANDLING)
        async with anyio.create_task_group() as group:
            while not stop.is_set():
                if free.value == 0:  # as many as it may handle: wait for one to end
                    await free.acquire()
                    free.release()
                deliveries = await self.bus.take_agent_messages(
                    min(BATCH, free.value), TAKE_SECONDS
                )
                for delivery in deliveries:
                    await free.acquire()  # (at once: no more were taken than were free)
                    group.start_soon(self._handled, delivery, free)

    async def _handled(self, delivery: MessageDelivery, free: anyio.Semaphore) -> None:
        try:
            await self.handle(delivery)
        finally:
            free.release()

    async def handle(self, delivery: MessageDelivery) -> None:
        """Handle one delivery, settling it exactly once (see the module docstring)."""
        if not is_message_id(delivery.message_id):  # forged: no store is asked about it
            await delivery.term()
            return
        try:
            message = await self.store.get_agent_message(delivery.message_id)
            if message is None:
                await delivery.term()
                return
            if message.state is not MessageState.PENDING:
                await delivery.ack()
                return
            try:
                await deliver(self.store, self.bus, message, attempt=delivery.attempt)
            except (NotFoundError, ConflictError, UserError) as exc:
                await self._dead(delivery, exc.message)
                return
            self.delivered += 1
            # the system run's coordinator waits for its deliveries on the run's events (its
            # journal did not move: a follower that wakes for this reads nothing new)
            await self.bus.announce_events(message.system_run_id, 0)
            await delivery.ack()
        except TRANSIENT as exc:
            if delivery.last:
                log.warning(
                    "inbox: message %s could not be delivered on its last try: %s",
                    delivery.message_id,
                    exc.message,
                )
                try:
                    await self._dead(delivery, exc.message)
                except TRANSIENT:  # the store is still away: the coordinator's grace covers it
                    await delivery.ack()
                return
            await delivery.nak(RETRY_SECONDS * delivery.attempt)

    async def _dead(self, delivery: MessageDelivery, reason: str) -> None:
        """Mark the message ``dead_letter`` (why, and after how many deliveries), announce
        its system run, and settle the delivery."""
        error = {"code": "dead_letter", "message": reason}
        marked = await self.store.mark_agent_message(
            delivery.message_id, MessageState.DEAD_LETTER, error=error, attempt=delivery.attempt
        )
        await delivery.ack()
        if marked is not None:
            await self.bus.announce_runnable(
                [marked.system_run_id], mark=f"dead:{delivery.message_id}"
            )
