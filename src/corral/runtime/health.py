"""A worker's health: which of its store and bus operations fail, backing off, and readiness.

The worker talks to the store (and the bus) in five recurring operations - its
claims, the sweep of a dispatched worker, lease renewals, the expiry of
approvals and the retention prune. None of them may end the worker: a store that
is locked, restarting or unreachable fails the operation, the failure is
logged (one line when it begins, then at most one every ``LOG_EVERY_SECONDS``
while it lasts, and one when it ends) and counted, and the operation is tried
again after a capped exponential backoff with full jitter.

:class:`WorkerHealth` keeps that state. A worker is *not ready* while its claims
(or its sweep) fail - it cannot take work - or after its loop crashed on an
unexpected error; :meth:`WorkerHealth.problem` then says why, for ``/readyz`` of
``corral serve`` and ``/healthz`` of ``corral worker --metrics-port``. The
reason names the operation and the error's code, not the driver's message
(which may name files, hosts and statements: it stays in the log), as the API's
``store_unavailable`` answers do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from corral.core.backoff import jittered_backoff
from corral.core.clock import SYSTEM_CLOCK, Clock
from corral.core.errors import BusError, CorralError, sole_error
from corral.store.base import StoreError

log = logging.getLogger(__name__)

Operation = Literal["claim", "sweep", "renew", "approvals", "deadlines", "retention"]
#: The fixed label set of the worker error counter (``corral_worker_errors_total``).
OPERATIONS: tuple[Operation, ...] = (
    "claim",
    "sweep",
    "renew",
    "approvals",
    "deadlines",
    "retention",
)
#: Failures a worker outlives: the store or the bus could not do it now.
TRANSIENT: tuple[type[CorralError], ...] = (StoreError, BusError)

#: Without work the worker cannot take: readiness fails while one of these fails.
_TAKING_WORK: tuple[Operation, ...] = ("claim", "sweep")
_WHAT: dict[Operation, str] = {
    "claim": "claim runs",
    "sweep": "sweep the store for runs",
    "renew": "renew leases",
    "approvals": "expire approvals",
    "deadlines": "queue system runs past their timeout",
    "retention": "prune old runs",
}
BACKOFF_BASE_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 30.0
LOG_EVERY_SECONDS = 30.0


@dataclass
class _Failing:
    since: float  # monotonic
    errors: int
    code: str
    retry_at: float  # monotonic
    logged_at: float  # monotonic


class WorkerHealth:
    """The failing operations of one worker, their backoff, and whether it is ready.

    ``on_error(operation)`` is called for every failure (the metrics count them).
    """

    def __init__(
        self,
        owner: str,
        *,
        on_error: Callable[[Operation], None] | None = None,
        base_seconds: float = BACKOFF_BASE_SECONDS,
        max_seconds: float = BACKOFF_MAX_SECONDS,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.owner = owner
        self.clock = clock  # its monotonic time times the backoff
        self.on_error = on_error
        self.base_seconds = base_seconds
        self.max_seconds = max_seconds
        self.failing: dict[Operation, _Failing] = {}
        self.crashed: str | None = None

    @contextmanager
    def attempt(self, operation: Operation) -> Iterator[None]:
        """Run the block as one try of ``operation``: a transient failure is recorded and
        swallowed (see :meth:`due` for when to try again); success clears the failure."""
        try:
            yield
        except TRANSIENT as exc:
            self.failed(operation, exc)
        else:
            self.succeeded(operation)

    def due(self, operation: Operation) -> bool:
        """Whether ``operation`` may be tried now (it is not failing, or its backoff passed)."""
        failing = self.failing.get(operation)
        return failing is None or self.clock.monotonic() >= failing.retry_at

    def wait_seconds(self, operation: Operation) -> float:
        """How long until ``operation`` is due (0 when it is)."""
        failing = self.failing.get(operation)
        return 0.0 if failing is None else max(0.0, failing.retry_at - self.clock.monotonic())

    def failed(self, operation: Operation, exc: CorralError) -> float:
        """Record a failure of ``operation``; returns the backoff before the next try."""
        now = self.clock.monotonic()
        failing = self.failing.get(operation)
        if failing is None:
            failing = self.failing[operation] = _Failing(now, 0, exc.code, now, now)
            log.warning("worker %s: cannot %s: %s", self.owner, _WHAT[operation], exc.message)
        elif now - failing.logged_at >= LOG_EVERY_SECONDS:
            failing.logged_at = now
            log.warning(
                "worker %s: still cannot %s (%d errors in %.0f s): %s",
                self.owner,
                _WHAT[operation],
                failing.errors + 1,
                now - failing.since,
                exc.message,
            )
        failing.errors += 1
        failing.code = exc.code
        delay = jittered_backoff(failing.errors, self.base_seconds, self.max_seconds)
        failing.retry_at = now + delay
        if self.on_error is not None:
            self.on_error(operation)
        return delay

    def succeeded(self, operation: Operation) -> None:
        """``operation`` worked: it is no longer failing. A claim that worked, from the
        sweep or from a delivery, clears the failures of both: either proves the worker
        can take work (a dispatched worker may not sweep again for a while)."""
        for cleared in _TAKING_WORK if operation in _TAKING_WORK else (operation,):
            failing = self.failing.pop(cleared, None)
            if failing is not None:
                log.warning(
                    "worker %s: can %s again (after %d errors in %.0f s)",
                    self.owner,
                    _WHAT[cleared],
                    failing.errors,
                    self.clock.monotonic() - failing.since,
                )

    def crash(self, exc: BaseException) -> None:
        """The worker's loop ended on an unexpected error: it takes no more work."""
        exc = sole_error(exc)  # a task group's group of one: the error itself says more
        self.crashed = type(exc).__name__
        log.error("worker %s stopped on an unexpected error", self.owner, exc_info=exc)

    def problem(self) -> str | None:
        """Why the worker cannot take work now, or ``None`` when it can."""
        if self.crashed is not None:
            return f"the worker stopped on an unexpected error ({self.crashed}); see the log"
        now = self.clock.monotonic()
        for operation in _TAKING_WORK:
            failing = self.failing.get(operation)
            if failing is not None:
                return (
                    f"the worker cannot {_WHAT[operation]}: {failing.code} "
                    f"({failing.errors} errors in {now - failing.since:.0f} s; see the log)"
                )
        return None
