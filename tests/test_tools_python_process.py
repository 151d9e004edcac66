"""``python: {isolation: process}``: functions in worker subprocesses a timeout can kill.

Real subprocesses (forkserver); the governance layer makes the calls as the engine does
(timeouts, cancellation). What every tool kind does is in tests/conformance/; this is
what only a process-isolated function does.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import ValidationError

from corral.core.messages import ToolCall
from corral.resources.kinds import PythonToolSpec, ToolSpecModel
from corral.tools import python as python_tool
from corral.tools.base import Tool, ToolContext
from corral.tools.governance import GovernedTool, ToolOutcome, ToolPolicy, Toolset
from corral.tools.python_process import default_pool

PROGRAMS = Path(__file__).parent / "tool_programs"
PROMPTLY = 10.0


@pytest.fixture(autouse=True)
def fresh_pool() -> Iterator[None]:
    default_pool().close()
    yield
    default_pool().close()


def tool(function: str, **python: Any) -> Tool:
    block = PythonToolSpec.model_validate(
        {
            "function": f"process_tools:{function}",
            "path": str(PROGRAMS),
            "isolation": "process",
            **python,
        }
    )
    return python_tool.create(function, ToolSpecModel(type="python", python=block), {})


async def invoke(tool: Tool, arguments: dict[str, Any], **policy: Any) -> ToolOutcome:
    toolset = Toolset([GovernedTool(tool, ToolPolicy(**policy))])
    call = ToolCall("call-1", tool.spec.name, json.dumps(arguments))
    ctx = ToolContext("run-1", "tester", "default", "call-1", "run-1:1:0", PROGRAMS)
    return await toolset.invoke(call, ctx)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie of ours would still answer: it must have been reaped too
    return False


async def test_a_function_that_loops_forever_is_killed_at_its_timeout() -> None:
    first = await invoke(tool("pid"), {})
    pid = json.loads(first.output)
    threads = threading.active_count()  # (after the pool's first start: anyio's idle thread)
    assert pid != os.getpid()
    with anyio.fail_after(PROMPTLY):
        outcome = await invoke(tool("spin"), {}, timeout_seconds=0.5)
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.retryable) == ("timeout", True)
    # the spinning subprocess (the pool's one: the same pid served both calls) is gone
    assert _gone(pid)
    assert default_pool().alive == set()
    assert threading.active_count() == threads  # no thread kept spinning either
    after = await invoke(tool("pid"), {})
    assert after.error is None and json.loads(after.output) != pid  # a new one serves


async def test_killing_one_stuck_call_leaves_the_others_running() -> None:
    results: dict[str, ToolOutcome] = {}

    async def one(key: str, function: str, arguments: dict[str, Any], **policy: Any) -> None:
        results[key] = await invoke(tool(function), arguments, **policy)

    with anyio.fail_after(PROMPTLY):
        async with anyio.create_task_group() as group:
            group.start_soon(functools.partial(one, "stuck", "spin", {}, timeout_seconds=0.5))
            group.start_soon(one, "slow", "nap", {"seconds": 1.0})
    assert results["stuck"].error is not None and results["stuck"].error.code == "timeout"
    assert results["slow"].error is None, results["slow"].error
    assert results["slow"].output == "slept 1.0"


async def test_a_cancelled_call_kills_its_subprocess() -> None:
    with anyio.fail_after(PROMPTLY), anyio.move_on_after(0.3) as scope:
        await invoke(tool("spin"), {})
    assert scope.cancelled_caught
    assert default_pool().alive == set()


async def test_the_result_and_error_contract_matches_in_process() -> None:
    refused = await invoke(tool("refuse"), {"reason": "not yours"})
    assert refused.error is not None
    assert (refused.error.code, refused.error.reason, refused.error.retryable) == (
        "permission_denied",
        "not yours",
        True,
    )
    coroutine = await invoke(tool("later"), {"text": "quiet"})
    assert coroutine.error is None and coroutine.output == "QUIET"
    invalid = await invoke(tool("nap"), {"seconds": "soon"})
    assert invalid.error is not None and invalid.error.code == "invalid_input"


async def test_a_subprocess_that_dies_mid_call_is_execution_failed() -> None:
    outcome = await invoke(tool("die"), {"code": 7})
    assert outcome.error is not None
    assert outcome.error.code == "execution_failed"
    assert "ended during the call (exit code 7)" in outcome.error.reason
    served = await invoke(tool("later"), {"text": "on"})
    assert served.error is None


def test_inline_and_process_do_not_go_together() -> None:
    with pytest.raises(ValidationError, match="isolation 'process' cannot"):
        tool("pid", inline=True)
    with pytest.raises(ValidationError):
        PythonToolSpec.model_validate({"function": "m:f", "isolation": "thread"})
