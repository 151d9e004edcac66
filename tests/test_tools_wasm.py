"""What only the ``wasm`` tool kind does: fuel, the memory limit, WASI grants, the checks
of a module at apply, hostile modules. The behaviour every kind shares (timeouts,
cancellation, output caps, failures) is in ``tests/conformance/test_tool_kinds.py``.

The modules are the entry points of ``tool_programs/wasm/probe.wat``, compiled here.
"""

from __future__ import annotations

import os
import time
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
import wasmtime
from pydantic import ValidationError

from corral.core.errors import ConfigurationError, ResourceError, ToolError
from corral.core.settings import Settings
from corral.resources.execution import NamespacePolicySpec
from corral.resources.kinds import ToolSpecModel, WasmToolSpec
from corral.resources.loader import load_path, load_text, unanchored_paths
from corral.resources.wasm_module import MAX_MODULE_BYTES
from corral.runtime.builder import AgentBuilder
from corral.store import Store
from corral.tools import wasm as wasm_tool
from corral.tools.base import Tool, ToolContext
from corral.tools.exec import MAX_STDOUT_BYTES
from corral.tools.wasm_budget import MemoryBudget

PROBE_WAT = Path(__file__).parent / "tool_programs" / "wasm" / "probe.wat"
EXAMPLE = Path(__file__).parent.parent / "examples" / "tools" / "word_count.wasm"
ANY = {"type": "object"}


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("modules") / "probe.wasm"
    path.write_bytes(wasmtime.wat2wasm(PROBE_WAT.read_text()))
    return path


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    (path / "data.txt").write_text("from the workspace")
    return path


def make(
    module: Path,
    entrypoint: str,
    *,
    timeout: float = 30.0,
    budget: MemoryBudget | None = None,
    **wasm: Any,
) -> Tool:
    block = WasmToolSpec(module=str(module), entrypoint=entrypoint, **wasm)
    spec = ToolSpecModel(type="wasm", parameters=ANY, wasm=block, timeout_seconds=timeout)
    return wasm_tool.create(entrypoint, spec, {}, budget=budget)


async def call(tool: Tool, workspace: Path, **arguments: Any) -> Any:
    ctx = ToolContext("run-1", "tester", "default", "call-1", "run-1:1:0", workspace)
    return await tool.call(arguments, ctx)


async def failure(tool: Tool, workspace: Path, **arguments: Any) -> ToolError:
    with pytest.raises(ToolError) as caught:
        await call(tool, workspace, **arguments)
    return caught.value


async def test_a_correct_module_answers_with_its_arguments_unicode_included(
    probe: Path, workspace: Path
) -> None:
    text = "héllo ☃ \U0001f600 \u202e"
    result = await call(make(probe, "echo"), workspace, text=text)

    assert result["arguments"] == {"text": text}
    # Corral's per-call variables and nothing of the host's environment
    assert sorted(result["env"]) == [
        "CORRAL_IDEMPOTENCY_KEY=run-1:1:0",
        "CORRAL_RUN_ID=run-1",
        "CORRAL_TOOL_CALL_ID=call-1",
    ]


async def test_the_example_word_count_module_counts_words(workspace: Path) -> None:
    tool = make(EXAMPLE, "_start")

    assert await call(tool, workspace, text="hello big\nworld ☃") == {"words": 4}
    assert await call(tool, workspace, text="  ") == {"words": 0}


async def test_an_infinite_loop_stops_on_fuel_as_resource_exhausted(
    probe: Path, workspace: Path
) -> None:
    error = await failure(make(probe, "spin", fuel=1_000_000), workspace)

    assert (error.code, error.info.details) == ("resource_exhausted", {"limit": "fuel"})
    assert "fuel limit (1000000)" in error.info.reason


async def test_a_loop_with_fuel_to_spare_stops_at_the_tools_timeout(
    probe: Path, workspace: Path
) -> None:
    started = time.monotonic()
    error = await failure(make(probe, "spin", fuel=10**15, timeout=0.3), workspace)

    assert (error.code, error.retryable) == ("timeout", True)
    assert time.monotonic() - started < 5


async def test_the_event_loop_runs_while_a_module_spins_and_a_cancel_stops_it(
    probe: Path, workspace: Path
) -> None:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.01)
            ticks += 1

    tool = make(probe, "spin", fuel=10**15)
    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        with anyio.move_on_after(0.3):
            await call(tool, workspace)
        tg.cancel_scope.cancel()

    # the call's thread is waited for, not abandoned: ending promptly means the module stopped
    assert time.monotonic() - started < 5
    assert ticks >= 5
    assert await call(make(probe, "echo"), workspace, text="after") is not None


