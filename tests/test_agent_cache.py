"""Live agents shared between runs (runtime/agents.py): built once, rebuilt on change, closed.

Real store, real MCP server subprocesses: whether a server process is alive is
read from /proc, not from the cache's own bookkeeping.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest

from corral.core.errors import CorralError
from corral.core.events import EventType
from corral.core.runs import RunState
from corral.core.settings import Settings
from corral.resources.loader import load_text
from corral.runtime.agents import AgentCache
from corral.runtime.local import LocalRunner
from corral.store import Store

CALC_MCP = Path(__file__).parent / "mcp_servers" / "calc_server.py"

MODEL = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: script}
spec:
  provider: scripted
  script: [{text: done}]
"""


def agent(instructions: str, tools: str = "[]") -> str:
    return f"""
apiVersion: corral/v1
kind: Agent
metadata: {{name: helper}}
spec:
  model: script
  instructions: {instructions}
  tools: {tools}
"""


def mcp_server(command: str) -> str:
    return f"""
apiVersion: corral/v1
kind: McpServer
metadata: {{name: calc}}
spec: {{transport: stdio, command: [{command}], init_timeout_seconds: 10}}
"""


CALC = mcp_server(f'"{sys.executable}", "{CALC_MCP}"')


async def apply(store: Store, *docs: str) -> None:
    await store.apply(load_text("---".join(docs), "test.yaml"))


def children() -> set[int]:
    """This process's live child processes (zombies excluded)."""
    pids: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        try:
            text = Path(f"/proc/self/task/{task}/children").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended since the listing; its children moved to another thread
        pids.update(int(pid) for pid in text.split())
    return {pid for pid in pids if _state(pid) not in ("Z", None)}


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


async def gone(pids: set[int]) -> bool:
    with anyio.move_on_after(10):
        while pids & children():
            await anyio.sleep(0.05)
    return not pids & children()


async def test_runs_share_one_live_agent_until_a_resource_changes(
    env: tuple[Store, Settings],
) -> None:
    store, settings = env
    await apply(store, MODEL, agent("First."))
    async with AgentCache(store, settings) as cache:
        async with cache.agent("default", "helper") as one, cache.agent("default", "helper") as two:
            assert one is two and one.instructions == "First."
        schema = {"type": "object"}
        async with cache.agent("default", "helper", output_schema=schema) as own:
            assert own.output_schema == schema and own.model is one.model
        await apply(store, agent("Second."))
        async with cache.agent("default", "helper") as three:
            assert three is not one and three.instructions == "Second."
        await apply(store, agent("Second."))  # unchanged: nothing to rebuild
        async with cache.agent("default", "helper") as four:
            assert four is three


async def test_an_mcp_server_lives_as_long_as_the_runs_of_its_agent(
    env: tuple[Store, Settings],
) -> None:
    store, settings = env
    await apply(store, MODEL, CALC, agent("First.", '["mcp:calc/add"]'))
    before = children()
    async with AgentCache(store, settings) as cache:
        async with cache.agent("default", "helper") as first:
            server = children() - before
            assert len(server) == 1
            async with cache.agent("default", "helper") as again:
                assert again is first and children() - before == server  # no second server
            await apply(store, agent("Second.", '["mcp:calc/add"]'))
            async with cache.agent("default", "helper") as second:
                assert second is not first
                assert len(children() - before) == 2  # the old run still has its server
        assert await gone(server)  # its last run ended: the old server is closed
        replacement = children() - before
        assert len(replacement) == 1
    assert await gone(replacement)  # leaving the cache closes the rest


async def test_a_failed_build_reaches_the_run_and_is_tried_again_next_time(
    env: tuple[Store, Settings],
) -> None:
    store, settings = env
    await apply(store, MODEL, mcp_server('"/nonexistent/mcp-server"'))
    await apply(store, agent("First.", '["mcp:calc/add"]'))
    async with AgentCache(store, settings) as cache:
        with pytest.raises(CorralError, match="calc"):
            async with cache.agent("default", "helper"):
                pass
        await apply(store, CALC)
        async with cache.agent("default", "helper") as fixed:
            assert [spec.name for spec in fixed.toolset.specs] == ["calc__add"]


async def test_a_local_runner_keeps_its_agents_between_runs(env: tuple[Store, Settings]) -> None:
    store, settings = env
    script = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: script}
spec:
  provider: scripted
  script:
    - {tool_calls: [{name: calc__add, arguments: {a: 2, b: 3}}]}
    - {text: done}
"""
    await apply(store, script, CALC, agent("First.", '["mcp:calc/add"]'))
    before = children()
    async with LocalRunner(store, settings) as runner:
        first = await runner.run("helper", "add")
        server = children() - before
        assert len(server) == 1  # the agent (and its MCP server) outlived the run
        second = await runner.run("helper", "add again")
        assert children() - before == server  # the second run used the same server
        for record in (first, second):
            assert record.state is RunState.SUCCEEDED and record.output == "done"
            results = [
                e.data.output
                for e in await store.list_events(record.id)
                if e.type is EventType.TOOL_RESULT
            ]
            assert results == ['{"result": 5}']
    assert await gone(server)  # closing the runner closed the server
