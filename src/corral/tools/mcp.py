"""The ``mcp`` tool kind: the tools of an MCP server, over stdio or streamable HTTP.

:func:`open_server_tools` connects to one ``McpServer`` with the official
``mcp`` SDK, performs the handshake and lists its tools, all within
``init_timeout_seconds``, and returns one :class:`McpTool` per server tool
(``ref = "mcp:SERVER/TOOL"``). Each call's ``_meta`` tells the server its idempotency key,
run and call (``corral/idempotency_key``, ``corral/run_id``, ``corral/tool_call_id``), as an
``http`` tool's headers do. Tools the server marks as needing task-augmented
execution (``execution.taskSupport: required``, MCP tasks) are left out, with a
log line: a plain call of one always fails. The connection lives in the
caller's ``AsyncExitStack``.

**One task rule.** The SDK's transports and session run anyio task groups and
cancel scopes; they must be entered and exited by the same task. The caller
must therefore open *and* close the exit stack in one task (for example the
worker task that owns the agent's tools); calling the tools from other tasks is
fine. Inside, each session is opened and closed by a task of its own
(:class:`McpConnection`), in a task group that lives in the caller's stack.

**Lost sessions.** A stdio server whose process ends (its stdout closes), or a
streamable-HTTP server that no longer knows the session (it answers 404, or 400
naming the session, to a request carrying the session id: it restarted), has
lost its session. The next call opens a new one (one open at a time; after a
failed open, calls fail fast as ``unavailable`` until a backoff with jitter has
passed). A call whose session was lost while it was in flight may or may not
have run: it is made again on the new session only when the tool is idempotent
or the call never reached the server (it refused the session, or the connection
for the call could not be made); otherwise it fails as ``unavailable``, retryable.

A stdio server runs in its own process group with the same locked-down
environment as an ``exec`` tool (:func:`corral.tools.exec.locked_environment`)
plus its declared env; its stderr is kept (the last few KiB) to explain a
failed start. Closing the stack closes its stdin, waits a short grace, then
kills the process group (the SDK's shutdown sequence), then whatever is left
of its :class:`~corral.tools.processes.ProcessTree` (daemons that left the group).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self, cast

import anyio
import anyio.abc
import httpx2
import mcp.types as mcp_types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from corral.core.backoff import jittered_backoff
from corral.core.errors import ConfigurationError, ToolError, ToolErrorCode, sole_error
from corral.core.messages import ToolSpec
from corral.resources.kinds import McpServerSpec
from corral.tools.base import Tool, ToolContext
from corral.tools.exec import (
    SAFE_PATH,
    declared_environment,
    locked_environment,
    resolve_program,
)
from corral.tools.http import auth_headers
from corral.tools.naming import model_tool_name
from corral.tools.processes import ProcessTree
from corral.tools.sandbox.host import SandboxHost
from corral.tools.sandbox.policy import resolve_isolation
from corral.tools.sandbox.setid import strip_setid_bits

__all__ = ["McpConnection", "McpTool", "open_server_tools"]

log = logging.getLogger(__name__)

#: how much of a stdio server's stderr is kept for error messages
STDERR_TAIL_BYTES = 8192
_MAX_LIST_PAGES = 100
_REASON_STDERR_CHARS = 2000
# The SDK adds these host variables to every stdio server's environment; they
# are overridden with neutral values so nothing of the host leaks.
_SDK_INHERITED = {"LOGNAME": "", "USER": "", "SHELL": "/bin/sh", "TERM": "dumb"}
#: backoff between failed re-opens of a lost session (full jitter)
REOPEN_BACKOFF_SECONDS = 0.5
REOPEN_MAX_BACKOFF_SECONDS = 30.0
_SESSION_HEADER = "mcp-session-id"
_REFUSAL_MAX_BYTES = 4096


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


def _lost_error(server: str, tool: str) -> ToolError:
    return ToolError(
        ToolErrorCode.UNAVAILABLE,
        f"MCP server {server!r} lost its session during the call, which may or may not have "
        "run (the tool is not idempotent, so it was not made again)",
        retryable=True,
        details={"server": server, "tool": tool},
    )


def _call_meta(ctx: ToolContext, *, local: bool) -> mcp_types.RequestParamsMeta:
    """What a server learns of each call, in its request's ``_meta`` (an ``http`` tool's
    headers, an ``exec`` tool's environment): the idempotency key, the run and the call.

    A ``local`` (stdio) server also gets the call's planted variables (an agent with
    links: ``CORRAL_URL`` and ``CORRAL_AGENT_TOKEN`` as ``corral/url`` and
    ``corral/agent_token``): here, not in its environment, since one server process
    serves many runs and each call carries a fresh token of its own run. A remote
    server never gets them: the token is for programs of this deployment."""
    meta = {
        "corral/idempotency_key": ctx.idempotency_key,
        "corral/run_id": ctx.run_id,
        "corral/tool_call_id": ctx.call_id,
    }
    if local:
        for key, value in ctx.environment.items():
            meta[f"corral/{key.removeprefix('CORRAL_').lower()}"] = value
    # an open map (PEP 728 extra items), which mypy does not know yet
    return cast(mcp_types.RequestParamsMeta, meta)


class McpTool(Tool):
    """One tool of a connected MCP server; valid while the server's exit stack is open."""

    def __init__(
        self,
        server_name: str,
        tool: mcp_types.Tool,
        connection: McpConnection,
        spec: McpServerSpec,
    ) -> None:
        self.ref = f"mcp:{server_name}/{tool.name}"
        self.spec = ToolSpec(model_tool_name(self.ref), tool.description or "", tool.input_schema)
        self.idempotent = spec.idempotent
        self.server_name = server_name
        self.tool_name = tool.name
        #: the server's connection, shared by all its tools
        self.connection = connection
        self._timeout = spec.call_timeout_seconds
        self._local = spec.transport == "stdio"
        self.plants_environment = self._local  # (in the call's _meta: see above)

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        server, tool = self.server_name, self.tool_name
        try:
            result = await self.connection.call(
                tool,
                arguments,
                _call_meta(ctx, local=self._local),
                read_timeout=self._timeout,
                idempotent=self.idempotent,
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


# --------------------------------------------------------------------------- sessions


@dataclass(eq=False)
class _Session:
    """One open session of a server, held by a task of its own until ``close`` is set."""

    client: ClientSession | None = None
    tools: list[mcp_types.Tool] = field(default_factory=list[mcp_types.Tool])
    lost: anyio.Event = field(default_factory=anyio.Event)
    close: anyio.Event = field(default_factory=anyio.Event)
    #: the server no longer knew the session: what it answered never ran
    refused: bool = False
    #: whether the server's process still runs (stdio; an HTTP server cannot be seen)
    running: Callable[[], bool] = lambda: True

    def mark_lost(self, *, refused: bool = False) -> None:
        """The session cannot be used any more; its task closes it."""
        self.refused = self.refused or refused
        self.lost.set()
        self.close.set()


@dataclass(eq=False)
class _Opening:
    """One attempt to open a session, awaited by every call that needs it."""

    done: anyio.Event = field(default_factory=anyio.Event)
    session: _Session | None = None
    error: Exception | None = None


class _WatchedReads:
    """The transport's read stream, reporting its end (a stdio server's process ended)."""

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    @property
    def last_context(self) -> Any:  # the SDK reads it when the stream has one
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _needs_tasks(tool: mcp_types.Tool) -> bool:
    return tool.execution is not None and tool.execution.task_support == "required"


class McpConnection:
    """The session with one MCP server, opened again when it is lost (see the module docstring).

    Every session is opened and closed by a task of its own in ``group``, so a
    call from any task may cause a new one without owning it.
    """

    def __init__(
        self,
        server_name: str,
        spec: McpServerSpec,
        secrets: Mapping[str, str],
        workspace: Path,
        group: anyio.abc.TaskGroup,
        sandbox_host: SandboxHost | None = None,
    ) -> None:
        self.server_name = server_name
        self.spec = spec
        self._secrets = secrets
        self._workspace = workspace
        self._sandbox_host = sandbox_host
        self._group = group
        self._session: _Session | None = None
        self._opening: _Opening | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._last_error: Exception | None = None
        self._closing = False
        self._skips_logged = False

    async def session(self) -> _Session:
        """The live session: the current one, or a new one if it was lost.

        Raises the open's error (``ToolError(unavailable)``, ``ConfigurationError``);
        after a failed open, the same error until the backoff has passed.
        """
        current = self._session
        if current is not None and not current.lost.is_set():
            return current
        if self._closing:
            raise self._unavailable("is closing")
        opening = self._opening
        if opening is None:
            if self._last_error is not None and anyio.current_time() < self._retry_at:
                raise self._last_error
            opening = self._opening = _Opening()
            if current is not None:
                log.info("MCP server %r lost its session; opening a new one", self.server_name)
            self._group.start_soon(self._hold, opening)
        await opening.done.wait()
        if opening.session is None:
            assert opening.error is not None
            raise opening.error
        return opening.session

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        meta: mcp_types.RequestParamsMeta,
        *,
        read_timeout: float,
        idempotent: bool,
    ) -> mcp_types.CallToolResult:
        """Call ``tool``; once more on a new session when the one it used was lost and the
        call either never ran there (refused) or may run twice (idempotent)."""
        session = await self.session()
        if not session.running():  # it died before this call: nothing of it can have run
            session.mark_lost(refused=True)
            session = await self.session()
        try:
            return await self._call(session, tool, arguments, meta, read_timeout)
        except (MCPError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            if not self._lost(session, exc):
                raise
            if not (session.refused or idempotent):
                raise _lost_error(self.server_name, tool) from exc
        session = await self.session()
        try:
            return await self._call(session, tool, arguments, meta, read_timeout)
        except (MCPError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            if not self._lost(session, exc):
                raise
            raise self._unavailable("lost its session again") from exc

    @staticmethod
    async def _call(
        session: _Session,
        tool: str,
        arguments: dict[str, Any],
        meta: mcp_types.RequestParamsMeta,
        read_timeout: float,
    ) -> mcp_types.CallToolResult:
        assert session.client is not None
        return await session.client.call_tool(
            tool, arguments, read_timeout_seconds=read_timeout, meta=meta
        )

    @staticmethod
    def _lost(session: _Session, exc: Exception) -> bool:
        """Whether ``exc`` means the session is gone (and mark it so)."""
        closed = not isinstance(exc, MCPError) or exc.code == mcp_types.CONNECTION_CLOSED
        if closed:
            session.mark_lost()
        return session.lost.is_set()

    async def wait_lost(self) -> None:
        """Return once the latest session is lost (at once if it is already, or none opened)."""
        if self._session is not None:
            await self._session.lost.wait()

    def close(self) -> None:
        """Let the sessions close (each in its own task); no new one opens."""
        self._closing = True
        if self._session is not None:
            self._session.close.set()

    def _unavailable(self, what: str) -> ToolError:
        return ToolError(
            ToolErrorCode.UNAVAILABLE,
            f"MCP server {self.server_name!r} {what}",
            retryable=True,
            details={"server": self.server_name},
        )

    # ----------------------------------------------------------------- the session's task

    async def _hold(self, opening: _Opening) -> None:
        """Open a session, hand it over, and close it once it is lost or closed."""
        session = _Session()
        stderr_tail = _StderrTail()
        try:
            async with contextlib.AsyncExitStack() as inner:
                read, write = await self._transport(inner, session, stderr_tail)
                client = await inner.enter_async_context(ClientSession(read, write))
                with anyio.fail_after(self.spec.init_timeout_seconds):
                    await client.initialize()
                    listed = await _list_tools(client)
                session.client = client
                session.tools = self._offered(listed)
                self._opened(opening, session)
                await session.close.wait()
        except Exception as exc:  # noqa: BLE001 - the SDK boundary; cancellation passes
            if opening.done.is_set():  # it broke while held: the next call opens another
                log.debug("MCP server %r: session ended: %r", self.server_name, exc)
                session.mark_lost()
                return
            self._failed(opening, self._start_error(exc, stderr_tail.text()))
        finally:
            if not opening.done.is_set():  # cancelled while opening
                self._failed(opening, self._unavailable("was closed while it was opening"))

    async def _transport(
        self,
        inner: contextlib.AsyncExitStack,
        session: _Session,
        stderr_tail: _StderrTail,
    ) -> tuple[Any, Any]:
        name, spec, secrets = self.server_name, self.spec, self._secrets
        if spec.transport == "stdio":
            read, write, tree = await _open_stdio(
                inner, name, spec, secrets, self._workspace, stderr_tail, self._sandbox_host
            )
            session.running = tree.running
            return _WatchedReads(read, session.mark_lost), write
        return await _open_http(
            inner, name, spec, secrets, on_refused=lambda: session.mark_lost(refused=True)
        )

    def _offered(self, listed: list[mcp_types.Tool]) -> list[mcp_types.Tool]:
        skipped = [t.name for t in listed if _needs_tasks(t)]
        if skipped and not self._skips_logged:
            self._skips_logged = True
            log.warning(
                "MCP server %r: not offering %s: the server runs them only as MCP tasks "
                "(execution.taskSupport: required), which Corral does not support",
                self.server_name,
                ", ".join(skipped),
            )
        return [t for t in listed if not _needs_tasks(t)]

    def _opened(self, opening: _Opening, session: _Session) -> None:
        self._session = opening.session = session
        self._opening = None
        self._failures = 0
        self._last_error = None
        if self._closing:
            session.close.set()
        opening.done.set()

    def _failed(self, opening: _Opening, error: Exception) -> None:
        self._opening = None
        self._failures += 1
        self._retry_at = anyio.current_time() + jittered_backoff(
            self._failures, REOPEN_BACKOFF_SECONDS, REOPEN_MAX_BACKOFF_SECONDS
        )
        if self._session is not None and not isinstance(error, ToolError):
            # a lost session's server that can no longer start: a tool error to the model
            error = self._unavailable(f"cannot be reopened: {error}")
        self._last_error = opening.error = error
        opening.done.set()

    def _start_error(self, exc: Exception, stderr: str) -> Exception:
        cause = sole_error(exc)
        if isinstance(cause, ConfigurationError | ToolError):
            return cause
        return _start_error(self.server_name, self.spec, cause, stderr)


async def _open_stdio(
    stack: contextlib.AsyncExitStack,
    server_name: str,
    spec: McpServerSpec,
    secrets: Mapping[str, str],
    workspace: Path,
    stderr_tail: _StderrTail,
    sandbox_host: SandboxHost | None,
) -> tuple[Any, Any, ProcessTree]:
    owner = f"McpServer {server_name!r}"
    host = sandbox_host if sandbox_host is not None else SandboxHost.from_env()
    sandboxed = spec.isolation.mode != "none" and host.probe().works
    program = resolve_program(
        spec.command[0], owner=owner, prefer_path=SAFE_PATH if sandboxed else None
    )
    declared = declared_environment(spec.env, secrets, owner=owner)
    argv = [program, *spec.command[1:]]
    isolation = resolve_isolation(spec.isolation, argv, host, owner=owner)
    await anyio.Path(workspace).mkdir(parents=True, exist_ok=True)
    tree = ProcessTree()
    view = isolation.view(workspace)
    locked = await locked_environment(workspace, declared, view=view)
    # raises isolation_unavailable (the open fails closed) where the sandbox cannot run
    launch = isolation.launch(argv, workspace, "", {**_SDK_INHERITED, **locked})
    # registered first: runs last, once the processes are gone
    stack.push_async_callback(launch.aclose)
    # then nothing the server left in its workspace may grant privilege
    stack.push_async_callback(anyio.to_thread.run_sync, strip_setid_bits, workspace)
    env = tree.environment(launch.env)

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
            command=launch.argv[0], args=launch.argv[1:], env=env, cwd=launch.cwd
        )
        try:
            read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog))
        except OSError as exc:
            raise ConfigurationError(f"{owner}: cannot start {program!r}: {exc}") from exc
    return read, write, tree


