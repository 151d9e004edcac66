"""A small MCP server for the tests, written with the SDK.

python calc_server.py            serve over stdio
python calc_server.py http TOKEN serve streamable HTTP on 127.0.0.1 (a free port,
                                 printed on stdout) and demand ``Bearer TOKEN``
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("calc")


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
def daemon() -> int:
    """Start a daemon (a double-forked setsid process that ignores SIGTERM); its pid."""
    probe = os.path.join(os.path.dirname(__file__), "..", "tool_programs", "probe.py")
    subprocess.run([sys.executable, probe], input='{"mode": "daemon-exit"}', text=True, check=True)
    with open("daemon.txt") as f:
        return int(f.read())


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


def serve_http(token: str) -> None:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # connections made before uvicorn is up wait in the backlog, not refused
    print(sock.getsockname()[1], flush=True)
    app = _require_bearer(server.streamable_http_app(), token)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "http":
        serve_http(sys.argv[2])
    else:
        server.run()