async def test_memory_grown_past_the_limit_is_resource_exhausted(
    probe: Path, workspace: Path
) -> None:
    error = await failure(make(probe, "grow", max_memory_mb=2), workspace)

    assert (error.code, error.info.details) == ("resource_exhausted", {"limit": "memory"})
    assert "memory limit (2 MiB)" in error.info.reason


async def test_a_trap_that_is_no_limit_is_execution_failed_naming_it(
    probe: Path, workspace: Path
) -> None:
    error = await failure(make(probe, "divide"), workspace)

    assert error.code == "execution_failed"
    assert error.info.details["trap"] == "integer_division_by_zero"


async def test_without_wasi_the_module_has_no_file_at_all(probe: Path, workspace: Path) -> None:
    error = await failure(make(probe, "read"), workspace)

    assert error.code == "execution_failed"
    assert error.info.details["exit_code"] == 8  # EBADF: there is no directory to open from


async def test_a_read_only_workspace_can_be_read_but_not_written(
    probe: Path, workspace: Path
) -> None:
    wasi = {"enabled": True, "preopen_workspace": "ro"}

    assert await call(make(probe, "read", wasi=wasi), workspace) == "from the workspace"
    error = await failure(make(probe, "write", wasi=wasi), workspace)
    assert error.code == "execution_failed"
    assert error.info.details["exit_code"] != 0
    assert not (workspace / "out.txt").exists()


async def test_a_read_write_workspace_can_be_written(probe: Path, workspace: Path) -> None:
    wasi = {"enabled": True, "preopen_workspace": "rw"}

    assert await call(make(probe, "write", wasi=wasi), workspace) == "written"
    assert (workspace / "out.txt").read_text() == "written"


async def test_declared_environment_needs_wasi_enabled() -> None:
    with pytest.raises(ValidationError, match="need 'enabled: true'"):
        WasmToolSpec.model_validate({"module": "./x.wasm", "wasi": {"env": {"A": "1"}}})


async def test_garbage_output_is_text_with_replacement_characters(
    probe: Path, workspace: Path
) -> None:
    assert await call(make(probe, "garbage"), workspace) == "\ufffd\ufffd\x00\x01 not json \ufffd"


async def test_output_past_the_cap_is_output_too_large(probe: Path, workspace: Path) -> None:
    error = await failure(make(probe, "flood"), workspace, size=MAX_STDOUT_BYTES + 100_000)

    assert error.code == "output_too_large"


def test_a_malformed_module_is_refused_at_apply_and_at_build(tmp_path: Path) -> None:
    bad = tmp_path / "bad.wasm"
    bad.write_bytes(b"\0asm\x01\0\0\0garbage")

    with pytest.raises(ValidationError, match="not a valid WebAssembly module"):
        WasmToolSpec(module=str(bad))
    stored = WasmToolSpec.model_validate({"module": str(bad)}, context={"stored": True})
    spec = ToolSpecModel(type="wasm", parameters=ANY, wasm=stored)
    with pytest.raises(ConfigurationError, match="not a valid WebAssembly module"):
        wasm_tool.create("bad", spec, {})


def test_a_huge_module_is_refused_before_it_is_read(tmp_path: Path) -> None:
    huge = tmp_path / "huge.wasm"
    with huge.open("wb") as f:
        f.truncate(MAX_MODULE_BYTES + 1)  # sparse: nothing is written

    with pytest.raises(ValidationError, match="more than a module may be"):
        WasmToolSpec(module=str(huge))


def test_modules_inside_corral_home_and_missing_ones_are_refused(
    tmp_path: Path, probe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_HOME", str(probe.parent))
    with pytest.raises(ValidationError, match="inside CORRAL_HOME"):
        WasmToolSpec(module=str(probe))
    with pytest.raises(ValidationError, match="is not a file"):
        WasmToolSpec(module=str(tmp_path / "missing.wasm"))
    with pytest.raises(ValidationError, match="under /proc"):
        WasmToolSpec(module="/proc/self/status")


def test_a_module_importing_more_than_wasi_or_lacking_its_entry_point_is_refused(
    tmp_path: Path, probe: Path
) -> None:
    foreign = tmp_path / "foreign.wasm"
    foreign.write_bytes(
        wasmtime.wat2wasm('(module (import "env" "f" (func)) (func (export "_start")))')
    )
    with pytest.raises(ConfigurationError, match=r"imports env\.f; only wasi_snapshot_preview1"):
        make(foreign, "_start")
    with pytest.raises(ConfigurationError, match="exports no function 'nope'"):
        make(probe, "nope")
    with pytest.raises(ConfigurationError, match="not a function without parameters"):
        make(probe, "memory")


def test_a_module_is_compiled_once_per_process(probe: Path) -> None:
    wasm = probe.read_bytes()
    first = wasm_tool.compiled(wasm)

    assert wasm_tool.compiled(wasm)[1] is first[1]
    assert make(probe, "echo").digest == first[0]  # type: ignore[attr-defined]


def test_a_relative_module_is_made_absolute_against_its_file_and_checked(
    tmp_path: Path, probe: Path
) -> None:
    document = f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: probe}}
