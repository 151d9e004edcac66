"""The ``wasm`` tool kind: a WebAssembly module run with wasmtime, the ``exec`` contract.

A call gets the arguments as JSON on stdin and answers on stdout (parsed as
``exec`` parses it: JSON when it is JSON, else text); a non-zero exit is
``execution_failed`` with the tail of stderr. The module sees nothing of the host
but stdin, stdout, stderr, the clocks and randomness (WASI preview 1 with no
preopened directory and no socket); ``wasi.enabled`` grants the declared ``env``
and, per ``wasi.preopen_workspace``, the agent workspace at ``/workspace``
read-only or read-write. There is no network in WASI preview 1 without a socket.

Limits, each a structured tool error the model sees:

- ``fuel`` (instructions, roughly): out of fuel is ``resource_exhausted`` (limit ``fuel``);
- time: each call has an *engine of its own* with epoch interruption, so its epoch
  is its own. A task on the event loop increments it when the tool's
  ``timeout_seconds`` pass (``timeout``) or when the call is cancelled, and the
  module traps at its next loop header or function entry;
- ``max_memory_mb`` through the store's limiter: a ``memory.grow`` past it fails
  (returns -1, as WebAssembly says); a module that then traps or exits non-zero
  with its memory at the limit is ``resource_exhausted`` (limit ``memory``), and
  so is one that needs more memory than the limit to start;
- stdout past :data:`~corral.tools.exec.MAX_STDOUT_BYTES` stops the module
  (``output_too_large``); only the tail of stderr is kept.

The module's memory is the server's: a Tool's ``max_memory_mb`` is bounded by the
server's cap (``CORRAL_WASM_MAX_MEMORY_MB``) and its NamespacePolicy's
(``wasm.max_memory_mb``) when the agent is built, and each call reserves its
``max_memory_mb`` from the process's :class:`MemoryBudget`
(``CORRAL_WASM_MEMORY_BUDGET_MB``) before it starts, so the calls running at once
never hold more than the budget. A call that does not fit waits, first come first
served, for at most half its ``timeout_seconds``, then fails ``resource_exhausted``
(limit ``memory_budget``, retryable).

Any other trap is ``execution_failed`` with ``details.trap`` naming it
(``unreachable``, ``memory_out_of_bounds``, ...).

Compiling is the slow part (milliseconds to seconds), so compiled code is cached
per process by the module's SHA-256 (:func:`compiled`, the :data:`CACHED_MODULES`
most recently used) and each call only
deserializes it into its engine (tens of microseconds). wasmtime blocks, so the
module runs in a worker thread; the event loop only waits for it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import wasmtime

from corral.core.errors import ConfigurationError, ToolError, ToolErrorCode
from corral.resources.kinds import ToolSpecModel, WasmToolSpec
from corral.resources.wasm_module import module_problem, wasm_problem
from corral.tools.base import Tool, ToolContext
from corral.tools.exec import (
    MAX_STDERR_BYTES,
    MAX_STDOUT_BYTES,
    OutputCapture,
    exit_description,
    parse_output,
)
from corral.tools.naming import declared_spec
from corral.tools.wasm_budget import MemoryBudget, memory_budget

__all__ = ["CACHED_MODULES", "WASI_MODULE", "WasmTool", "compiled", "create"]

#: the only import module a tool's module may use
WASI_MODULE = "wasi_snapshot_preview1"
#: where a preopened workspace appears inside the module
GUEST_WORKSPACE = "/workspace"
_PAGE = 65536
_REASON_STDERR_CHARS = 2000

#: compiled modules kept per process, the least recently used dropped first
CACHED_MODULES = 64

_cache: OrderedDict[str, bytes] = OrderedDict()
_cache_lock = threading.Lock()


def _engine() -> wasmtime.Engine:
    config = wasmtime.Config()
    config.consume_fuel = True
    config.epoch_interruption = True
    return wasmtime.Engine(config)


def compiled(wasm: bytes) -> tuple[str, bytes]:
    """The SHA-256 of ``wasm`` and its compiled code, compiled once per process.

    Raises ``wasmtime.WasmtimeError`` when ``wasm`` is no valid module.
    """
    digest = hashlib.sha256(wasm).hexdigest()
    with _cache_lock:
        code = _cache.get(digest)
        if code is not None:
            _cache.move_to_end(digest)
    if code is None:
        code = bytes(wasmtime.Module(_engine(), wasm).serialize())
        with _cache_lock:
            _cache[digest] = code
            while len(_cache) > CACHED_MODULES:
                _cache.popitem(last=False)
    return digest, code


@dataclass
class _Outcome:
    """How one run of the module ended (built in the worker thread, never raised there)."""

    exit_code: int = 0
    trap: wasmtime.Trap | None = None
    error: str | None = None  # instantiation failed
    memory_bytes: int = 0
    stdout: OutputCapture = field(
        default_factory=lambda: OutputCapture(MAX_STDOUT_BYTES, keep_tail=False)
    )
    stderr: OutputCapture = field(
        default_factory=lambda: OutputCapture(MAX_STDERR_BYTES, keep_tail=True)
    )


def _writer(capture: OutputCapture) -> Callable[[bytes], int]:
    """A WASI output callback keeping what ``capture`` keeps.

    Past stdout's cap the rest is dropped, and the module runs on until it ends or
    hits its fuel or time: interrupting it from inside this callback (an epoch
    increment) leaves wasmtime's I/O runtime in a state that aborts the process
    when it exits (wasmtime 50).
    """

    def write(data: bytes) -> int:
        if not (capture.overflow and not capture.keep_tail):
            capture.add(data)
        return len(data)

    return write


def _set_stdin(wasi: wasmtime.WasiConfig, payload: bytes) -> None:
    """Make ``payload`` the module's stdin (wasmtime reads stdin only from a named file).

    On Linux an anonymous memory file, reopened through ``/proc/self/fd`` (wasmtime
    opens it when told, so it is closed here at once): nothing touches a disk and
    nothing is left behind. Elsewhere a temporary file, deleted at once.
    """
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create("corral-wasm-stdin", os.MFD_CLOEXEC)
        try:
            os.write(fd, payload)
            wasi.stdin_file = f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.NamedTemporaryFile(prefix="corral-wasm-stdin-") as stdin:
        stdin.write(payload)
        stdin.flush()
        wasi.stdin_file = stdin.name


def _trap_name(trap: wasmtime.Trap) -> str:
    code = trap.trap_code
    return code.name.lower() if code is not None else "trap"


class WasmTool(Tool):
    """A Tool that runs a WebAssembly module per call; see the module docstring."""

    def __init__(
        self,
        name: str,
        spec: ToolSpecModel,
        code: bytes,
        digest: str,
        budget: MemoryBudget | None = None,
    ) -> None:
        assert spec.wasm is not None
        self.ref = name
        self.spec = declared_spec(name, spec)
        self.idempotent = spec.idempotent
        self.digest = digest
        self._wasm: WasmToolSpec = spec.wasm
        self._code = code
        self._timeout = spec.timeout_seconds
        self._memory_limit = spec.wasm.max_memory_mb * 1024 * 1024
        self._budget = budget if budget is not None else memory_budget()

    def _run(
        self, engine: wasmtime.Engine, payload: bytes, workspace: Path, extra: dict[str, str]
    ) -> _Outcome:
        """One run of the module, in a worker thread."""
        outcome = _Outcome()
        module = wasmtime.Module.deserialize(engine, self._code)
        store = wasmtime.Store(engine)
        store.set_fuel(self._wasm.fuel)
        store.set_epoch_deadline(1)  # the first increment of this call's engine stops it
        store.set_limits(memory_size=self._memory_limit)
        wasi = wasmtime.WasiConfig()
        wasi.argv = [self.ref]
        wasi.stdout_custom = _writer(outcome.stdout)
        wasi.stderr_custom = _writer(outcome.stderr)
        grants = self._wasm.wasi
        env = dict(grants.env) if grants.enabled else {}
        env.update(extra)  # Corral's own per-call variables, as exec tools get them
        wasi.env = [[key, value] for key, value in env.items()]
        if grants.enabled and grants.preopen_workspace != "none":
            mutable = grants.preopen_workspace == "rw"
            wasi.preopen_dir(str(workspace), GUEST_WORKSPACE, mutable)
        _set_stdin(wasi, payload)
        store.set_wasi(wasi)
        linker = wasmtime.Linker(engine)
        linker.define_wasi()
        try:
            instance = linker.instantiate(store, module)
        except wasmtime.Trap as trap:  # a start function trapped
            outcome.trap = trap
            return outcome
        except wasmtime.WasmtimeError as exc:
            outcome.error = str(exc)
            return outcome
        entry = instance.exports(store)[self._wasm.entrypoint]
        assert isinstance(entry, wasmtime.Func)  # checked when the tool was built
        try:
            entry(store)
        except wasmtime.ExitTrap as exit_trap:
            outcome.exit_code = exit_trap.code
        except wasmtime.Trap as trap:
            outcome.trap = trap
        for export in instance.exports(store).by_index:
            if isinstance(export, wasmtime.Memory):
                outcome.memory_bytes = max(outcome.memory_bytes, export.data_len(store))
        return outcome

    async def _watch(self, engine: wasmtime.Engine, timed_out: list[bool]) -> None:
        """Stop the module when the call's time is up or the call is cancelled."""
        try:
            await anyio.sleep(self._timeout)
            timed_out.append(True)
        finally:
            engine.increment_epoch()  # thread-safe: an atomic the module polls

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        workspace = ctx.workspace.resolve()
        if self._wasm.wasi.preopen_workspace != "none":
            await anyio.Path(workspace).mkdir(parents=True, exist_ok=True)
        payload = json.dumps(arguments).encode("utf-8")
        extra = {
            "CORRAL_IDEMPOTENCY_KEY": ctx.idempotency_key,
            "CORRAL_RUN_ID": ctx.run_id,
            "CORRAL_TOOL_CALL_ID": ctx.call_id,
        }
        reservation = self._budget.reserve(
            self._wasm.max_memory_mb, wait_seconds=self._timeout / 2, owner=self.ref
        )
        async with reservation:
            return await self._call(payload, workspace, extra)

    async def _call(self, payload: bytes, workspace: Path, extra: dict[str, str]) -> Any:
        engine = _engine()  # its own epoch: stopping this call stops no other
        timed_out: list[bool] = []
        outcome: _Outcome | None = None
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch, engine, timed_out)
            # not abandoned on cancellation: the watcher's increment stops the module,
            # and the thread is waited for, so no module keeps running after its call
            try:
                outcome = await anyio.to_thread.run_sync(
                    self._run, engine, payload, workspace, extra
                )
            except Exception as exc:  # noqa: BLE001 - a bug: raised below, not in a group
                failure = exc
            tg.cancel_scope.cancel()
        # a cancelled call's module was stopped above; the cancellation goes on from here
        await anyio.lowlevel.checkpoint_if_cancelled()
        if outcome is None:
            assert failure is not None
            raise failure
        return self._result(outcome, bool(timed_out))

    def _result(self, outcome: _Outcome, timed_out: bool) -> Any:
        stderr = bytes(outcome.stderr.data).decode("utf-8", errors="replace").strip()
        tail = stderr[-_REASON_STDERR_CHARS:]
        at_memory_limit = outcome.memory_bytes + _PAGE > self._memory_limit
        if outcome.error is not None:
            if "memory" in outcome.error and "limit" in outcome.error:
                raise self._exhausted(
                    "memory", f"needs more than {self._wasm.max_memory_mb} MiB to start"
                )
            raise ToolError(
                ToolErrorCode.EXECUTION_FAILED, f"{self.ref} could not start: {outcome.error}"
            )
        if outcome.stdout.overflow:
            raise ToolError(
                ToolErrorCode.OUTPUT_TOO_LARGE,
                f"{self.ref} wrote more than {MAX_STDOUT_BYTES} bytes to stdout (the rest was dropped)",
            )
        if outcome.trap is not None:
            name = _trap_name(outcome.trap)
            if name == "out_of_fuel":
                raise self._exhausted("fuel", f"ran out of fuel ({self._wasm.fuel})")
            if name == "interrupt" and timed_out:
                raise ToolError(
                    ToolErrorCode.TIMEOUT,
                    f"{self.ref} did not finish within {self._timeout:g} s",
                    retryable=True,
                )
            if at_memory_limit:
                raise self._exhausted("memory", f"trapped ({name}) with its memory at the limit")
            reason = f"{self.ref} trapped: {name}"
            raise ToolError(
                ToolErrorCode.EXECUTION_FAILED,
                f"{reason}: {tail}" if tail else reason,
                details={"trap": name, "stderr": tail},
            )
        if outcome.exit_code != 0:
            if at_memory_limit:
                raise self._exhausted(
                    "memory", f"{exit_description(outcome.exit_code)} with its memory at the limit"
                )
            reason = f"{self.ref} {exit_description(outcome.exit_code)}"
            raise ToolError(
                ToolErrorCode.EXECUTION_FAILED,
                f"{reason}: {tail}" if tail else reason,
                details={"exit_code": outcome.exit_code, "stderr": tail},
            )
        return parse_output(bytes(outcome.stdout.data))

    def _exhausted(self, limit: str, what: str) -> ToolError:
        value = self._wasm.fuel if limit == "fuel" else f"{self._wasm.max_memory_mb} MiB"
        return ToolError(
            ToolErrorCode.RESOURCE_EXHAUSTED,
            f"{self.ref} hit its {limit} limit ({value}): {what}",
            details={"limit": limit},
        )


