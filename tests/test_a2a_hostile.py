"""Hostile callers of the A2A server and hostile remotes of the ``a2a`` tool.

The server side runs a real ``corral serve`` (SQLite) and speaks raw JSON-RPC, as a
careless or malicious client would; the tool side calls the hand-written remotes of
tests/a2a_remotes.py. Expected everywhere: a clear error with a stable code, no
traceback in the log, nothing leaked, and the process serving on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from corral.core.tokens import Role
from server_harness import LiveServer, apply, resources

NS = "alpha"
V1 = {"A2A-Version": "1.0"}


# ----------------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("home"), workers=2) as server:
        with server.client(server.mint(NS, Role.ADMIN)) as admin:
            apply(admin, resources("greeter", ["{text: hello there}"] * 20))
        yield server


def rpc(method: str, params: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()


def message(text: str, message_id: str, **fields: str) -> dict[str, Any]:
    return {
        "message": {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": text}]}
        | fields
    }


def post(live: LiveServer, body: bytes, agent: str = "greeter") -> httpx.Response:
    token = live.mint(NS, Role.OPERATOR)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", **V1}
    return httpx.post(f"{live.url}/a2a/{NS}/{agent}", content=body, headers=headers, timeout=60)


def test_a_message_id_with_nul_is_invalid_params_as_the_apis_idempotency_key(
    live: LiveServer,
) -> None:
    # PostgreSQL cannot store NUL in text: the key would fail the store, not the caller
    response = post(live, rpc("SendMessage", message("hi", "a\x00b")))

    assert response.status_code == 200
    error = response.json()["error"]
    assert error["code"] == -32602 and "messageId" in error["message"], error
    tasks = live.client(live.mint(NS, Role.VIEWER)).get("/v1/tasks").json()["items"]
    assert not any("\x00" in (t["idempotency_key"] or "") for t in tasks)
