"""The Bus contract: announcements that let workers and followers stop polling.

Two kinds of signal, both hints about state already committed to the store:

- *runnable*: a run may be claimed now (submitted, released, approved). Workers
  wait on :meth:`Bus.wait_runnable` between claims instead of sleeping a full
  poll interval. A bus that *dispatches* (:attr:`Bus.dispatches`, NATS
  JetStream) also hands each announced run to one worker as a
  :class:`Delivery` (:meth:`Bus.take_runnable`): the worker claims that run by
  id through the store, keeps the delivery alive while the run executes and
  acknowledges it when the run no longer needs a worker. A delivery whose
  worker goes silent is delivered again elsewhere.
- *events stored*: a run has new events up to a sequence number. Followers (SSE
  streams, ``corral logs --follow``) hold an :class:`EventWatch` and read the
  store when it fires.

Every announcement is sent after the commit it announces, so a woken reader
always finds what it was told about. Every wait has a timeout, and callers
treat a timeout like a signal (they look at the store): that is what keeps a
lost message harmless. A delivery is no different: it grants nothing, the
claim does (the lease and the fencing token decide who executes a run), so a
lost delivery leaves the run to the workers' store sweep, and a duplicated one
finds the run already claimed.

Once open, a bus never raises for a failed announcement or a lost connection:
it logs, and the store carries on as the source of truth.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Self

import anyio


class EventWatch(ABC):
    """A registration for one run's events; created *before* the first read of the store.

    Registering first closes the gap between reading the store and starting to
    wait: an announcement that arrives in between makes the next :meth:`wait`
    return at once.
    """

    @abstractmethod
    async def wait(self, seconds: float) -> bool:
        """Wait until events were announced since the last wait, or ``seconds`` pass.

        Returns ``True`` when an announcement came, ``False`` on timeout. Either
        way the caller reads the store next.
        """


class Delivery(ABC):
    """One dispatch of a runnable run to this worker, from a bus that dispatches.

    The worker settles every delivery exactly once with :meth:`ack`, :meth:`nak`
    or :meth:`term`; until then the bus delivers it to nobody else, for
    :attr:`Bus.ack_wait_seconds` after the delivery or the last
    :meth:`in_progress`, after which it is delivered again (the worker is
    presumed dead). None of these methods raises: a settlement lost with the
    connection only means the run is delivered again, and the store decides
    what that delivery may do.
    """

    #: the run the delivery is about
    run_id: str
    #: 1 for the first delivery, more when it was delivered before and not settled
    attempt: int
    #: whether this is the last delivery: unsettled (or nak'ed) it goes to the dead
    #: letters, so a worker that only wants it later acks it and leaves it to the sweep
    last: bool

    @abstractmethod
    async def ack(self) -> None:
        """Done: the run ended, paused, was released (and announced anew), or is another's."""

    @abstractmethod
    async def nak(self, delay: float = 0.0) -> None:
        """Not now: deliver it again after ``delay`` seconds (to any worker)."""

    @abstractmethod
    async def in_progress(self) -> None:
        """Still working on it: do not deliver it again for another ack wait."""

    @abstractmethod
    async def term(self) -> None:
        """Never deliver it again (it cannot be understood); nothing was done with it."""


class MessageDelivery(ABC):
    """One delivery of an agent message (:class:`~corral.core.agent_messages.AgentMessage`)
    to the inbox consumer of this process, from a bus that delivers agent messages.

    It carries only where to look: the message itself is read from the store, which
    is the source of truth (a delivery grants nothing; the child run keyed by the
    message id decides whether the message's agent runs). Settled exactly once with
    :meth:`ack`, :meth:`nak` or :meth:`term`; none of them raises.
    """

    #: the stored message this delivery is about
    message_id: str
    #: the inbox it came through: the receiving agent and its namespace
    namespace: str
    agent: str
    #: 1 for the first delivery, more for a redelivery
    attempt: int
    #: whether this is the last delivery: unsettled or nak'ed it goes to the dead letters
    #: (NATS: the ``<prefix>.dead.messages`` subject; in process: ``LocalBus.dead_letters``),
    #: which only tell an operator; the stored message is untouched, so a consumer that gives
    #: up on a last delivery settles the message in the store itself (``dead_letter``)
    last: bool

    @abstractmethod
    async def ack(self) -> None:
        """Handled: the message's child run exists (or the message needs nothing more)."""

    @abstractmethod
    async def nak(self, delay: float = 0.0) -> None:
        """Not now (a retryable failure): deliver it again after ``delay`` seconds."""

    @abstractmethod
    async def in_progress(self) -> None:
        """Still handling it: do not deliver it again for another ack wait."""

    @abstractmethod
    async def term(self) -> None:
        """Never deliver it again (it cannot be understood or no longer exists)."""


class Bus(ABC):
    """Wake-ups between the processes (or tasks) of one Corral deployment."""

    #: whether :meth:`take_runnable` hands out deliveries (``False``: wake-ups only,
    #: and workers find runnable runs by sweeping the store)
    dispatches: bool = False
    #: how long a delivery stays with its worker without :meth:`Delivery.in_progress`
    ack_wait_seconds: float = 30.0

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:  # noqa: B027 - most buses hold nothing to release
        """Release connections; announcements after close are dropped."""

    @abstractmethod
    async def announce_runnable(self, run_ids: Sequence[str], *, mark: str | None = None) -> None:
        """Say that these runs may be claimed now (after the commit that made them so).

        ``mark`` names the change that made them runnable, unique per run and change:
        ``submitted``, ``released:<fencing token>``, the id of the approval whose
        decision queued the run. A bus may drop an announcement of the same run with
        the same mark as a duplicate (a retried publish, two replicas announcing one
        change); announcements without a mark are never dropped. A mark must never
        be reused for a later change: that announcement could be lost as a
        duplicate, and the run would wait for the store sweep.
        """

    @abstractmethod
    async def wait_runnable(self, seconds: float) -> None:
        """Return when a run was announced runnable since the last call, or after ``seconds``."""

    async def take_runnable(self, limit: int, seconds: float) -> list[Delivery]:
        """Up to ``limit`` deliveries of announced runs, waiting up to ``seconds`` for the first.

        Only a bus that :attr:`dispatches` returns deliveries; the others wait for
        a wake-up like :meth:`wait_runnable` and return none (look in the store).
        """
        await self.wait_runnable(seconds)
        return []

    @abstractmethod
    async def announce_events(self, run_id: str, last_seq: int) -> None:
        """Say that ``run_id`` has events stored up to ``last_seq`` (after their commit)."""

    @abstractmethod
    def watch_events(self, run_id: str) -> AbstractAsyncContextManager[EventWatch]:
        """Register for announcements of ``run_id``'s events for the life of the context."""

    #: whether :meth:`take_agent_messages` hands out message deliveries (``False``: the
    #: system run's coordinator delivers its stored messages itself)
    delivers_messages: bool = False

    async def send_agent_message(self, namespace: str, agent: str, message_id: str) -> None:
        """Publish a stored agent message to ``agent``'s inbox (after the commit that
        stored it). Never raises; a lost publish leaves the message to the store sweep.
        The default bus delivers no messages: this does nothing."""
        del namespace, agent, message_id

    async def take_agent_messages(self, limit: int, seconds: float) -> list[MessageDelivery]:
        """Up to ``limit`` deliveries of agent messages sent to any inbox, waiting up to
        ``seconds`` for the first. A bus that does not :attr:`delivers_messages` waits
        ``seconds`` and returns none."""
        del limit
        await anyio.sleep(seconds)
        return []
