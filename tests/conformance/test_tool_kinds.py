"""What every tool kind does, run against each one through the governance layer, as the
engine calls tools (``Toolset.invoke``).

Each kind provides the same four tools (:class:`Kit`): one that echoes its text and the
idempotency key it was given, one that sleeps, one that writes a lot, and one that fails.
The tests check invalid input, the delivery of the idempotency key, timeouts,
cancellation, the output cap and the mapping of a failure to a tool error, once per row
of :data:`KINDS`. A new kind gets these tests by a row and a kit. What only one kind does
(exec's process trees, http's SSRF guard, MCP's lost sessions, wasm's fuel, a2a's remote
task states) stays in its own module
(``tests/test_tools_*.py``).
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
import pytest_asyncio

from a2a_remotes import serving as serving_a2a
from corral.core.messages import ToolCall
from corral.resources.kinds import (
    A2aToolSpec,
    ExecToolSpec,
    HttpToolSpec,
    McpServerSpec,
    PythonToolSpec,
    ToolSpecModel,
    WasmToolSpec,
)
from corral.tools import a2a as a2a_tool
from corral.tools import exec as exec_tool
from corral.tools import http as http_tool
from corral.tools import python as python_tool
from corral.tools import wasm as wasm_tool
from corral.tools.base import Tool, ToolContext
from corral.tools.governance import GovernedTool, ToolOutcome, ToolPolicy, Toolset
from corral.tools.python_process import default_pool
from http_endpoints import serving
from mcp_clients import CALC, connected

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROGRAMS = Path(__file__).parent.parent / "tool_programs"
PROBE = PROGRAMS / "probe.py"
WASM_PROBE = PROGRAMS / "wasm" / "probe.wat"
#: a call that ends within this did not wait for its tool: far beyond a timeout or a
#: cancellation taking effect, far below the 30 s the slow tools sleep
PROMPTLY = 10.0
FAILURE = "disk on fire"


@dataclass
class Kit:
    """One kind's tools, and what they look like from the outside."""

    #: (text): its text and the idempotency key it was given
    echo: Tool
    #: (seconds): sleeps that long
    slow: Tool
    #: (size): ``size`` bytes of "x"
    flood: Tool
    #: (reason): fails, saying why
    fail: Tool
    #: echo's result -> (its text, the idempotency key as the tool received it)
    echoed: Callable[[Any], tuple[str, str]]
    #: the reason of the tool error of fail(reason=FAILURE)
    failure: str
    workspace: Path


Opener = Callable[[Path], AbstractAsyncContextManager[Kit]]


def parameters(**properties: str) -> dict[str, Any]:
    """A JSON Schema of required properties of these JSON types."""
    return {
        "type": "object",
        "properties": {name: {"type": kind} for name, kind in properties.items()},
        "required": list(properties),
    }


@asynccontextmanager
async def python_kit(workspace: Path, isolation: str = "none") -> AsyncIterator[Kit]:
    def tool(function: str) -> Tool:
        block = PythonToolSpec.model_validate(
            {
                "function": f"corral_sample_tools:{function}",
                "path": str(PROGRAMS),
                "isolation": isolation,
            }
        )
        return python_tool.create(function, ToolSpecModel(type="python", python=block), {})

    kit = Kit(
        tool("echo"),
        tool("slow"),
        tool("flood"),
        tool("explode"),
        echoed=lambda result: (result["text"], result["idempotency_key"]),
        failure=f"ValueError: {FAILURE}",
        workspace=workspace,
    )
    sample = importlib.import_module("corral_sample_tools")  # imported by the tools above
    sample.released.clear()
    try:
        yield kit
    finally:
        sample.released.set()  # the threads of abandoned calls end now
        if isolation == "process":
            pool = default_pool()
            assert all(w.process.is_alive() for w in pool.alive)  # none left half-dead
            pool.close()


@asynccontextmanager
async def python_process_kit(workspace: Path) -> AsyncIterator[Kit]:
    async with python_kit(workspace, "process") as kit:
        yield kit


