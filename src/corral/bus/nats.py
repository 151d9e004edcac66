"""The scale-out bus: NATS JetStream for dispatch, core NATS for wake-ups and event fan-out.

What goes where, under a deployment's prefix (``corral`` by default; tests use
a random one each):

``<prefix>.runnable``  a work-queue stream ``<prefix>_runnable``: one message per
                       announced run (payload: the run id), consumed by the
                       durable pull consumer ``workers`` that every worker shares
``<prefix>.inbox.<namespace>.<agent>``  a work-queue stream ``<prefix>_messages``:
                       one subject per agent inbox, one message per stored agent
                       message (payload: its id and its inbox), consumed by the
                       durable pull consumer ``inboxes`` that every worker shares
``<prefix>.dead``      a stream ``<prefix>_dead``: dispatches delivered
                       ``max_deliver`` times without being settled; agent messages
                       that ran out of deliveries go to ``<prefix>.dead.messages``
``<prefix>.wake``      core NATS: "something became runnable" (:meth:`wait_runnable`)
``<prefix>.events.<run>``  core NATS: "events stored up to <seq>" (payload: the seq)

Dispatch. An announcement is published with ``Nats-Msg-Id`` = ``<run id>:<mark>``,
the mark naming the change that made the run runnable (see
:meth:`Bus.announce_runnable`): the stream's duplicate window drops the same
change announced twice, while a later change of the same run (released after a
shutdown, queued by the decision of another approval) has another mark and
always gets through. A worker fetches deliveries, claims each run by id through
the store, calls ``in_progress`` while it executes and acks when the run no
longer needs it; a delivery left unsettled for ``ack_wait`` is delivered again.
When a delivery has been delivered ``max_deliver`` times, the server's
``MAX_DELIVERIES`` advisory makes one of the consuming buses copy it to
``<prefix>.dead`` and delete it from the work queue. The run itself is not
dead: it stays in the store, where the workers' sweep and its ``max_attempts``
decide what becomes of it; the dead letter tells an operator that dispatching
it kept failing.

Agent messages. :meth:`NatsBus.send_agent_message` publishes a stored message's
id to its receiving agent's inbox subject with ``Nats-Msg-Id`` = the message id,
so a coordinator that sends the same message again within the duplicate window
(after a crash, or from a second replica) publishes nothing new. The namespace
and the agent become one subject token each (:func:`inbox_token`): a plain name
is itself, anything else (dots, wildcards, spaces, unicode, long names) a hash,
so no name can reach into another inbox or match several. The payload repeats
the namespace and agent, and a delivery whose subject is not the inbox its
payload names is terminated, never handed out. They live in a stream of their
own rather than beside ``<prefix>.runnable``: its duplicate window, age limit
and dead letters are its own, and an operator can look at (or purge) the
inboxes without touching run dispatch. The dead letter of a message is for an
operator too: the message stays in the store, where its consumer (told by
``last``) or the coordinator's sweep settles it.

Failures. Connecting at open is the only place that raises (:class:`BusError`).
Afterwards nats-py reconnects by itself, forever; announcements made while the
connection is down are dropped with a log line (the store sweep finds the work),
fetches return nothing, and settlements are lost (the delivery comes again and
the store decides). After a reconnect the next fetch sets the streams and the
consumer up again, which also recreates them on a server that lost its store.
Nothing from ``nats`` travels past this module.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field

import anyio
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api
from nats.js.client import JetStreamContext

from corral.bus.base import Bus, Delivery, EventWatch, MessageDelivery
from corral.bus.local import SignalWatch
from corral.core.errors import BusError, ConfigurationError

log = logging.getLogger(__name__)

#: what a failing NATS operation raises (the client's own errors, sockets, timeouts)
NATS_FAILURES = (nats.errors.Error, OSError, TimeoutError)

CONSUMER = "workers"
#: the durable consumer of the agent inboxes, shared by the workers
INBOX_CONSUMER = "inboxes"
#: how long a publish waits for JetStream's acknowledgement
PUBLISH_TIMEOUT_SECONDS = 2.0
#: how long the dead-letter stream keeps a message
DEAD_LETTER_MAX_AGE_SECONDS = 7 * 86400.0
#: a dispatch nobody settles is gone after this long (the store sweep still finds its run)
RUNNABLE_MAX_AGE_SECONDS = 86400.0
#: how long the duplicate window of the work queue remembers a Nats-Msg-Id
DUPLICATE_WINDOW_SECONDS = 120.0
#: how long a fetch for the messages already waiting may take (the server answers at once)
MORE_SECONDS = 0.05
#: at most one attempt per this long to recreate streams that went missing
ENSURE_INTERVAL_SECONDS = 1.0

_PREFIX = re.compile(r"^[A-Za-z0-9_-]+$")
_TOKEN = re.compile(r"^[^.*>\s]+$")
#: a namespace or agent name used as its inbox token as it is ("_" never appears in one)
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9-]{1,64}$")
#: a message id used as its Nats-Msg-Id as it is (printable ASCII, no spaces, not
#: starting with "_", which marks the hash of any other id)
_PLAIN_ID = re.compile(r"^[\x21-\x5e\x60-\x7e][\x21-\x7e]{0,199}$")

Callback = Callable[[], Awaitable[None]]


def subject_token(text: str) -> str:
    """``text`` as one subject token: itself when it is one, else hex (ids always are one)."""
    return text if _TOKEN.match(text) else "x" + text.encode().hex()


def inbox_token(name: str) -> str:
    """``name`` (a namespace or an agent) as the subject token of its inbox.

    A plain name (letters, digits, ``-``; at most 64) is itself; any other becomes
    ``_`` and a 160-bit hash of it, which no plain name can equal (plain names have
    no ``_``) and which holds no ``.``, ``*``, ``>`` or space: two names never share
    an inbox, and no name is a wildcard or spans tokens.
    """
    if _PLAIN_NAME.match(name):
        return name
    return "_" + hashlib.blake2b(name.encode(errors="surrogatepass"), digest_size=20).hexdigest()


def inbox_subject(prefix: str, namespace: str, agent: str) -> str:
    """The subject of ``agent``'s inbox in ``namespace`` under ``prefix``."""
    return f"{prefix}.inbox.{inbox_token(namespace)}.{inbox_token(agent)}"


