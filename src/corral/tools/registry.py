"""Turn a ``Tool`` resource into a live :class:`Tool`.

Each kind module exposes ``create(name, spec, secrets) -> Tool`` and is imported
on first use. MCP tools come from a server session instead
(:func:`corral.tools.mcp.open_server_tools`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from corral.core.errors import ConfigurationError
from corral.resources.kinds import ToolSpecModel
from corral.tools.base import Tool
from corral.tools.sandbox.host import SandboxHost

if TYPE_CHECKING:
    from corral.tools.wasm_budget import MemoryBudget

KINDS: dict[str, str] = {
    "python": "corral.tools.python",
    "exec": "corral.tools.exec",
    "http": "corral.tools.http",
    "wasm": "corral.tools.wasm",
    "a2a": "corral.tools.a2a",
}
#: the kinds whose programs run under an isolation (they take ``sandbox_host``)
SANDBOXED_KINDS = frozenset({"exec"})


def build_tool(
    name: str,
    spec: ToolSpecModel,
    secrets: Mapping[str, str],
    *,
    sandbox_host: SandboxHost | None = None,
    wasm_budget: MemoryBudget | None = None,
    wasm_max_memory_mb: int | None = None,
) -> Tool:
    """The tool kind's implementation for one ``Tool`` resource.

    ``sandbox_host`` reaches the kinds that start programs (``exec``); ``wasm_budget``
    and ``wasm_max_memory_mb`` (the process's memory budget and the cap of one call)
    reach ``wasm``.
    """
    module_name = KINDS.get(spec.type)
    if module_name is None:
        raise ConfigurationError(f"tool {name!r}: unsupported tool type {spec.type!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if spec.type != "a2a" or not (exc.name or "").startswith(("a2a", "google")):
            raise
        raise ConfigurationError(
            f"tool {name!r}: type 'a2a' needs the a2a-sdk: pip install 'corral[a2a]'"
        ) from None
    if spec.type == "wasm":
        wasm: Tool = module.create(
            name, spec, secrets, budget=wasm_budget, max_memory_mb=wasm_max_memory_mb
        )
        return wasm
    if spec.type in SANDBOXED_KINDS:
        sandboxed: Tool = module.create(name, spec, secrets, sandbox_host=sandbox_host)
        return sandboxed
    tool: Tool = module.create(name, spec, secrets)
    return tool