@asynccontextmanager
async def exec_kit(workspace: Path) -> AsyncIterator[Kit]:
    def tool(mode: str, schema: dict[str, Any]) -> Tool:
        block = ExecToolSpec(command=[sys.executable, str(PROBE), mode])
        return exec_tool.create(mode, ToolSpecModel(type="exec", parameters=schema, exec=block), {})

    yield Kit(
        tool("echo", parameters(text="string")),
        tool("sleep", parameters(seconds="number")),
        tool("flood", parameters(size="integer")),
        tool("fail", parameters(reason="string")),
        echoed=lambda result: (
            result["arguments"]["text"],
            result["env"]["CORRAL_IDEMPOTENCY_KEY"],
        ),
        failure=f"{Path(sys.executable).name} exited with code 3: something went wrong: {FAILURE}",
        workspace=workspace,
    )


@asynccontextmanager
async def http_kit(workspace: Path) -> AsyncIterator[Kit]:
    with serving() as server:

        def tool(path: str, schema: dict[str, Any]) -> Tool:
            block = HttpToolSpec(url=server.url(path), allow_private=True)
            spec = ToolSpecModel(type="http", parameters=schema, http=block)
            return http_tool.create(path.strip("/"), spec, {})

        kit = Kit(
            tool("/echo", parameters(text="string")),
            tool("/slow", parameters(seconds="number")),
            tool("/flood", parameters(size="integer")),
            tool("/fail", parameters(reason="string")),
            echoed=lambda result: (result["body"]["text"], result["headers"]["Idempotency-Key"]),
            failure=f"HTTP 400 Bad Request: {FAILURE}",
            workspace=workspace,
        )
        try:
            yield kit
        finally:
            for each in (kit.echo, kit.slow, kit.flood, kit.fail):
                await each.aclose()


@asynccontextmanager
async def mcp_kit(workspace: Path) -> AsyncIterator[Kit]:
    spec = McpServerSpec(transport="stdio", command=[sys.executable, CALC])
    async with connected("calc", spec, {}, workspace) as tools:
        yield Kit(
            tools["mcp:calc/echo"],
            tools["mcp:calc/slow"],
            tools["mcp:calc/flood"],
            tools["mcp:calc/fail"],
            echoed=lambda result: (result["text"], result["meta"]["corral/idempotency_key"]),
            failure=f"Error executing tool fail: {FAILURE}",
            workspace=workspace,
        )


@asynccontextmanager
async def wasm_kit(workspace: Path) -> AsyncIterator[Kit]:
    import wasmtime

    module = workspace.parent / f"{workspace.name}-probe.wasm"
    module.write_bytes(wasmtime.wat2wasm(WASM_PROBE.read_text()))

    def tool(entrypoint: str, schema: dict[str, Any], **limits: Any) -> Tool:
        block = WasmToolSpec(module=str(module), entrypoint=entrypoint, **limits)
        spec = ToolSpecModel(type="wasm", parameters=schema, wasm=block)
        return wasm_tool.create(entrypoint, spec, {})

    def echoed(result: Any) -> tuple[str, str]:
        env = dict(entry.split("=", 1) for entry in result["env"])
        return result["arguments"]["text"], env["CORRAL_IDEMPOTENCY_KEY"]

    yield Kit(
        tool("echo", parameters(text="string")),
        # a busy loop with fuel for hours: only the epoch (timeout, cancellation) stops it
        tool("spin", parameters(seconds="number"), fuel=10**15),
        tool("flood", parameters(size="integer")),
        tool("fail", parameters(reason="string")),
        echoed=echoed,
        failure=f"fail exited with code 3: something went wrong: {FAILURE}",
        workspace=workspace,
    )


@asynccontextmanager
async def a2a_kit(workspace: Path) -> AsyncIterator[Kit]:
    """Remote agents built with the a2a-sdk (tests/a2a_remotes.py), one per tool."""
    with serving_a2a() as remote:

        def tool(agent: str, schema: dict[str, Any]) -> Tool:
            block = A2aToolSpec(url=remote.card(agent), allow_private=True)
            return a2a_tool.create(
                agent, ToolSpecModel(type="a2a", parameters=schema, a2a=block), {}
            )

        kit = Kit(
            tool("echo", parameters(text="string")),
            tool("slow", parameters(seconds="number")),
            tool("flood", parameters(size="integer")),
            tool("fail", parameters(reason="string")),
            # the messageId adds the arguments' digest; the metadata carries the key itself
            echoed=lambda result: (result["text"], result["metadata"]["corral/idempotency_key"]),
            failure=f"the remote agent's task failed: {FAILURE}",
            workspace=workspace,
        )
        try:
            yield kit
        finally:
            for each in (kit.echo, kit.slow, kit.flood, kit.fail):
                await each.aclose()