def message_msg_id(message_id: str) -> str:
    """The ``Nats-Msg-Id`` of a message: its id, or a hash of an id unfit for a header."""
    if _PLAIN_ID.match(message_id):
        return message_id
    digest = hashlib.blake2b(message_id.encode(errors="surrogatepass"), digest_size=20)
    return "_" + digest.hexdigest()


class _Settling:
    """Settles one JetStream message at most once; a settlement lost is logged, never raised."""

    _msg: Msg
    #: what the message is about, for the log line of a lost settlement
    _about: str

    async def ack(self) -> None:
        await self._settle("ack", self._msg.ack)

    async def nak(self, delay: float = 0.0) -> None:
        await self._settle("nak", lambda: self._msg.nak(delay=delay if delay > 0 else None))

    async def in_progress(self) -> None:
        await self._settle("in_progress", self._msg.in_progress)

    async def term(self) -> None:
        await self._settle("term", self._msg.term)

    async def _settle(self, what: str, send: Callback) -> None:
        try:
            await send()
        except NATS_FAILURES as exc:
            # Lost with the connection: the delivery comes again after its ack wait.
            log.info("bus: %s of %s not sent (%s)", what, self._about, _describe(exc))


class _NatsDelivery(_Settling, Delivery):
    """A JetStream message of the work queue, settled at most once."""

    def __init__(self, msg: Msg, run_id: str, max_deliver: int) -> None:
        self._msg = msg
        self.run_id = run_id
        self.attempt = msg.metadata.num_delivered
        self.last = self.attempt >= max_deliver
        self._about = f"run {run_id}"


class _NatsMessageDelivery(_Settling, MessageDelivery):
    """A JetStream message of an agent inbox, settled at most once."""

    def __init__(
        self, msg: Msg, message_id: str, namespace: str, agent: str, max_deliver: int
    ) -> None:
        self._msg = msg
        self.message_id = message_id
        self.namespace = namespace
        self.agent = agent
        self.attempt = msg.metadata.num_delivered
        self.last = self.attempt >= max_deliver
        self._about = f"agent message {message_id}"


@dataclass
class _RunWatchers:
    """The watches of one run in this process, behind one subscription."""

    watches: set[SignalWatch] = field(default_factory=set[SignalWatch])
    subscription: Subscription | None = None
    ready: anyio.Event = field(default_factory=anyio.Event)