spec:
  type: wasm
  parameters: {{type: object}}
  wasm: {{module: ./{probe.name}}}
"""
    (probe.parent / "tool.yaml").write_text(document)
    (loaded,) = load_path(probe.parent / "tool.yaml")
    assert loaded.resource.spec.wasm.module == str(probe)  # type: ignore[attr-defined]

    (tmp_path / "tool.yaml").write_text(document)  # next to no module
    with pytest.raises(Exception, match="is not a file"):
        load_path(tmp_path / "tool.yaml")
    # over the API there is no file to be relative to
    problems = unanchored_paths(load_text(document, None))
    assert [p[0].field for p in problems] == ["spec.wasm.module"]


def test_the_example_module_is_built_from_its_source() -> None:
    source = EXAMPLE.with_suffix(".wat").read_text()
    assert wasmtime.wat2wasm(source) == EXAMPLE.read_bytes()
    assert os.path.getsize(EXAMPLE) < 4096


def test_a_file_that_is_no_module_is_refused_without_quoting_it(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("root:hunter2")
    loop = tmp_path / "loop.wasm"
    loop.symlink_to(loop)

    with pytest.raises(ValidationError) as caught:
        WasmToolSpec(module=str(secret))
    assert "0asm' header" in str(caught.value)
    assert "0x72" not in str(caught.value) and "hunter2" not in str(caught.value)
    with pytest.raises(ValidationError, match="cannot be read"):
        WasmToolSpec(module=str(loop))
    with pytest.raises(ValidationError, match=r"cannot be read|is not a file"):
        WasmToolSpec(module="/" + "a" * 5000)


def test_the_module_cache_keeps_the_most_recently_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wasm_tool, "CACHED_MODULES", 2)
    modules = [wasmtime.wat2wasm(f'(module (func (export "f{i}")))') for i in range(3)]
    first = wasm_tool.compiled(modules[0])[1]
    wasm_tool.compiled(modules[1])
    assert wasm_tool.compiled(modules[0])[1] is first  # used again: now the most recent
    wasm_tool.compiled(modules[2])  # drops modules[1], the least recently used

    assert wasm_tool.compiled(modules[0])[1] is first
    assert len(wasm_tool._cache) == 2


# --------------------------------------------------------------------------- memory of the server


async def _reserved(budget: MemoryBudget, mb: int, waiting: int = 0) -> None:
    """Until ``mb`` are reserved and ``waiting`` calls wait (polled, with a deadline)."""
    with anyio.fail_after(10):
        while budget.reserved_mb != mb or budget.waiting_calls != waiting:
            await anyio.sleep(0.005)


async def test_calls_running_at_once_never_hold_more_than_the_budget(
    probe: Path, workspace: Path
) -> None:
    budget = MemoryBudget(16)
    holder = make(probe, "spin", fuel=10**15, max_memory_mb=10, budget=budget)
    late = make(probe, "echo", timeout=0.4, max_memory_mb=10, budget=budget)
    small = make(probe, "echo", max_memory_mb=6, budget=budget)
    async with anyio.create_task_group() as tg:
        tg.start_soon(call, holder, workspace)
        await _reserved(budget, 10)
        error = await failure(late, workspace)  # 10 + 10 > 16: it waited 0.2 s, then failed
        assert (error.code, error.retryable) == ("resource_exhausted", True)
        assert error.info.details == {"limit": "memory_budget"}
        assert "CORRAL_WASM_MEMORY_BUDGET_MB" in error.info.reason
        assert (await call(small, workspace, text="fits"))["arguments"] == {"text": "fits"}
        tg.cancel_scope.cancel()
    assert (budget.reserved_mb, budget.waiting_calls) == (0, 0)


async def test_a_waiting_call_runs_when_the_memory_is_free_and_a_cancelled_one_frees_its_turn(
    probe: Path, workspace: Path
) -> None:
    budget = MemoryBudget(10)
    holder = make(probe, "spin", fuel=10**15, max_memory_mb=10, budget=budget)
    waiter = make(probe, "echo", max_memory_mb=8, budget=budget)
    answers: list[Any] = []
    holding = anyio.CancelScope()
    abandoned = anyio.CancelScope()

    async def hold() -> None:
        with holding:
            await call(holder, workspace)

    async def wait_and_give_up() -> None:
        with abandoned:
            await call(waiter, workspace, text="never")

    async def wait() -> None:
        answers.append(await call(waiter, workspace, text="late"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(hold)
        await _reserved(budget, 10)
        tg.start_soon(wait_and_give_up)
        await _reserved(budget, 10, waiting=1)
        abandoned.cancel()  # a cancelled waiter leaves the line
        await _reserved(budget, 10, waiting=0)
        tg.start_soon(wait)
        await _reserved(budget, 10, waiting=1)
        holding.cancel()
    assert answers[0]["arguments"] == {"text": "late"}
    assert (budget.reserved_mb, budget.waiting_calls) == (0, 0)


async def test_a_call_asking_more_than_the_whole_budget_fails_at_once(
    probe: Path, workspace: Path
) -> None:
    error = await failure(make(probe, "echo", max_memory_mb=64, budget=MemoryBudget(32)), workspace)
    assert (error.code, error.retryable) == ("resource_exhausted", False)
    assert "more than the whole budget" in error.info.reason


def _wasm_tool(module: Path, mb: int) -> str:
    return f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: big}}
spec:
  type: wasm
  parameters: {{type: object}}
  wasm: {{module: "{module}", entrypoint: echo, max_memory_mb: {mb}}}
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: m}}
spec: {{provider: scripted, script: [{{text: done}}]}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: helper}}
spec: {{model: m, tools: [big]}}
"""