async def _refuses_session(response: httpx2.Response) -> bool:
    """Whether the server answered a request of a session it no longer knows.

    The MCP spec says 404; some servers answer 400 naming the session.
    """
    if _SESSION_HEADER not in response.request.headers:
        return False
    if response.status_code == 404:
        return True
    length = response.headers.get("content-length", "")
    if response.status_code != 400 or not length.isdigit() or int(length) > _REFUSAL_MAX_BYTES:
        return False  # only a short error body is worth reading (a server's word against us)
    body = await response.aread()  # kept: the SDK reads it again
    return b"session" in body.lower()


class _RefusalWatch(httpx2.AsyncBaseTransport):
    """A transport that reports a request of a session whose connection could not be made:
    nothing of it reached the server (the refused, unreachable or unresolvable server of
    a ``ConnectError``; one that broke after it was sent is another error)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, on_refused: Callable[[], None]) -> None:
        self._inner = inner
        self._on_refused = on_refused

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            return await self._inner.handle_async_request(request)
        except httpx2.ConnectError:
            if _SESSION_HEADER in request.headers:
                self._on_refused()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()


async def _open_http(
    stack: contextlib.AsyncExitStack,
    server_name: str,
    spec: McpServerSpec,
    secrets: Mapping[str, str],
    *,
    on_refused: Callable[[], None],
) -> tuple[Any, Any]:
    owner = f"McpServer {server_name!r}"
    assert spec.url is not None
    headers = {**spec.headers, **auth_headers(spec.auth, secrets, owner=owner)}

    async def watch(response: httpx2.Response) -> None:
        if await _refuses_session(response):
            on_refused()

    client = httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(
            30.0,
            connect=spec.init_timeout_seconds,
            read=max(300.0, spec.call_timeout_seconds),
        ),
        trust_env=False,
        follow_redirects=False,
        event_hooks={"response": [watch]},
        transport=_RefusalWatch(httpx2.AsyncHTTPTransport(trust_env=False), on_refused),
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
    sandbox_host: SandboxHost | None = None,
) -> list[Tool]:
    """Connect to an MCP server inside ``stack`` and return its tools.

    ``workspace`` is the directory a stdio server runs in (``HOME`` and
    ``TMPDIR`` are created inside it); without one a temporary directory is
    used and removed when the stack closes. A stdio server runs under its
    ``isolation`` (:mod:`corral.tools.sandbox`) on ``sandbox_host`` (default: read
    from the environment), at ``/workspace`` when sandboxed.

    Raises ``ConfigurationError`` for a server that cannot be set up (program
    not found, secret missing) and ``ToolError(unavailable, retryable=True)``
    when it does not start, handshake and list its tools within
    ``spec.init_timeout_seconds``. On failure everything opened so far,
    including the server process, is closed before the error propagates.

    ``stack`` must be closed by the task that called this function (see the
    module docstring).
    """
    if workspace is None:
        workspace = Path(tempfile.mkdtemp(prefix=f"corral-mcp-{server_name}-"))
        stack.callback(shutil.rmtree, workspace, ignore_errors=True)
    error: ConfigurationError | ToolError | None = None
    async with contextlib.AsyncExitStack() as inner:
        group = await inner.enter_async_context(anyio.create_task_group())
        connection = McpConnection(server_name, spec, secrets, workspace, group, sandbox_host)
        inner.callback(connection.close)  # runs before the group exits: its sessions close
        try:
            session = await connection.session()
        except (ConfigurationError, ToolError) as exc:
            error = exc  # raised once the group has exited (else it comes wrapped in a group)
        else:
            await stack.enter_async_context(inner.pop_all())
    if error is not None:
        raise error
    return [McpTool(server_name, tool, connection, spec) for tool in session.tools]
