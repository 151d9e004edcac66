"""A sandboxed call is bounded when its Tool says nothing, and a NamespacePolicy caps them all.

A real bubblewrap sandbox running the hostile program; the policy applied to a real
store and the agent built by the real :class:`~corral.runtime.builder.AgentBuilder`.
"""

from __future__ import annotations

import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from corral.core.errors import ResourceError, ToolError
from corral.core.settings import Settings
from corral.resources.isolation import IsolationLimits, IsolationSpec, capped_limits
from corral.resources.kinds import ExecToolSpec, ToolSpecModel
from corral.resources.loader import load_text
from corral.runtime.builder import AgentBuilder
from corral.store import Store
from corral.tools import exec as exec_tool
from corral.tools.base import ToolContext
from corral.tools.exec import ExecTool
from corral.tools.sandbox.host import SandboxHost
from corral.tools.sandbox.limits import DEFAULT_MAX_PROCESSES, DEFAULT_MEMORY_MB
from sandboxing import require_bwrap, sandbox_host

HOSTILE = Path(__file__).parent / "tool_programs" / "hostile.py"


@pytest.fixture
def host(tmp_path: Path) -> SandboxHost:
    sandbox = sandbox_host(tmp_path / "corral-home")
    require_bwrap(sandbox)
    return sandbox


def _context(workspace: Path) -> ToolContext:
    workspace.mkdir(parents=True, exist_ok=True)
    return ToolContext("run-1", "me", "default", "call-1", "run-1:1:call-1", workspace)


def _tool(host: SandboxHost, **isolation: Any) -> ExecTool:
    spec = ToolSpecModel(
        type="exec",
        parameters={"type": "object"},
        timeout_seconds=60,
        exec=ExecToolSpec(
            command=[sys.executable, str(HOSTILE)],
            isolation=IsolationSpec.model_validate(isolation),
        ),
    )
    tool = exec_tool.create("greedy", spec, {}, sandbox_host=host)
    assert isinstance(tool, ExecTool) and tool.isolation.mode == "sandbox"
    return tool


async def test_a_default_tool_cannot_start_1500_processes(host: SandboxHost) -> None:
    tool = _tool(host)
    with pytest.raises(ToolError) as caught:
        await tool.call({"mode": "forks", "count": 1500}, _context(host.corral_home / "w"))
    assert caught.value.code == "resource_exhausted"
    assert caught.value.info.details["limit"] == "max_processes"
    assert f"max_processes limit ({DEFAULT_MAX_PROCESSES})" in caught.value.info.reason
    # a few processes are fine
    assert await tool.call({"mode": "forks", "count": 20}, _context(host.corral_home / "w")) == 20


async def test_a_default_tool_cannot_touch_a_gibibyte(host: SandboxHost) -> None:
    tool = _tool(host)
    with pytest.raises(ToolError) as caught:
        await tool.call({"mode": "memory", "mb": 1024}, _context(host.corral_home / "w"))
    assert caught.value.code == "resource_exhausted"
    assert caught.value.info.details["limit"] == "memory_mb"
    assert f"memory_mb limit ({DEFAULT_MEMORY_MB})" in caught.value.info.reason
    assert await tool.call({"mode": "memory", "mb": 64}, _context(host.corral_home / "w")) == (
        64 << 20
    )


async def test_a_tool_may_ask_for_more_than_the_defaults(host: SandboxHost) -> None:
    tool = _tool(host, limits={"memory_mb": 2048})
    answer = await tool.call({"mode": "memory", "mb": 768}, _context(host.corral_home / "w"))
    assert answer == 768 << 20


def test_a_namespace_maximum_lowers_larger_limits_and_fills_unset_ones() -> None:
    maxima = IsolationLimits(memory_mb=128, wall_seconds=5, max_processes=32)
    mine = IsolationLimits(memory_mb=4096, max_processes=8, cpu_seconds=3)
    capped = capped_limits(mine, maxima)
    assert capped == IsolationLimits(memory_mb=128, wall_seconds=5, max_processes=8, cpu_seconds=3)
    assert capped_limits(mine, None) is mine


MODEL = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: m}
spec: {provider: scripted, script: [{text: done}]}
"""
TOOL = f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: greedy}}
spec:
  type: exec
  parameters: {{type: object}}
  exec:
    command: ["{sys.executable}", "{HOSTILE}"]
    isolation: {{limits: {{memory_mb: 4096, wall_seconds: 600}}}}
"""
AGENT = """
apiVersion: corral/v1
kind: Agent
metadata: {name: helper}
spec: {model: m, tools: [greedy]}
"""
POLICY = """
apiVersion: corral/v1
kind: NamespacePolicy
metadata: {name: default}
spec:
  max_tool_limits: {memory_mb: 128, max_processes: 16, wall_seconds: 20}
"""


async def test_a_namespace_policy_caps_every_tool_of_its_namespace(
    env: tuple[Store, Settings],
) -> None:
    store, settings = env
    host = sandbox_host(settings.home)
    require_bwrap(host)
    await store.apply(load_text("---".join([MODEL, TOOL, AGENT, POLICY]), "caps.yaml"))
    async with AsyncExitStack() as stack:
        built = await AgentBuilder(store, settings, sandbox_host=host).build("helper", stack)
        (governed,) = built.toolset.by_name.values()
        tool = governed.tool
        assert isinstance(tool, ExecTool)
        limits = tool.isolation.limits
        assert (limits.memory_mb, limits.max_processes, limits.wall_seconds) == (128, 16, 20)
        # the cap is part of the agent's effective policy, as run.start and describe show it
        assert built.execution is not None
        assert built.execution["max_tool_limits"] == {
            "memory_mb": 128,
            "max_processes": 16,
            "wall_seconds": 20,
        }
        ctx = ToolContext("run-1", "helper", "default", "call-1", "run-1:1:call-1", built.workspace)
        with pytest.raises(ToolError) as caught:
            await tool.call({"mode": "memory", "mb": 512}, ctx)
        assert caught.value.info.details["limit"] == "memory_mb"
        with pytest.raises(ToolError) as caught:
            await tool.call({"mode": "forks", "count": 40}, ctx)
        assert caught.value.info.details["limit"] == "max_processes"


def test_a_namespace_policy_with_a_hostile_maximum_is_refused_at_apply() -> None:
    for bad in ("{memory_mb: 0}", "{max_processes: -1}", "{memory_mb: lots}", "{nproc: 3}"):
        policy = POLICY.replace("{memory_mb: 128, max_processes: 16, wall_seconds: 20}", bad)
        with pytest.raises(ResourceError) as caught:
            load_text(policy, "caps.yaml")
        assert "max_tool_limits" in str(caught.value)


async def test_a_cgroup_that_cannot_be_made_fails_the_call_closed(
    host: SandboxHost, tmp_path: Path
) -> None:
    # the operator's cgroup directory went away (or was never writable): no unbounded call
    gone = SandboxHost(
        host.corral_home, host.allowed_paths, memory_cgroup=tmp_path / "no-such-cgroup"
    )
    tool = _tool(gone)
    with pytest.raises(ToolError) as caught:
        await tool.call({"mode": "memory", "mb": 1}, _context(host.corral_home / "w"))
    assert caught.value.code == "isolation_unavailable"
    assert caught.value.info.reason.startswith("the call's cgroup could not be made")
    assert not list((host.corral_home / "w").glob("corral-*"))
