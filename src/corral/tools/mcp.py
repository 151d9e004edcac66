"""The ``mcp`` tool kind: the tools of an MCP server, over stdio or streamable HTTP.

:func:`open_server_tools` connects to one ``McpServer`` with the official
``mcp`` SDK, performs the handshake and lists its tools, all within
``init_timeout_seconds``, and returns one :class:`McpTool` per server tool
(``ref = "mcp:SERVER/TOOL"``). The connection lives in the caller's
``AsyncExitStack``.

**One task rule.** The SDK's transports and session run anyio task groups and
cancel scopes; they must be entered and exited by the same task. The caller
must therefore open *and* close the exit stack in one task (for example the
worker task that owns the agent's tools); calling the tools from other tasks is
fine.

A stdio server runs in its own process group with the same locked-down
environment as an ``exec`` tool (:func:`corral.tools.exec.locked_environment`)
plus its declared env; its stderr is kept (the last few KiB) to explain a
failed start. Closing the stack closes its stdin, waits a short grace, then
kills the process group (the SDK's shutdown sequence), then whatever is left
of its :class:`~corral.tools.processes.ProcessTree` (daemons that left the group).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import mcp.types as mcp_types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from corral.core.errors import ConfigurationError, ToolError, ToolErrorCode
from corral.core.messages import ToolSpec
from corral.resources.kinds import McpServerSpec
from corral.tools.base import Tool, ToolContext
from corral.tools.exec import declared_environment, locked_environment, resolve_program
from corral.tools.http import auth_headers
from corral.tools.naming import model_tool_name
from corral.tools.processes import ProcessTree

__all__ = ["McpTool", "open_server_tools"]

#: how much of a stdio server's stderr is kept for error messages
STDERR_TAIL_BYTES = 8192
_MAX_LIST_PAGES = 100
_REASON_STDERR_CHARS = 2000
# The SDK adds these host variables to every stdio server's environment; they
# are overridden with neutral values so nothing of the host leaks.
_SDK_INHERITED = {"LOGNAME": "", "USER": "", "SHELL": "/bin/sh", "TERM": "dumb"}


class _StderrTail:
    """The last bytes a stdio server wrote to stderr."""

    def __init__(self) -> None:
        self.data = bytearray()

    async def drain(self, stream: anyio.abc.ByteReceiveStream) -> None:
        async with stream:
            try:
                async for chunk in stream:
                    self.data += chunk
                    del self.data[: max(0, len(self.data) - STDERR_TAIL_BYTES)]
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace").strip()[-_REASON_STDERR_CHARS:]


def _text_of(block: Any) -> str:
    """A content block as text: text as is, anything else as a short placeholder."""
    if isinstance(block, mcp_types.TextContent):
        return block.text
    if isinstance(block, mcp_types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, mcp_types.TextResourceContents):
            return resource.text
        return f"[resource {resource.uri}]"
    if isinstance(block, mcp_types.ResourceLink):
        return f"[resource link {block.uri}]"
    if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
        return f"[{block.type} {block.mime_type}]"
    return f"[{getattr(block, 'type', 'content')}]"


def _result_value(result: mcp_types.CallToolResult) -> Any:
    if result.structured_content is not None:
        return result.structured_content
    return "\n".join(_text_of(block) for block in result.content)


def _call_error(server: str, tool: str, exc: MCPError) -> ToolError:
    details = {"server": server, "tool": tool, "mcp_code": exc.code}
    if exc.code == mcp_types.REQUEST_TIMEOUT:
        return ToolError(ToolErrorCode.TIMEOUT, exc.message, retryable=True, details=details)
    if exc.code == mcp_types.CONNECTION_CLOSED:
        return ToolError(
            ToolErrorCode.UNAVAILABLE,
            f"MCP server {server!r} closed the connection",
            retryable=True,
            details=details,
        )
    return ToolError(ToolErrorCode.EXECUTION_FAILED, exc.message, details=details)


class McpTool(Tool):
    """One tool of a connected MCP server; valid while the server's exit stack is open."""

    def __init__(
        self,
        server_name: str,
        tool: mcp_types.Tool,
        session: ClientSession,
        spec: McpServerSpec,
    ) -> None:
        self.ref = f"mcp:{server_name}/{tool.name}"
        self.spec = ToolSpec(model_tool_name(self.ref), tool.description or "", tool.input_schema)
        self.idempotent = spec.idempotent
        self.server_name = server_name
        self.tool_name = tool.name
        self._session = session
        self._timeout = spec.call_timeout_seconds

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        server, tool = self.server_name, self.tool_name
        try:
            result = await self._session.call_tool(
                tool, arguments, read_timeout_seconds=self._timeout
            )
        except MCPError as exc:
            raise _call_error(server, tool, exc) from exc
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise ToolError(
                ToolErrorCode.UNAVAILABLE,
                f"MCP server {server!r} is not connected",
                retryable=True,
                details={"server": server, "tool": tool},
            ) from exc
        except (ValidationError, RuntimeError) as exc:
            # an invalid or unsupported result (for example an input request)
            raise ToolError(
                ToolErrorCode.EXECUTION_FAILED,
                f"MCP server {server!r} answered {tool!r} unusably: {exc}",
                details={"server": server, "tool": tool},
            ) from exc
        if result.is_error:
            text = "\n".join(_text_of(block) for block in result.content).strip()
            raise ToolError(
                ToolErrorCode.EXECUTION_FAILED,
                text or f"MCP tool {tool!r} reported an error",
                details={"server": server, "tool": tool},
            )
        return _result_value(result)


