"""A tiny MCP server over stdio, standard library only (it runs in the sandbox's python3).

It speaks just enough of the protocol for a client: initialize, tools/list, tools/call and
ping, one JSON-RPC message per line. Its one tool, `shout`, upper-cases a text.
"""

import json
import sys

TOOLS = [
    {
        "name": "shout",
        "description": "Upper-case a text.",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    }
]


def answer(request):
    method = request.get("method")
    params = request.get("params") or {}
    if method == "initialize":
        return {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "notes", "version": "1.0"},
        }
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call" and params.get("name") == "shout":
        text = str((params.get("arguments") or {}).get("text", ""))
        return {"content": [{"type": "text", "text": text.upper() + "!"}], "isError": False}
    if method == "ping":
        return {}
    raise LookupError(method)


def main():
    for line in sys.stdin:
        request = json.loads(line)
        if "id" not in request:  # a notification (notifications/initialized): no answer
            continue
        try:
            reply = {"jsonrpc": "2.0", "id": request["id"], "result": answer(request)}
        except LookupError as exc:
            error = {"code": -32601, "message": f"unknown method or tool: {exc}"}
            reply = {"jsonrpc": "2.0", "id": request["id"], "error": error}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