def _check_interface(owner: str, code: bytes, entrypoint: str) -> None:
    """Refuse a module that imports more than WASI or lacks its entry point."""
    module = wasmtime.Module.deserialize(_engine(), code)
    foreign = sorted({f"{i.module}.{i.name}" for i in module.imports if i.module != WASI_MODULE})
    if foreign:
        raise ConfigurationError(
            f"{owner}: the module imports {', '.join(foreign)}; only {WASI_MODULE} is provided"
        )
    for export in module.exports:
        if export.name == entrypoint:
            kind = export.type
            if not isinstance(kind, wasmtime.FuncType) or kind.params or kind.results:
                raise ConfigurationError(
                    f"{owner}: the export {entrypoint!r} is not a function without parameters "
                    "and results"
                )
            return
    raise ConfigurationError(f"{owner}: the module exports no function {entrypoint!r}")


def create(
    name: str,
    spec: ToolSpecModel,
    secrets: Mapping[str, str],
    *,
    budget: MemoryBudget | None = None,
    max_memory_mb: int | None = None,
) -> Tool:
    """Build a ``wasm`` Tool: the module is checked and compiled (or found compiled) now.

    ``budget`` is the process's (default: :func:`memory_budget`); a Tool asking more
    memory than ``max_memory_mb`` (the server's and the namespace's cap) is refused.
    """
    del secrets  # a module's environment is literal (wasi.env)
    if spec.wasm is None:
        raise ConfigurationError(f"Tool {name!r}: type 'wasm' needs a 'wasm' block")
    owner = f"Tool {name!r}"
    if max_memory_mb is not None and spec.wasm.max_memory_mb > max_memory_mb:
        raise ConfigurationError(
            f"{owner}: max_memory_mb {spec.wasm.max_memory_mb} is over the cap of "
            f"{max_memory_mb} MiB (CORRAL_WASM_MAX_MEMORY_MB, or the NamespacePolicy's "
            "wasm.max_memory_mb)"
        )
    path = spec.wasm.module
    problem = module_problem(path, validate=False)
    if problem is None:
        wasm = Path(path).read_bytes()
        problem = wasm_problem(wasm) if not wasm.startswith(b"\0asm") else None
    if problem is not None:
        raise ConfigurationError(f"{owner}: {problem}")
    try:
        digest, code = compiled(wasm)  # the cache answers a module it compiled before
    except wasmtime.WasmtimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid"
        raise ConfigurationError(f"{owner}: not a valid WebAssembly module: {first}") from exc
    _check_interface(owner, code, spec.wasm.entrypoint)
    return WasmTool(name, spec, code, digest, budget)