class NatsBus(Bus):
    """The bus of a scale-out deployment; open it with :meth:`connect` (or ``open_bus``)."""

    dispatches = True
    delivers_messages = True

    def __init__(
        self,
        client: Client,
        *,
        prefix: str = "corral",
        ack_wait_seconds: float = 30.0,
        max_deliver: int = 5,
    ) -> None:
        if not _PREFIX.match(prefix):
            raise ConfigurationError(
                f"the NATS prefix must be letters, digits, '_' or '-', not {prefix!r}"
            )
        if max_deliver < 2:
            raise ConfigurationError(f"max_deliver must be at least 2, not {max_deliver}")
        self.client = client
        self.js: JetStreamContext = client.jetstream(timeout=PUBLISH_TIMEOUT_SECONDS)
        self.prefix = prefix
        self.ack_wait_seconds = ack_wait_seconds
        self.max_deliver = max_deliver
        self.stream = f"{prefix}_runnable"
        self.dead_stream = f"{prefix}_dead"
        self.runnable_subject = f"{prefix}.runnable"
        self.dead_subject = f"{prefix}.dead"
        self.wake_subject = f"{prefix}.wake"
        self.messages_stream = f"{prefix}_messages"
        self.inbox_subjects = f"{prefix}.inbox.>"
        self.dead_messages_subject = f"{prefix}.dead.messages"
        self._closed = False
        self._runnable = anyio.Event()
        self._wake_subscription: Subscription | None = None
        self._watchers: dict[str, _RunWatchers] = {}
        self._pull: JetStreamContext.PullSubscription | None = None
        self._advisories: Subscription | None = None
        self._fetching = anyio.Lock()
        self._inbox_pull: JetStreamContext.PullSubscription | None = None
        self._inbox_advisories: Subscription | None = None
        self._fetching_messages = anyio.Lock()
        self._next_ensure = 0.0
        self._reconnected = False

    # ----------------------------------------------------------------- opening and closing

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        prefix: str = "corral",
        ack_wait_seconds: float = 30.0,
        max_deliver: int = 5,
        name: str | None = None,
        connect_attempts: int = 3,
    ) -> NatsBus:
        """Connect to ``url`` (comma-separated servers) and make sure the streams exist.

        ``BusError`` when no server answers within ``connect_attempts`` tries or
        JetStream refuses the streams. Once connected, the client reconnects
        forever: a NATS restart only pauses the bus.
        """
        client = Client()
        bus = cls(client, prefix=prefix, ack_wait_seconds=ack_wait_seconds, max_deliver=max_deliver)
        servers = [s.strip() for s in url.split(",") if s.strip()]
        try:
            await client.connect(
                servers=servers,
                name=name,
                # Messages this process publishes reach its own watchers directly.
                no_echo=True,
                connect_timeout=2,
                reconnect_time_wait=1,
                # Bounded at first, so a wrong URL fails the start; unbounded below.
                max_reconnect_attempts=connect_attempts,
                error_cb=_on_error,
                disconnected_cb=bus._on_disconnected,
                reconnected_cb=bus._on_reconnected,
                closed_cb=_logged(logging.DEBUG, "bus: NATS connection closed"),
            )
        except NATS_FAILURES as exc:
            await _close_quietly(client)
            raise BusError(f"cannot connect to NATS at {url}: {_describe(exc)}") from None
        client.options["max_reconnect_attempts"] = -1  # reconnect forever from now on
        try:
            await bus._ensure()
        except NATS_FAILURES as exc:
            await _close_quietly(client)
            raise BusError(
                f"cannot set up the JetStream streams on {url}: {_describe(exc)}"
            ) from None
        return bus

    async def _ensure(self) -> None:
        """Create (or bring up to date) the streams and the consumer: idempotent."""
        await self._ensure_stream(
            api.StreamConfig(
                name=self.stream,
                subjects=[self.runnable_subject],
                retention=api.RetentionPolicy.WORK_QUEUE,
                storage=api.StorageType.FILE,
                duplicate_window=DUPLICATE_WINDOW_SECONDS,
                max_age=RUNNABLE_MAX_AGE_SECONDS,
            )
        )
        await self._ensure_stream(
            api.StreamConfig(
                name=self.messages_stream,
                subjects=[self.inbox_subjects],
                retention=api.RetentionPolicy.WORK_QUEUE,
                storage=api.StorageType.FILE,
                duplicate_window=DUPLICATE_WINDOW_SECONDS,
                max_age=RUNNABLE_MAX_AGE_SECONDS,
            )
        )
        await self._ensure_stream(
            api.StreamConfig(
                name=self.dead_stream,
                subjects=[self.dead_subject, self.dead_messages_subject],
                retention=api.RetentionPolicy.LIMITS,
                storage=api.StorageType.FILE,
                duplicate_window=DUPLICATE_WINDOW_SECONDS,
                max_age=DEAD_LETTER_MAX_AGE_SECONDS,
            )
        )
        # Creating a durable consumer that exists updates it (ack wait, max deliver):
        # the settings of the process that started last apply to all.
        await self.js.add_consumer(
            self.stream,
            api.ConsumerConfig(
                durable_name=CONSUMER,
                ack_policy=api.AckPolicy.EXPLICIT,
                ack_wait=self.ack_wait_seconds,
                max_deliver=self.max_deliver,
                max_ack_pending=-1,
                filter_subject=self.runnable_subject,
            ),
        )
        await self.js.add_consumer(
            self.messages_stream,
            api.ConsumerConfig(
                durable_name=INBOX_CONSUMER,
                ack_policy=api.AckPolicy.EXPLICIT,
                ack_wait=self.ack_wait_seconds,
                max_deliver=self.max_deliver,
                max_ack_pending=-1,
                filter_subject=self.inbox_subjects,
            ),
        )

    async def _ensure_stream(self, config: api.StreamConfig) -> None:
        try:
            await self.js.add_stream(config)
        except nats.js.errors.BadRequestError:  # it exists with another configuration
            await self.js.update_stream(config)

    async def _repair(self) -> None:
        """Set the streams and the consumer up again, at most every ENSURE_INTERVAL_SECONDS.

        After a reconnect: a restarted server (NATS 2.9) redelivers a durable
        consumer's unacknowledged messages only once the consumer is touched again,
        and a server that lost its store has no streams at all. After a failed
        fetch or publish, for the same reasons.
        """
        now = time.monotonic()
        if now < self._next_ensure:
            return
        self._next_ensure = now + ENSURE_INTERVAL_SECONDS
        try:
            await self._ensure()
        except NATS_FAILURES as exc:
            log.info("bus: cannot set the streams up again yet (%s)", _describe(exc))
            return
        self._reconnected = False

    async def _on_disconnected(self) -> None:
        if not self._closed:  # closing disconnects too: a CLI command is no cause for a warning
            log.warning("bus: disconnected from NATS")

    async def _on_reconnected(self) -> None:
        log.warning("bus: reconnected to NATS")
        self._reconnected = True  # the next fetch sets the streams up again first

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await _close_quietly(self.client)

    # ----------------------------------------------------------------- runnable runs

    async def announce_runnable(self, run_ids: Sequence[str], *, mark: str | None = None) -> None:
        if not run_ids or self._closed:
            return
        self._runnable.set()  # this process's own waiters (no echo from the server)
        if not self.client.is_connected:
            log.info("bus: NATS unreachable, %d runnable run(s) left to the sweep", len(run_ids))
            return
        async with anyio.create_task_group() as group:
            for run_id in run_ids:
                group.start_soon(self._publish_runnable, run_id, mark)
        await self._publish(self.wake_subject, b"")

    async def _publish_runnable(self, run_id: str, mark: str | None) -> None:
        headers = {"Nats-Msg-Id": f"{run_id}:{mark}"} if mark is not None else None
        try:
            await self.js.publish(self.runnable_subject, run_id.encode(), headers=headers)
        except NATS_FAILURES as exc:
            log.warning(
                "bus: dispatch of run %s not confirmed (%s); if it was lost, the sweep finds it",
                run_id,
                _describe(exc),
            )
            if not isinstance(exc, TimeoutError):
                await self._repair()

    async def wait_runnable(self, seconds: float) -> None:
        if self._wake_subscription is None and not self._closed:
            self._wake_subscription = await self._subscribe(self.wake_subject, self._on_wake)
        with anyio.move_on_after(seconds):
            await self._runnable.wait()
        if self._runnable.is_set():
            self._runnable = anyio.Event()

    async def _on_wake(self, msg: Msg) -> None:
        self._runnable.set()

    async def take_runnable(self, limit: int, seconds: float) -> list[Delivery]:
        if self._closed:
            await anyio.sleep(seconds)
            return []
        async with self._fetching:
            if self._reconnected:
                await self._repair()
            try:
                pull = await self._consumer()
                messages = await self._fetch(pull, limit, seconds)
            except TimeoutError:  # nothing to do (nats' own TimeoutError is one too)
                return []
            except NATS_FAILURES as exc:
                log.info("bus: fetching dispatches failed (%s)", _describe(exc))
                await self._repair()
                await anyio.sleep(min(seconds, 1.0))
                return []
        deliveries: list[Delivery] = []
        for msg in messages:
            try:
                run_id = msg.data.decode()
            except UnicodeDecodeError:
                run_id = ""
            delivery = _NatsDelivery(msg, run_id, self.max_deliver)
            if run_id:
                deliveries.append(delivery)
            else:
                await delivery.term()  # not one of ours: never deliver it again
        return deliveries

    @staticmethod
    async def _fetch(
        pull: JetStreamContext.PullSubscription, limit: int, seconds: float
    ) -> list[Msg]:
        """The first message as soon as it comes, and as many more as are waiting already.

        A fetch of N waits until N messages came or its time is up, so one fetch
        of ``limit`` would hold the first run back while the queue trickles. The
        first message says how many more the consumer has pending; a second fetch
        asks for no more than that, which the server answers at once.
        """
        messages = await pull.fetch(1, timeout=max(seconds, 0.05))
        waiting = min(limit - 1, messages[-1].metadata.num_pending)
        if waiting > 0:
            with suppress(TimeoutError):  # another worker took them meanwhile
                messages += await pull.fetch(waiting, timeout=MORE_SECONDS)
        return messages

    async def _consumer(self) -> JetStreamContext.PullSubscription:
        """The shared pull consumer, bound on first use (with the dead-letter advisories)."""
        if self._pull is None:
            self._pull = await self.js.pull_subscribe_bind(CONSUMER, stream=self.stream)
        if self._advisories is None:
            self._advisories = await self._watch_max_deliveries(
                self.stream, CONSUMER, self._on_max_deliveries
            )
        return self._pull

    async def _watch_max_deliveries(
        self, stream: str, consumer: str, callback: Callable[[Msg], Awaitable[None]]
    ) -> Subscription:
        advisory = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{consumer}"
        # A queue group: one bus of the deployment moves each dead letter.
        return await self.client.subscribe(
            advisory, queue=f"{self.prefix}-dead-letters", cb=callback
        )

    async def _on_max_deliveries(self, msg: Msg) -> None:
        """Move a dispatch that ran out of deliveries to the dead-letter stream."""
        found = await self._exhausted(msg, self.stream)
        if found is None:
            return
        stored, sequence, deliveries = found
        run_id = (stored.data or b"").decode(errors="replace")
        headers = {
            "Nats-Msg-Id": f"{self.stream}:{sequence}",
            "Corral-Run-Id": run_id,
            "Corral-Deliveries": str(deliveries),
        }
        try:
            await self.js.publish(self.dead_subject, stored.data or b"", headers=headers)
            await self.js.delete_msg(self.stream, sequence)
        except NATS_FAILURES as exc:
            log.warning("bus: dead letter of run %s not moved (%s)", run_id, _describe(exc))
            return
        log.warning(
            "bus: run %s was dispatched %d times without finishing; its dispatch went to %s "
            "(the run stays in the store: the sweep and its max_attempts decide)",
            run_id,
            deliveries,
            self.dead_subject,
        )

    async def _exhausted(
        self, advisory_msg: Msg, stream: str
    ) -> tuple[api.RawStreamMsg, int, int] | None:
        """The stored message a max-deliveries advisory is about, its sequence and deliveries
        (``None``: unreadable, or settled or moved already)."""
        try:
            advisory = json.loads(advisory_msg.data)
            sequence, deliveries = int(advisory["stream_seq"]), int(advisory["deliveries"])
        except (ValueError, KeyError, TypeError):
            log.warning("bus: unreadable max-deliveries advisory: %r", advisory_msg.data[:200])
            return None
        try:
            stored = await self.js.get_msg(stream, sequence)
        except nats.js.errors.NotFoundError:
            return None  # settled or moved already
        except NATS_FAILURES as exc:
            log.warning("bus: dead letter %s:%d not moved (%s)", stream, sequence, _describe(exc))
            return None
        return stored, sequence, deliveries

    # ----------------------------------------------------------------- agent messages

    def inbox_subject(self, namespace: str, agent: str) -> str:
        """The subject of ``agent``'s inbox in ``namespace`` on this bus."""
        return inbox_subject(self.prefix, namespace, agent)

    async def send_agent_message(self, namespace: str, agent: str, message_id: str) -> None:
        if self._closed:
            return
        if not self.client.is_connected:
            log.info("bus: NATS unreachable, agent message %s left to the sweep", message_id)
            return
        payload = json.dumps({"id": message_id, "namespace": namespace, "agent": agent})
        try:
            await self.js.publish(
                self.inbox_subject(namespace, agent),
                payload.encode(errors="surrogatepass"),
                headers={"Nats-Msg-Id": message_msg_id(message_id)},
            )
        except NATS_FAILURES as exc:
            log.warning(
                "bus: agent message %s not confirmed (%s); if it was lost, the sweep finds it",
                message_id,
                _describe(exc),
            )
            if not isinstance(exc, TimeoutError):
                await self._repair()

    async def take_agent_messages(self, limit: int, seconds: float) -> list[MessageDelivery]:
        if self._closed:
            await anyio.sleep(seconds)
            return []
        async with self._fetching_messages:
            if self._reconnected:
                await self._repair()
            try:
                pull = await self._inbox_consumer()
                messages = await self._fetch(pull, limit, seconds)
            except TimeoutError:
                return []
            except NATS_FAILURES as exc:
                log.info("bus: fetching agent messages failed (%s)", _describe(exc))
                await self._repair()
                await anyio.sleep(min(seconds, 1.0))
                return []
        deliveries: list[MessageDelivery] = []
        for msg in messages:
            delivery = await self._message_delivery(msg)
            if delivery is not None:
                deliveries.append(delivery)
        return deliveries

    async def _message_delivery(self, msg: Msg) -> MessageDelivery | None:
        """The delivery of an inbox message, or ``None`` (terminated: never delivered again)
        when it is not one of ours or came through another inbox than its payload names."""
        try:
            body = json.loads(msg.data)
            message_id, namespace, agent = body["id"], body["namespace"], body["agent"]
            if not all(isinstance(v, str) for v in (message_id, namespace, agent)):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            message_id = namespace = agent = ""
        delivery = _NatsMessageDelivery(msg, message_id, namespace, agent, self.max_deliver)
        if message_id and msg.subject == self.inbox_subject(namespace, agent):
            return delivery
        log.warning("bus: a foreign message on %s terminated", msg.subject[:200])
        await delivery.term()
        return None

    async def _inbox_consumer(self) -> JetStreamContext.PullSubscription:
        """The shared inbox consumer, bound on first use (with its dead-letter advisories)."""
        if self._inbox_pull is None:
            self._inbox_pull = await self.js.pull_subscribe_bind(
                INBOX_CONSUMER, stream=self.messages_stream
            )
        if self._inbox_advisories is None:
            self._inbox_advisories = await self._watch_max_deliveries(
                self.messages_stream, INBOX_CONSUMER, self._on_message_max_deliveries
            )
        return self._inbox_pull

    async def _on_message_max_deliveries(self, msg: Msg) -> None:
        """Move an agent message that ran out of deliveries to the dead letters."""
        found = await self._exhausted(msg, self.messages_stream)
        if found is None:
            return
        stored, sequence, deliveries = found
        try:
            body = json.loads(stored.data or b"")
            message_id = str(body["id"])
            inbox = f"{body['namespace']}/{body['agent']}"
        except (ValueError, KeyError, TypeError):
            message_id, inbox = "", ""
        headers = {
            "Nats-Msg-Id": f"{self.messages_stream}:{sequence}",
            "Corral-Message-Id": message_msg_id(message_id),
            "Corral-Deliveries": str(deliveries),
        }
        try:
            await self.js.publish(self.dead_messages_subject, stored.data or b"", headers=headers)
            await self.js.delete_msg(self.messages_stream, sequence)
        except NATS_FAILURES as exc:
            log.warning(
                "bus: dead letter of agent message %s not moved (%s)", message_id, _describe(exc)
            )
            return
        log.warning(
            "bus: agent message %s to %s was delivered %d times without being settled; it "
            "went to %s (the message stays in the store, where it is settled)",
            message_id,
            inbox,
            deliveries,
            self.dead_messages_subject,
        )

    # ----------------------------------------------------------------- events

    def _events_subject(self, run_id: str) -> str:
        return f"{self.prefix}.events.{subject_token(run_id)}"

    async def announce_events(self, run_id: str, last_seq: int) -> None:
        if self._closed:
            return
        watchers = self._watchers.get(run_id)
        if watchers is not None:  # this process's own followers: no echo from the server
            for watch in watchers.watches:
                watch.fire()
        await self._publish(self._events_subject(run_id), str(last_seq).encode())

    @asynccontextmanager
    async def watch_events(self, run_id: str) -> AsyncIterator[EventWatch]:
        watch = SignalWatch()
        watchers = self._watchers.get(run_id)
        if watchers is None:
            watchers = self._watchers[run_id] = _RunWatchers()
            watchers.watches.add(watch)
            try:
                watchers.subscription = await self._subscribe(
                    self._events_subject(run_id), _firing(watchers)
                )
            finally:
                watchers.ready.set()
        else:
            watchers.watches.add(watch)
            await watchers.ready.wait()  # registered with the server before the first read
        try:
            yield watch
        finally:
            watchers.watches.discard(watch)
            if not watchers.watches and self._watchers.get(run_id) is watchers:
                del self._watchers[run_id]
                await _unsubscribe(watchers.subscription)

    # ----------------------------------------------------------------- core NATS

    async def _publish(self, subject: str, payload: bytes) -> None:
        """A core publish: buffered by the client while it reconnects, never raising."""
        try:
            await self.client.publish(subject, payload)
        except NATS_FAILURES as exc:
            log.info("bus: publish to %s dropped (%s)", subject, _describe(exc))

    async def _subscribe(
        self, subject: str, callback: Callable[[Msg], Awaitable[None]]
    ) -> Subscription | None:
        """Subscribe and wait until the server has the subscription (when it is reachable).

        ``None`` when the client is closed; a subscription made while the
        connection is down is sent again by the client when it reconnects.
        """
        try:
            subscription = await self.client.subscribe(subject, cb=callback)
        except NATS_FAILURES as exc:
            log.info("bus: cannot subscribe to %s (%s)", subject, _describe(exc))
            return None
        if self.client.is_connected:
            try:
                # nats-py writes a flush's PING straight to the socket but queues the SUB
                # for its flusher task, so the first PONG may come back before the server
                # has the SUB; the SUB is written by the time it does, and a second round
                # trip confirms it.
                await self.client.flush(timeout=1)
                await self.client.flush(timeout=1)
            except NATS_FAILURES as exc:
                log.info("bus: subscription to %s not confirmed (%s)", subject, _describe(exc))
        return subscription


def _firing(watchers: _RunWatchers) -> Callable[[Msg], Awaitable[None]]:
    async def fire(msg: Msg) -> None:
        for watch in list(watchers.watches):
            watch.fire()

    return fire


async def _unsubscribe(subscription: Subscription | None) -> None:
    if subscription is None:
        return
    try:
        await subscription.unsubscribe()
    except NATS_FAILURES as exc:
        log.debug("bus: unsubscribe failed (%s)", _describe(exc))


async def _close_quietly(client: Client) -> None:
    try:
        await client.close()
    except NATS_FAILURES as exc:
        log.debug("bus: close failed (%s)", _describe(exc))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def _on_error(exc: Exception) -> None:
    # nats-py reports each failed (re)connect attempt here; one line, no traceback.
    log.info("bus: NATS client error: %s", _describe(exc))


def _logged(level: int, message: str) -> Callback:
    async def callback() -> None:
        log.log(level, message)

    return callback


__all__ = ["NATS_FAILURES", "NatsBus", "inbox_subject", "inbox_token", "subject_token"]