async def _open_stdio(
    stack: contextlib.AsyncExitStack,
    server_name: str,
    spec: McpServerSpec,
    secrets: Mapping[str, str],
    workspace: Path | None,
    stderr_tail: _StderrTail,
) -> tuple[Any, Any]:
    owner = f"McpServer {server_name!r}"
    program = resolve_program(spec.command[0], owner=owner)
    declared = declared_environment(spec.env, secrets, owner=owner)
    if workspace is None:
        workspace = Path(tempfile.mkdtemp(prefix=f"corral-mcp-{server_name}-"))
        stack.callback(shutil.rmtree, workspace, ignore_errors=True)
    await anyio.Path(workspace).mkdir(parents=True, exist_ok=True)
    tree = ProcessTree()
    env = tree.environment({**_SDK_INHERITED, **(await locked_environment(workspace, declared))})

    # stderr goes to a socket we drain into a bounded tail: no file grows, no thread waits.
    ours, theirs = socket.socketpair()
    with contextlib.ExitStack() as spawn_only:
        spawn_only.callback(theirs.close)
        try:
            stream = await anyio.abc.SocketStream.from_socket(ours)
        except BaseException:
            ours.close()
            raise
        task_group = await stack.enter_async_context(anyio.create_task_group())
        # registered after the task group: runs before it exits, once the server is gone
        stack.callback(task_group.cancel_scope.cancel)
        task_group.start_soon(stderr_tail.drain, stream)
        task_group.start_soon(tree.watch)
        # registered before the server starts: runs once the SDK has shut it down
        stack.push_async_callback(tree.end)
        errlog = spawn_only.enter_context(theirs.makefile("w"))
        params = StdioServerParameters(
            command=program, args=spec.command[1:], env=env, cwd=workspace
        )
        try:
            return await stack.enter_async_context(stdio_client(params, errlog=errlog))
        except OSError as exc:
            raise ConfigurationError(f"{owner}: cannot start {program!r}: {exc}") from exc


async def _open_http(
    stack: contextlib.AsyncExitStack,
    server_name: str,
    spec: McpServerSpec,
    secrets: Mapping[str, str],
) -> tuple[Any, Any]:
    owner = f"McpServer {server_name!r}"
    assert spec.url is not None
    headers = {**spec.headers, **auth_headers(spec.auth, secrets, owner=owner)}
    client = httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(
            30.0,
            connect=spec.init_timeout_seconds,
            read=max(300.0, spec.call_timeout_seconds),
        ),
        trust_env=False,
        follow_redirects=False,
    )
    await stack.enter_async_context(client)
    return await stack.enter_async_context(streamable_http_client(spec.url, http_client=client))


async def _list_tools(session: ClientSession) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_LIST_PAGES):
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def _unwrap(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _start_error(
    server_name: str, spec: McpServerSpec, exc: BaseException, stderr: str
) -> ToolError:
    where = spec.url if spec.transport == "streamable-http" else " ".join(spec.command)
    if isinstance(exc, TimeoutError):
        reason = f"did not complete initialize and tools/list within {spec.init_timeout_seconds}s"
    elif isinstance(exc, MCPError):
        reason = f"failed to start: {exc.message}"
    else:
        reason = f"failed to start: {type(exc).__name__}: {exc}"
    message = f"MCP server {server_name!r} ({where}) {reason}"
    if stderr:
        message = f"{message}; stderr: {stderr}"
    return ToolError(
        ToolErrorCode.UNAVAILABLE,
        message,
        retryable=True,
        details={"server": server_name, **({"stderr": stderr} if stderr else {})},
    )


async def open_server_tools(
    server_name: str,
    spec: McpServerSpec,
    secrets: Mapping[str, str],
    stack: contextlib.AsyncExitStack,
    *,
    workspace: Path | None = None,
) -> list[Tool]:
    """Connect to an MCP server inside ``stack`` and return its tools.

    ``workspace`` is the directory a stdio server runs in (``HOME`` and
    ``TMPDIR`` are created inside it); without one a temporary directory is
    used and removed when the stack closes.

    Raises ``ConfigurationError`` for a server that cannot be set up (program
    not found, secret missing) and ``ToolError(unavailable, retryable=True)``
    when it does not start, handshake and list its tools within
    ``spec.init_timeout_seconds``. On failure everything opened so far,
    including the server process, is closed before the error propagates.

    ``stack`` must be closed by the task that called this function (see the
    module docstring).
    """
    stderr_tail = _StderrTail()
    try:
        async with contextlib.AsyncExitStack() as inner:
            if spec.transport == "stdio":
                read, write = await _open_stdio(
                    inner, server_name, spec, secrets, workspace, stderr_tail
                )
            else:
                read, write = await _open_http(inner, server_name, spec, secrets)
            session = await inner.enter_async_context(ClientSession(read, write))
            with anyio.fail_after(spec.init_timeout_seconds):
                await session.initialize()
                listed = await _list_tools(session)
            await stack.enter_async_context(inner.pop_all())
    except (ConfigurationError, ToolError):
        raise
    except Exception as exc:  # converted at the SDK boundary; cancellation passes
        cause = _unwrap(exc)
        if isinstance(cause, ConfigurationError | ToolError):
            raise cause from exc
        raise _start_error(server_name, spec, cause, stderr_tail.text()) from exc
    return [McpTool(server_name, tool, session, spec) for tool in listed]
