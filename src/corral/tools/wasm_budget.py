"""The memory budget of ``wasm`` calls: what the calls of one process running at once may
reserve together (``CORRAL_WASM_MEMORY_BUDGET_MB``); see :mod:`corral.tools.wasm`.

Kept apart from :mod:`corral.tools.wasm` so that what builds agents does not import
wasmtime before an agent has a wasm tool.
"""

from __future__ import annotations

import contextlib
import functools
from collections import deque
from collections.abc import AsyncIterator

import anyio

from corral.core.errors import ToolError, ToolErrorCode

__all__ = ["DEFAULT_BUDGET_MB", "MemoryBudget", "memory_budget"]

#: the budget of a process whose settings name none
DEFAULT_BUDGET_MB = 1024


class MemoryBudget:
    """The linear memory the ``wasm`` calls of this process running at once may reserve.

    Each call reserves its ``max_memory_mb`` for as long as it runs; one that does not
    fit waits behind the ones that came first (see the module docstring). Used from
    one event loop.
    """

    def __init__(self, total_mb: int) -> None:
        self.total_mb = total_mb
        #: MiB reserved by the calls running now
        self.reserved_mb = 0
        self._waiting: deque[tuple[int, anyio.Event]] = deque()

    @property
    def waiting_calls(self) -> int:
        """Calls waiting for room now."""
        return len(self._waiting)

    @contextlib.asynccontextmanager
    async def reserve(self, mb: int, *, wait_seconds: float, owner: str) -> AsyncIterator[None]:
        """Hold ``mb`` while the block runs; ``resource_exhausted`` when it never fits."""
        if mb > self.total_mb:
            raise _over_budget(owner, f"asks {mb} MiB, more than the whole budget")
        if not self._waiting and self.reserved_mb + mb <= self.total_mb:
            self.reserved_mb += mb
        else:
            await self._wait(mb, wait_seconds, owner)
        try:
            yield
        finally:
            self.reserved_mb -= mb
            self._grant()

    async def _wait(self, mb: int, wait_seconds: float, owner: str) -> None:
        turn = (mb, anyio.Event())
        self._waiting.append(turn)
        granted = False
        try:
            with anyio.move_on_after(wait_seconds):
                await turn[1].wait()
            granted = turn[1].is_set()
        finally:
            if not granted:
                if turn[1].is_set():  # granted as the wait was cancelled: give it back
                    self.reserved_mb -= mb
                else:
                    self._waiting.remove(turn)
                self._grant()  # the calls behind this one may fit now
        if not granted:
            raise _over_budget(
                owner,
                f"found no room for its {mb} MiB within {wait_seconds:g} s "
                f"({self.reserved_mb} MiB held by calls running now)",
                retryable=True,
            )

    def _grant(self) -> None:
        """Admit the waiting calls at the head of the line that fit now."""
        while self._waiting and self.reserved_mb + self._waiting[0][0] <= self.total_mb:
            mb, event = self._waiting.popleft()
            self.reserved_mb += mb
            event.set()


def _over_budget(owner: str, what: str, *, retryable: bool = False) -> ToolError:
    return ToolError(
        ToolErrorCode.RESOURCE_EXHAUSTED,
        f"{owner} {what} (the server's wasm memory budget: CORRAL_WASM_MEMORY_BUDGET_MB)",
        retryable=retryable,
        details={"limit": "memory_budget"},
    )


@functools.cache
def memory_budget(total_mb: int = DEFAULT_BUDGET_MB) -> MemoryBudget:
    """This process's budget of ``total_mb`` (one per value, shared by every tool)."""
    return MemoryBudget(total_mb)