async def test_a_tool_asking_more_than_the_servers_cap_is_refused_when_built(
    probe: Path, env: tuple[Store, Settings]
) -> None:
    store, settings = env
    await store.apply(load_text(_wasm_tool(probe, 1024), "t.yaml"))
    async with AsyncExitStack() as stack:
        with pytest.raises(ConfigurationError, match="max_memory_mb 1024 is over the cap of 256"):
            await AgentBuilder(store, settings).build("helper", stack)
    capped = replace(settings, wasm_max_memory_mb=2048)
    async with AsyncExitStack() as stack:
        await AgentBuilder(store, capped).build("helper", stack)


async def test_a_namespace_policy_caps_its_wasm_tools_at_apply_and_at_build(
    probe: Path, env: tuple[Store, Settings]
) -> None:
    store, settings = env
    policy = """
apiVersion: corral/v1
kind: NamespacePolicy
metadata: {name: default}
spec: {wasm: {max_memory_mb: 32}}
"""
    with pytest.raises(ResourceError) as caught:
        await store.apply(load_text(policy + "---" + _wasm_tool(probe, 64), "t.yaml"))
    assert "spec.wasm.max_memory_mb" in str(caught.value)
    assert "over the namespace policy's wasm.max_memory_mb (32)" in str(caught.value)
    await store.apply(load_text(_wasm_tool(probe, 64), "t.yaml"))  # before the policy
    await store.apply(load_text(policy, "p.yaml"))
    async with AsyncExitStack() as stack:
        with pytest.raises(ConfigurationError, match="over the cap of 32 MiB"):
            await AgentBuilder(store, settings).build("helper", stack)


@pytest.mark.parametrize("variable", ["CORRAL_WASM_MAX_MEMORY_MB", "CORRAL_WASM_MEMORY_BUDGET_MB"])
def test_the_memory_settings_refuse_what_is_no_size(variable: str) -> None:
    with pytest.raises(ConfigurationError, match=variable):
        Settings.from_env({variable: "lots"})
    with pytest.raises(ConfigurationError, match=variable):
        Settings.from_env({variable: "0"})


def test_a_namespace_policys_wasm_cap_is_validated() -> None:
    with pytest.raises(ValidationError):
        NamespacePolicySpec.model_validate({"wasm": {"max_memory_mb": 0}})
    with pytest.raises(ValidationError):
        NamespacePolicySpec.model_validate({"wasm": {"max_memory_mb": 5000}})
    with pytest.raises(ValidationError):
        NamespacePolicySpec.model_validate({"wasm": {"memory": 1}})
