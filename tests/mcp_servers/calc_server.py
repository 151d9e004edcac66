"""A small MCP server for the tests, written with the SDK.

python calc_server.py                 serve over stdio
python calc_server.py http TOKEN [PORT] serve streamable HTTP on 127.0.0.1 (PORT, or a free
                                        port; printed on stdout) and demand ``Bearer TOKEN``
python calc_server.py http400 TOKEN [PORT] the same, answering an unknown session id with
                                        400 as the TypeScript SDK's examples do (not 404)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import Tool, ToolExecution

#: tools this server declares as needing task-augmented execution (MCP tasks, 2025-11-25)
TASK_ONLY = {"long_job"}


class CalcServer(MCPServer):
    """The SDK's server, declaring ``execution.taskSupport: required`` for :data:`TASK_ONLY`."""

    async def list_tools(self) -> list[Tool]:
        tools = await super().list_tools()
        required = ToolExecution(task_support="required")
        return [
            t.model_copy(update={"execution": required}) if t.name in TASK_ONLY else t
            for t in tools
        ]


server = CalcServer("calc")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool(structured_output=False)
def shout(text: str) -> str:
    """Upper-case a text."""
    return text.upper()


@server.tool(structured_output=False)
def environment() -> str:
    """The server's environment, one NAME=value per line."""
    return "\n".join(f"{k}={v}" for k, v in sorted(os.environ.items()))


@server.tool()
def divide(a: float, b: float) -> float:
    """Divide a by b; fails for b = 0."""
    if b == 0:
        raise ToolError("division by zero is not allowed")
    return a / b


@server.tool(structured_output=False)
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await anyio.sleep(seconds)
    return "awake"


@server.tool()
def echo(text: str, ctx: Context) -> dict[str, Any]:
    """The text, and what the request's ``_meta`` said of the call."""
    meta = ctx.request_context.meta or {}
    return {"text": text, "meta": {k: v for k, v in meta.items() if k.startswith("corral/")}}


@server.tool(structured_output=False)
def flood(size: int) -> str:
    """``size`` bytes of output."""
    return "x" * size


@server.tool()
def fail(reason: str) -> None:
    """Always fails, saying ``reason``."""
    raise ToolError(reason)


@server.tool()
def daemon() -> int:
    """Start a daemon (a double-forked setsid process that ignores SIGTERM); its pid."""
    probe = os.path.join(os.path.dirname(__file__), "..", "tool_programs", "probe.py")
    subprocess.run([sys.executable, probe], input='{"mode": "daemon-exit"}', text=True, check=True)
    with open("daemon.txt") as f:
        return int(f.read())


@server.tool(structured_output=False)
def pid() -> str:
    """The server's process id (a test kills the process by it)."""
    return str(os.getpid())


@server.tool(structured_output=False)
def long_job() -> str:
    """A job that only runs as an MCP task (a plain call is what a client must not make)."""
    return "a task-only tool ran without a task"


def _require_bearer(app: Any, token: str) -> Any:
    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != f"Bearer {token}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
        await app(scope, receive, send)

    return guarded


def _unknown_session_is_400(app: Any) -> Any:
    """Answer 400 "No valid session ID provided" where the SDK answers 404 "Session not found"."""
    body = b'{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session ID provided"},"id":null}'

    async def app400(scope: Any, receive: Any, send: Any) -> None:
        refused = False

        async def rewrite(message: Any) -> None:
            nonlocal refused
            if message["type"] == "http.response.start" and message["status"] == 404:
                refused = True
                headers = [(b"content-type", b"application/json")]
                headers.append((b"content-length", str(len(body)).encode()))
                await send({"type": "http.response.start", "status": 400, "headers": headers})
            elif message["type"] == "http.response.body" and refused:
                if not message.get("more_body"):
                    await send({"type": "http.response.body", "body": body})
            else:
                await send(message)

        await app(scope, receive, rewrite)

    return app400


def serve_http(token: str, port: int = 0, *, status_400: bool = False) -> None:
    import uvicorn

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart takes the same port
    sock.bind(("127.0.0.1", port))
    sock.listen(64)  # connections made before uvicorn is up wait in the backlog, not refused
    print(sock.getsockname()[1], flush=True)
    app = server.streamable_http_app()
    if status_400:
        app = _unknown_session_is_400(app)
    app = _require_bearer(app, token)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("http", "http400"):
        port = int(sys.argv[3]) if len(sys.argv) > 3 else 0
        serve_http(sys.argv[2], port, status_400=sys.argv[1] == "http400")
    else:
        server.run()
