"""Where agents and MCP servers keep their files: one root per kind, none inside another.

``$CORRAL_HOME/work/agents/<namespace>/<agent>`` and
``$CORRAL_HOME/work/mcp-servers/<namespace>/<server>``: a name of one kind never
reaches a workspace of another (before, an MCP server's workspace lay in
``workspaces/<namespace>/mcp/<server>``, inside the workspace of an agent named
``mcp``). Every directory on the way is 0700 (:mod:`corral.core.private_files`).

A workspace of the former layout (``$CORRAL_HOME/workspaces/...``) is moved to its
new place the first time it is used, unless that place already exists. An agent
named ``mcp`` does not inherit its former workspace: the MCP servers' workspaces
lay inside it, and it is left where it was (a warning says so).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Literal

from corral.core.private_files import private_directory
from corral.core.settings import Settings

__all__ = ["WorkspaceKind", "former_workspace", "prepare_workspace", "workspace_path"]

log = logging.getLogger(__name__)

WorkspaceKind = Literal["agents", "mcp-servers"]


def workspace_path(settings: Settings, kind: WorkspaceKind, namespace: str, name: str) -> Path:
    """The workspace of ``name`` (an Agent or McpServer) in ``namespace``."""
    return settings.workspaces / kind / namespace / name


def former_workspace(
    settings: Settings, kind: WorkspaceKind, namespace: str, name: str
) -> Path | None:
    """Where the former layout kept this workspace (``None``: nowhere it can be moved from)."""
    root = settings.home / "workspaces" / namespace
    if kind == "mcp-servers":
        return root / "mcp" / name
    return None if name == "mcp" else root / name


def prepare_workspace(settings: Settings, kind: WorkspaceKind, namespace: str, name: str) -> Path:
    """The workspace, made (0700, ``CORRAL_HOME`` tightened) or moved from the former
    layout. Blocking: call it from a thread."""
    private_directory(settings.home)
    path = workspace_path(settings, kind, namespace, name)
    private_directory(path.parent)
    former = former_workspace(settings, kind, namespace, name)
    if former is not None and not path.exists() and former.is_dir() and not former.is_symlink():
        with contextlib.suppress(OSError):
            os.rename(former, path)  # another process may have moved it first
            log.info("moved the workspace of %s %s/%s to %s", kind, namespace, name, path)
    elif kind == "agents" and name == "mcp" and not path.exists():
        left = settings.home / "workspaces" / namespace / "mcp"
        if left.is_dir():
            log.warning(
                "agent %s/mcp starts with an empty workspace: its former one, %s, "
                "also held the MCP servers' workspaces and is left where it is",
                namespace,
                left,
            )
    return private_directory(path)
