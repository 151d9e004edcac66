"""The Store interface: resources, runs and run events, behind one abstract class.

Every backend (SQLite now, PostgreSQL next) implements :class:`Store`.
Backends convert their driver's exceptions at this boundary: callers only
ever see :class:`~corral.core.errors.CorralError` subclasses, namely
:class:`StoreError` when the database itself fails (locked, full, unreadable),
``NotFoundError``/``ConflictError`` when an operation contradicts stored state,
and ``ResourceError`` when an applied batch is invalid. A failed operation
leaves nothing behind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType
from typing import Self

from corral.core.errors import CorralError
from corral.core.events import Event
from corral.core.runs import RunRecord
from corral.resources.kinds import Resource
from corral.resources.loader import LoadedResource


class StoreError(CorralError):
    """The database could not complete an operation (locked, full, unreachable, corrupt)."""

    code = "store_error"


class ApplyAction(StrEnum):
    """What applying one resource did."""

    CREATED = "created"
    CONFIGURED = "configured"
    UNCHANGED = "unchanged"


@dataclass(frozen=True)
class ApplyOutcome:
    """The result of applying one resource."""

    namespace: str
    kind: str
    name: str
    action: ApplyAction
    generation: int


@dataclass(frozen=True)
class StoredResource:
    """A resource as stored: ``generation`` counts its configurations, starting at 1."""

    resource: Resource
    generation: int
    created_at: float
    updated_at: float


class Store(ABC):
    """Durable state of Corral. All methods are safe to call concurrently."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @abstractmethod
    async def close(self) -> None:
        """Release connections; the store is unusable afterwards."""

    # ----------------------------------------------------------------- resources

    @abstractmethod
    async def apply(self, batch: Sequence[Resource | LoadedResource]) -> list[ApplyOutcome]:
        """Create or update every resource of ``batch`` in one transaction.

        References are checked against the batch and the stored resources;
        any problem raises ``ResourceError`` and stores nothing. Secret values
        are encrypted before they are stored. Outcomes follow the batch order.
        """

    @abstractmethod
    async def get_resource(self, namespace: str, kind: str, name: str) -> StoredResource | None:
        """One resource, or ``None``."""

    @abstractmethod
    async def list_resources(self, namespace: str, kind: str | None = None) -> list[StoredResource]:
        """The resources of a namespace (of one kind when given), ordered by kind and name."""

    @abstractmethod
    async def delete_resource(self, namespace: str, kind: str, name: str) -> None:
        """Delete a resource.

        ``NotFoundError`` when it does not exist; ``ConflictError`` naming the
        referrers when another resource references it.
        """

    # ----------------------------------------------------------------- runs

    @abstractmethod
    async def create_run(self, record: RunRecord) -> None:
        """Store a new run; ``ConflictError`` when its id exists."""

    @abstractmethod
    async def save_run(self, record: RunRecord) -> None:
        """Overwrite a stored run with ``record``; ``NotFoundError`` when it does not exist."""

    @abstractmethod
    async def get_run(self, run_id: str) -> RunRecord | None:
        """One run, or ``None``."""

    @abstractmethod
    async def list_runs(
        self, namespace: str, agent: str | None = None, limit: int = 50
    ) -> list[RunRecord]:
        """The newest runs of a namespace (of one agent when given), newest first."""

    # ----------------------------------------------------------------- events

    @abstractmethod
    async def append_events(self, events: Sequence[Event]) -> None:
        """Store events atomically; ``ConflictError`` when a (run, seq) exists or the run does not."""

    @abstractmethod
    async def list_events(self, run_id: str, after_seq: int = 0) -> list[Event]:
        """The events of a run with ``seq > after_seq``, in order."""
