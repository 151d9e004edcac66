"""``python: {isolation: process}``: a tool's function run in a worker subprocess.

In-process, a synchronous function that ignores its timeout keeps its thread until it
returns (a Python thread cannot be stopped). Here each call takes a subprocess of a
small per-process pool (started with ``forkserver``: no copy of this process's threads
or state) and the call's result comes back over a pipe. A timeout or a cancellation
kills that one subprocess (``SIGKILL``) and only it: the other calls' subprocesses go
on, and the pool starts a new one for the next call. No thread is used while waiting
(the pipe is awaited on the event loop), so nothing is left behind.

The function is imported in the subprocess (``function`` and ``path`` as the Tool
gives them; cached there); its arguments are pickled there and its result comes back
as JSON-able data (``pydantic_core.to_jsonable_python``). An exception becomes the
same :class:`~corral.core.errors.ToolError` as in-process: ``execution_failed`` with
``Type: message`` (retryable for ``ConnectionError``/``TimeoutError``), a ``ToolError``
raised by the function keeps its code. A subprocess that dies mid-call is
``execution_failed`` naming its exit code.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess
from typing import Any

import anyio
import anyio.to_thread

from corral.core.errors import ToolError, ToolErrorCode

__all__ = ["ProcessPool", "call_in_process", "default_pool"]

#: idle subprocesses kept for the next calls (more are started when calls overlap)
MAX_IDLE = 4


def _serve(conn: Connection) -> None:
    """The subprocess: answer calls until the pipe closes."""
    import pydantic_core

    from corral.tools.python_import import load_function

    loaded: dict[tuple[str, str | None], Any] = {}
    while True:
        try:
            function, path, name, kwargs, is_async = conn.recv()
        except (EOFError, OSError):
            return
        try:
            key = (function, path)
            if key not in loaded:
                loaded[key] = load_function(function, path, name=name)
            fn = loaded[key]
            result = asyncio.run(fn(**kwargs)) if is_async else fn(**kwargs)
            answer: tuple[Any, ...] = (
                "ok",
                pydantic_core.to_jsonable_python(result, fallback=str),
            )
        except ToolError as exc:
            info = exc.info
            answer = ("tool_error", info.code, info.reason, info.retryable, info.details)
        except Exception as exc:  # noqa: BLE001 - the function's failure is the tool's error
            retryable = isinstance(exc, ConnectionError | TimeoutError)
            answer = ("failed", f"{type(exc).__name__}: {exc}", retryable)
        conn.send(answer)


@dataclass(eq=False)  # one per subprocess, kept in a set by identity
class _Worker:
    process: BaseProcess
    conn: Connection

    def kill(self) -> None:
        """End the subprocess now, whatever it is doing, and reap it."""
        self.conn.close()
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)


class ProcessPool:
    """Subprocesses that run tool functions, one call at a time each."""

    def __init__(self, max_idle: int = MAX_IDLE, *, spawn: bool = False) -> None:
        self.max_idle = max_idle
        self._context: ForkServerContext | SpawnContext = (
            multiprocessing.get_context("spawn")
            if spawn
            else multiprocessing.get_context("forkserver")
        )
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        #: subprocesses alive now (idle or busy), for tests and shutdown
        self.alive: set[_Worker] = set()

    def _start(self) -> _Worker:
        parent, child = self._context.Pipe()
        process = self._context.Process(target=_serve, args=(child,), daemon=True)
        process.start()
        child.close()
        return _Worker(process, parent)

    async def _acquire(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.process.is_alive():
                    return worker
                worker.kill()
                self.alive.discard(worker)
        worker = await anyio.to_thread.run_sync(self._start)  # blocking: a fork and a pipe
        self.alive.add(worker)
        return worker

    def _release(self, worker: _Worker) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(worker)
                return
        self._discard(worker)

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        self.alive.discard(worker)

    async def call(
        self, function: str, path: str | None, name: str, kwargs: dict[str, Any], is_async: bool
    ) -> Any:
        """The function's JSON-able result; its failure as a ``ToolError``."""
        worker = await self._acquire()
        done = False
        try:
            try:
                worker.conn.send((function, path, name, kwargs, is_async))
            except (TypeError, AttributeError, ValueError) as exc:  # pickling the arguments
                done = True  # the subprocess never got a call: it serves on
                self._release(worker)
                raise ToolError(
                    ToolErrorCode.INVALID_INPUT,
                    f"the arguments cannot be sent to the tool's process: {exc}",
                ) from exc
            await anyio.wait_readable(worker.conn.fileno())  # no thread while the call runs
            try:
                # (a thread for reading a large answer; it arrives whole, so this ends)
                answer = await anyio.to_thread.run_sync(worker.conn.recv)
            except (EOFError, OSError):
                code = worker.process.exitcode
                worker.process.join(5)
                code = worker.process.exitcode if code is None else code
                raise ToolError(
                    ToolErrorCode.EXECUTION_FAILED,
                    f"the tool's process ended during the call (exit code {code})",
                ) from None
            done = True
            self._release(worker)
        finally:
            if not done:  # timed out, cancelled, died: this subprocess and only it goes
                self._discard(worker)
        return _outcome(answer)

    def close(self) -> None:
        """Kill every subprocess (idle or busy)."""
        with self._lock:
            self._idle.clear()
        for worker in list(self.alive):
            self._discard(worker)


def _outcome(answer: tuple[Any, ...]) -> Any:
    if answer[0] == "ok":
        return answer[1]
    if answer[0] == "tool_error":
        _, code, reason, retryable, details = answer
        raise ToolError(code, reason, retryable=retryable, details=details)
    _, reason, retryable = answer
    raise ToolError(ToolErrorCode.EXECUTION_FAILED, reason, retryable=retryable)


@functools.cache
def default_pool() -> ProcessPool:
    """This process's pool (made on first use)."""
    return ProcessPool()


async def call_in_process(
    function: str, path: str | None, name: str, kwargs: dict[str, Any], is_async: bool
) -> Any:
    """Run one call in a subprocess of :func:`default_pool`."""
    return await default_pool().call(function, path, name, kwargs, is_async)