@dataclass(frozen=True)
class ToolKind:
    name: str
    kit: Opener


KINDS = [
    ToolKind("python", python_kit),
    ToolKind("python-process", python_process_kit),
    ToolKind("exec", exec_kit),
    ToolKind("http", http_kit),
    ToolKind("mcp", mcp_kit),
    ToolKind("wasm", wasm_kit),
    ToolKind("a2a", a2a_kit),
]


@pytest_asyncio.fixture(
    loop_scope="module", scope="module", params=KINDS, ids=lambda kind: kind.name
)
async def kit(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Kit]:
    kind: ToolKind = request.param
    async with kind.kit(tmp_path_factory.mktemp(kind.name)) as opened:
        yield opened


async def invoke(
    kit: Kit, tool: Tool, arguments: dict[str, Any], *, key: str = "run-1:1:0", **policy: Any
) -> ToolOutcome:
    """One call of ``tool`` with a policy of ``policy``, as the engine makes it."""
    toolset = Toolset([GovernedTool(tool, ToolPolicy(**policy))])
    call = ToolCall("call-1", tool.spec.name, json.dumps(arguments))
    ctx = ToolContext("run-1", "tester", "default", "call-1", key, kit.workspace)
    return await toolset.invoke(call, ctx)


async def assert_serves(kit: Kit) -> None:
    """The kind still answers a call."""
    outcome = await invoke(kit, kit.echo, {"text": "still here"})
    assert outcome.error is None, outcome.error
    assert kit.echoed(json.loads(outcome.output))[0] == "still here"


async def test_arguments_that_break_the_tools_schema_are_invalid_input_and_never_run(
    kit: Kit,
) -> None:
    outcome = await invoke(kit, kit.echo, {"text": 42})

    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.reason) == (
        "invalid_input",
        "text: 42 is not of type 'string'",
    )
    assert outcome.attempts == 0


async def test_the_idempotency_key_of_the_call_reaches_the_tool(kit: Kit) -> None:
    outcome = await invoke(kit, kit.echo, {"text": "hello"}, key="run-9:3:1")

    assert outcome.error is None, outcome.error
    assert kit.echoed(json.loads(outcome.output)) == ("hello", "run-9:3:1")


async def test_a_call_past_its_timeout_is_a_retryable_timeout_and_the_tool_serves_on(
    kit: Kit,
) -> None:
    with anyio.fail_after(PROMPTLY):
        outcome = await invoke(kit, kit.slow, {"seconds": 30}, timeout_seconds=0.5)

    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.retryable) == ("timeout", True)
    assert outcome.attempts == 1
    await assert_serves(kit)


async def test_a_cancelled_call_ends_at_once_and_the_tool_serves_on(kit: Kit) -> None:
    with anyio.fail_after(PROMPTLY), anyio.move_on_after(0.3) as scope:
        await invoke(kit, kit.slow, {"seconds": 30})

    assert scope.cancelled_caught
    await assert_serves(kit)


async def test_output_over_the_cap_reaches_the_model_cut(kit: Kit) -> None:
    outcome = await invoke(kit, kit.flood, {"size": 5000}, max_output_bytes=1000)

    assert outcome.error is None, outcome.error
    assert outcome.output == "x" * 1000 + "\n[output truncated: 4000 of 5000 bytes cut]"


async def test_a_failing_tool_is_execution_failed_with_its_reason(kit: Kit) -> None:
    outcome = await invoke(kit, kit.fail, {"reason": FAILURE})

    assert outcome.error is not None
    error = outcome.error
    assert (error.code, error.reason, error.retryable) == ("execution_failed", kit.failure, False)
    assert json.loads(outcome.model_text()) == {
        "error": {"code": "execution_failed", "message": kit.failure}
    }
