"""MCP servers that die or restart under a running ``corral serve``: the next run's call works.

``corral serve`` runs in a thread of this process (:class:`server_harness.LiveServer`)
and keeps one live agent, with its MCP session, across runs. Each run's scripted
model calls the server's ``pid`` and ``add`` tools (neither idempotent). Between two
runs the test kills the stdio server's process, or kills the streamable-HTTP server
and starts a new one on the same port (which no longer knows the session id).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from processes import alive
from server_harness import apply, wait_for

CALC = Path(__file__).parent / "mcp_servers" / "calc_server.py"
TOKEN = "reconnect-token"


def resources(agent: str, mcp_spec: str) -> str:
    server = f"{agent}-calc"
    calls = (
        f"[{{name: {server}__pid, arguments: {{}}}}, "
        f"{{name: {server}__add, arguments: {{a: 2, b: 3}}}}]"
    )
    return f"""
apiVersion: corral/v1
kind: McpServer
metadata: {{name: {server}}}
spec: {mcp_spec}
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: {agent}-model}}
spec:
  provider: scripted
  script:
    - {{tool_calls: {calls}}}
    - {{text: done}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: {agent}}}
spec:
  model: {agent}-model
  tools: ["mcp:{server}/*"]
"""


def run(client: httpx.Client, agent: str) -> tuple[int, Any]:
    """One run of ``agent``: the MCP server's pid and the result of add."""
    response = client.post(f"/v1/agents/{agent}/prompt", json={"input": "go"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["state"] == "succeeded", body["error"]
    task = client.get(f"/v1/tasks/{body['id']}").json()
    pid, added = [m["content"] for m in task["messages"] if m["role"] == "tool"]
    return int(pid), added


def test_a_killed_stdio_server_is_started_again_for_the_next_run(client: httpx.Client) -> None:
    apply(
        client,
        resources(
            "stdio",
            # unsandboxed: the test kills the server by the host pid it reports
            f'{{transport: stdio, command: ["{sys.executable}", "{CALC}"], '
            "isolation: {mode: none}}",
        ),
    )
    first, added = run(client, "stdio")
    assert added == '{"result": 5}'

    os.kill(first, signal.SIGKILL)
    wait_for(lambda: not alive(first), message="the MCP server to die")

    second, added = run(client, "stdio")
    assert added == '{"result": 5}'
    assert second != first and alive(second)


def start_http_server(port: int = 0) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen(
        [sys.executable, str(CALC), "http", TOKEN, str(port)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    return process, int(process.stdout.readline())


def test_a_restarted_http_server_gets_a_new_session_for_the_next_run(
    client: httpx.Client,
) -> None:
    process, port = start_http_server()
    try:
        spec = (
            f"{{transport: streamable-http, url: 'http://127.0.0.1:{port}/mcp', "
            f"headers: {{Authorization: 'Bearer {TOKEN}'}}}}"
        )
        apply(client, resources("http", spec))
        first, added = run(client, "http")
        assert added == '{"result": 5}'

        process.kill()
        process.wait(10)
        process, _ = start_http_server(port)

        second, added = run(client, "http")  # the old session id: 404 from the new server
        assert added == '{"result": 5}'
        assert second == process.pid != first
    finally:
        process.kill()
        process.wait(10)
