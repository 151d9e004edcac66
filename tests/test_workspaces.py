"""Workspaces: one root per kind, so no Agent's name reaches an McpServer's (or another's).

The agent is built by the real :class:`~corral.runtime.builder.AgentBuilder` over a
real store, with a real stdio MCP server (``tests/mcp_servers/calc_server.py``).
"""

from __future__ import annotations

import stat
import sys
from contextlib import AsyncExitStack
from pathlib import Path

from corral.core.settings import Settings
from corral.resources.loader import load_text
from corral.runtime.builder import AgentBuilder
from corral.runtime.workspaces import prepare_workspace, workspace_path
from corral.store import Store

CALC = Path(__file__).parent / "mcp_servers" / "calc_server.py"

MODEL = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: m}
spec: {provider: scripted, script: [{text: done}]}
"""
SERVER = f"""
apiVersion: corral/v1
kind: McpServer
metadata: {{name: calc}}
spec:
  transport: stdio
  command: ["{sys.executable}", "{CALC}"]
"""


def _agent(name: str) -> str:
    return f"""
apiVersion: corral/v1
kind: Agent
metadata: {{name: {name}}}
spec: {{model: m, tools: ["mcp:calc/*"]}}
"""


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


async def test_an_agent_named_mcp_does_not_hold_the_mcp_servers_workspaces(
    env: tuple[Store, Settings],
) -> None:
    store, settings = env
    await store.apply(load_text("---".join([MODEL, SERVER, _agent("mcp")]), "w.yaml"))
    async with AsyncExitStack() as stack:
        built = await AgentBuilder(store, settings).build("mcp", stack)
        agent_workspace = built.workspace
    server_workspace = workspace_path(settings, "mcp-servers", "default", "calc")
    assert server_workspace.is_dir() and agent_workspace.is_dir()
    assert not _within(server_workspace, agent_workspace)
    assert not _within(agent_workspace, server_workspace)
    for directory in (agent_workspace, server_workspace):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700


def test_no_name_of_one_kind_reaches_a_workspace_of_another(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", db_url="sqlite://", secret_key=None)
    names = ["mcp", "agents", "mcp-servers", "work", "a..b", "default", "calc"]
    made = {
        (kind, namespace, name): prepare_workspace(settings, kind, namespace, name)
        for kind in ("agents", "mcp-servers")
        for namespace in ("default", "mcp", "agents")
        for name in names
    }
    for key, path in made.items():
        assert _within(path, settings.workspaces / key[0])
        for other_key, other in made.items():
            if other_key != key:
                assert not _within(path, other), (key, other_key)


def test_workspaces_of_the_former_layout_move_on_first_use(tmp_path: Path) -> None:
    home = tmp_path / "home"
    settings = Settings(home=home, db_url="sqlite://", secret_key=None)
    former = home / "workspaces" / "default"
    (former / "helper").mkdir(parents=True)
    (former / "helper" / "notes.txt").write_text("HELPER")
    (former / "mcp" / "calc").mkdir(parents=True)
    (former / "mcp" / "calc" / "state.json").write_text("CALC")
    (former / "mcp" / "mine.txt").write_text("AGENT-MCP")
    (former / "linked").symlink_to(tmp_path)  # a symlink is never followed nor moved

    helper = prepare_workspace(settings, "agents", "default", "helper")
    assert (helper / "notes.txt").read_text() == "HELPER"
    assert not (former / "helper").exists()
    calc = prepare_workspace(settings, "mcp-servers", "default", "calc")
    assert (calc / "state.json").read_text() == "CALC"
    # the agent named mcp starts empty: its former workspace held the servers' as well
    agent_mcp = prepare_workspace(settings, "agents", "default", "mcp")
    assert list(agent_mcp.iterdir()) == []
    assert (former / "mcp" / "mine.txt").exists()
    linked = prepare_workspace(settings, "agents", "default", "linked")
    assert not linked.is_symlink() and list(linked.iterdir()) == []
    assert (former / "linked").is_symlink()
    # a second use finds the new place and moves nothing again
    (former / "helper").mkdir()
    (former / "helper" / "late.txt").write_text("LATE")
    assert prepare_workspace(settings, "agents", "default", "helper") == helper
    assert not (helper / "late.txt").exists()
