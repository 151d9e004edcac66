"""Opening the tests' MCP servers (``tests/mcp_servers``) the way the runtime does.

:func:`open_server_tools` wants its exit stack opened and closed by one task; a test or
a fixture may set up and tear down in different tasks, so :func:`connected` opens the
server in an owner task of its own that also closes it, while the caller uses the tools
from any task.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import anyio

from corral.resources.kinds import McpServerSpec
from corral.tools.base import Tool
from corral.tools.mcp import open_server_tools
from corral.tools.sandbox.host import SandboxHost

SERVERS = Path(__file__).parent / "mcp_servers"
#: the calculator server: stdio, or streamable HTTP with ``http TOKEN [PORT]``
CALC = str(SERVERS / "calc_server.py")


@contextlib.asynccontextmanager
async def connected(
    name: str,
    spec: McpServerSpec,
    secrets: dict[str, str],
    workspace: Path | None = None,
    sandbox_host: SandboxHost | None = None,
) -> AsyncIterator[dict[str, Tool]]:
    """Open the server in an owner task that also closes it; yield its tools by ref."""
    ready: asyncio.Future[list[Tool]] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()

    async def owner() -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                tools = await open_server_tools(
                    name, spec, secrets, stack, workspace=workspace, sandbox_host=sandbox_host
                )
                ready.set_result(tools)
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    task = asyncio.get_running_loop().create_task(owner())
    try:
        tools = await ready
        yield {tool.ref: tool for tool in tools}
    finally:
        stop.set()
        with anyio.fail_after(10):
            await task
