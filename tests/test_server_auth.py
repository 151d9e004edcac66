"""Roles and namespaces: every /v1 endpoint, every role, a foreign namespace, no token.

viewer reads; operator also submits, cancels, decides approvals, prompts and deletes
sessions; admin also applies and deletes resources and manages tokens. A token of
another namespace gets 404 for this namespace's objects and sees none of them in
lists. The matrix is checked against /openapi.json, so a new endpoint cannot be
added without a row here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from corral.core.tokens import Role
from server_harness import LiveServer, apply, echo_turn, resources

NS = "alpha"


@dataclass(frozen=True)
class Row:
    """One endpoint: who may call it, and whether it names an object of the namespace."""

    method: str
    path: str
    role: Role
    body: dict[str, Any] | None = None
    names_object: bool = True


SECRET_DOC = {
    "apiVersion": "corral/v1",
    "kind": "Secret",
    "metadata": {"name": "extra"},
    "spec": {"value": "v-secret-value"},
}

A2A = "/a2a/{namespace}/{agent}"


def rpc(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """A JSON-RPC request body (A2A 0.3 method names: no A2A-Version header needed)."""
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


MATRIX = [
    Row("GET", "/v1/resources", Role.VIEWER, names_object=False),
    Row("POST", "/v1/resources", Role.ADMIN, SECRET_DOC, names_object=False),
    Row("GET", "/v1/resources/{kind}/{name}", Role.VIEWER),
    Row("DELETE", "/v1/resources/{kind}/{name}", Role.ADMIN),
    Row(
        "POST",
        "/v1/resources/delete",
        Role.ADMIN,
        {"items": [{"kind": "secret", "name": "{together}"}]},
    ),
    Row("GET", "/v1/tasks", Role.VIEWER, names_object=False),
    Row(
        "POST",
        "/v1/tasks",
        Role.OPERATOR,
        {"agent": "helper", "input": "x", "delay_seconds": 3600},
        names_object=False,
    ),
    Row("GET", "/v1/tasks/{task_id}", Role.VIEWER),
    Row("GET", "/v1/tasks/{task_id}/children", Role.VIEWER),
    Row("POST", "/v1/tasks/{task_id}/cancel", Role.OPERATOR),
    Row("GET", "/v1/tasks/{task_id}/messages", Role.VIEWER),
    Row("POST", "/v1/systems/{name}/tasks", Role.OPERATOR, {"input": "x"}),
    Row("GET", "/v1/runs/{run_id}/events", Role.VIEWER),
    Row("GET", "/v1/approvals", Role.VIEWER, names_object=False),
    Row("GET", "/v1/approvals/{approval_id}", Role.VIEWER),
    Row("POST", "/v1/approvals/{approval_id}/approve", Role.OPERATOR, {"reason": "ok"}),
    Row("POST", "/v1/approvals/{approval_id}/reject", Role.OPERATOR, {"reason": "no"}),
    Row("GET", "/v1/sessions", Role.VIEWER, names_object=False),
    Row("GET", "/v1/sessions/{session_id}", Role.VIEWER),
    Row("GET", "/v1/sessions/{session_id}/messages", Role.VIEWER),
    Row("DELETE", "/v1/sessions/{session_id}", Role.OPERATOR),
    Row("GET", "/v1/memories/{name}", Role.VIEWER),
    Row("GET", "/v1/memories/{name}/entries", Role.VIEWER),
    Row("POST", "/v1/memories/{name}/entries", Role.OPERATOR, {"text": "t", "key": "new"}),
    Row("GET", "/v1/memories/{name}/entries/{key}", Role.VIEWER),
    Row("DELETE", "/v1/memories/{name}/entries/{key}", Role.OPERATOR),
    Row("POST", "/v1/memories/{name}/search", Role.VIEWER, {"query": "entry"}),
    Row(
        "POST", "/v1/memories/{name}/ingest", Role.OPERATOR, {"text": "a. b.", "key_prefix": "doc"}
    ),
    Row("POST", "/v1/agents/{name}/prompt", Role.OPERATOR, {"input": "x", "timeout_seconds": 5}),
    Row(
        "POST",
        "/v1/agents/{name}/prompt-object",
        Role.OPERATOR,
        {"input": "x", "schema": {"type": "object"}, "timeout_seconds": 5},
    ),
    Row("GET", "/v1/tokens", Role.ADMIN, names_object=False),
    Row("GET", "/v1/whoami", Role.VIEWER, names_object=False),
    Row("GET", "/v1/capabilities", Role.VIEWER, names_object=False),
    Row("POST", "/v1/tokens", Role.ADMIN, {"role": "viewer"}, names_object=False),
    Row("GET", "/v1/tokens/{token_id}", Role.ADMIN),
    Row("POST", "/v1/tokens/{token_id}/revoke", Role.ADMIN),
    # A2A (server/routes_a2a.py): the card, and JSON-RPC with the role of each method
    Row("GET", A2A + "/.well-known/agent-card.json", Role.VIEWER),
    Row("POST", A2A, Role.VIEWER, rpc("tasks/get", {"id": "{task_id}"})),
    Row(
        "POST",
        A2A,
        Role.OPERATOR,
        rpc(
            "message/send",
            {
                "message": {
                    "kind": "message",
                    "messageId": "{n}",
                    "role": "user",
                    "parts": [{"kind": "text", "text": "x"}],
                },
                "configuration": {"blocking": False},
            },
        ),
    ),
    Row("POST", A2A, Role.OPERATOR, rpc("tasks/cancel", {"id": "{run_id}"})),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("home"), workers=2) as live:
        with live.client(live.mint(NS, Role.ADMIN)) as admin:
            apply(admin, resources("helper", [echo_turn("x"), "{text: done}"], approval="always"))
        yield live


def fresh_objects(admin: httpx.Client, n: int) -> dict[str, str]:
    """Objects of namespace alpha for one principal's pass (each may be used up by it)."""

    def waiting_run(session: str | None = None) -> str:
        body = {"input": "x"} | ({"session": session} if session else {})
        response = admin.post("/v1/agents/helper/prompt", json=body)
        assert response.json()["state"] == "waiting_approval", response.text
        return str(response.json()["id"])

    def approval_of(run_id: str) -> str:
        [approval] = admin.get("/v1/approvals", params={"run_id": run_id}).json()["items"]
        return str(approval["id"])

    secret = {**SECRET_DOC, "metadata": {"name": f"doomed-{n}"}}
    assert admin.post("/v1/resources", json=secret).status_code == 200
    secret = {**SECRET_DOC, "metadata": {"name": f"together-{n}"}}
    assert admin.post("/v1/resources", json=secret).status_code == 200
    memory = {**SECRET_DOC, "kind": "Memory", "metadata": {"name": f"mem-{n}"}, "spec": {}}
    assert admin.post("/v1/resources", json=memory).status_code == 200
    system = {
        **SECRET_DOC,
        "kind": "AgentSystem",
        "metadata": {"name": "team"},
        "spec": {"entry": "helper"},
    }
    assert admin.post("/v1/resources", json=system).status_code == 200
    entry = {"text": "an entry", "key": "k"}
    assert admin.post(f"/v1/memories/mem-{n}/entries", json=entry).status_code == 201
    queued = admin.post(
        "/v1/tasks", json={"agent": "helper", "input": "x", "delay_seconds": 3600}
    ).json()["id"]
    # A session can only be deleted once its runs are finished: cancel the one it has.
    in_session = waiting_run(session=f"sess-{n}")
    assert admin.post(f"/v1/tasks/{in_session}/cancel").json()["state"] == "cancelled"
    return {
        "kind": "secret",
        "resource": f"doomed-{n}",
        "together": f"together-{n}",
        "agent": "helper",
        "task_id": queued,
        "run_id": waiting_run(),
        "approve": approval_of(waiting_run()),  # approve and reject need one each
        "reject": approval_of(waiting_run()),
        "session_id": f"sess-{n}",
        "memory": f"mem-{n}",
        "system": "team",
        "key": "k",
        "token_id": admin.post("/v1/tokens", json={"role": "viewer"}).json()["id"],
        "namespace": NS,
        "n": f"pass-{n}",
    }


def url(row: Row, objects: dict[str, str]) -> str:
    """The row's path with this pass's objects in it."""
    values = {
        **objects,
        "name": objects["agent"]
        if row.path.startswith("/v1/agents")
        else objects["memory"]
        if row.path.startswith("/v1/memories")
        else objects["system"]
        if row.path.startswith("/v1/systems")
        else objects["resource"],
        "approval_id": objects["approve" if row.path.endswith("/approve") else "reject"],
    }
    return row.path.format(**values)


def filled(body: Any, objects: dict[str, str]) -> Any:
    """``body`` with this pass's objects in its strings."""
    if isinstance(body, str):
        return body.format(**objects)
    if isinstance(body, dict):
        return {key: filled(value, objects) for key, value in body.items()}
    if isinstance(body, list):
        return [filled(value, objects) for value in body]
    return body


def call(client: httpx.Client, row: Row, objects: dict[str, str]) -> httpx.Response:
    return client.request(row.method, url(row, objects), json=filled(row.body, objects))


def test_the_matrix_covers_every_v1_endpoint(server: LiveServer) -> None:
    spec = httpx.get(f"{server.url}/openapi.json").json()
    documented = {
        (method.upper(), path)
        for path, operations in spec["paths"].items()
        # /v1/links takes agent tokens, not API tokens: test_agent_tokens.py covers it
        if path.startswith("/v1/") and not path.startswith("/v1/links")
        for method in operations
    }
    assert documented == {(row.method, row.path) for row in MATRIX if row.path.startswith("/v1/")}
    # A2A's contract is its agent card, not an OpenAPI operation
    assert not [path for path in spec["paths"] if path.startswith("/a2a")]


@pytest.mark.parametrize("role", list(Role))
def test_each_role_may_call_exactly_its_endpoints(server: LiveServer, role: Role) -> None:
    with server.client(server.mint(NS, Role.ADMIN)) as admin:
        objects = fresh_objects(admin, list(Role).index(role))
    with server.client(server.mint(NS, role)) as client:
        # Reads first, then the calls that use objects up (delete, revoke) last.
        for row in sorted(MATRIX, key=lambda r: (r.method == "DELETE", "revoke" in r.path)):
            response = call(client, row, objects)
            if role.allows(row.role):
                assert response.status_code in (200, 201, 202, 204), (
                    f"{role} {row.method} {row.path}: {response.status_code} {response.text}"
                )
                if row.path.startswith("/a2a") and row.method == "POST":  # JSON-RPC: no error
                    assert "result" in response.json(), f"{role} {row.body}: {response.text}"
            else:
                assert response.status_code == 403, f"{role} {row.method} {row.path}"
                assert response.json()["code"] == "forbidden"


def test_another_namespace_gets_404_and_sees_nothing(server: LiveServer) -> None:
    with server.client(server.mint(NS, Role.ADMIN)) as admin:
        objects = fresh_objects(admin, 10)
    with server.client(server.mint("beta", Role.ADMIN)) as foreign:
        for row in MATRIX:
            response = call(foreign, row, objects)
            where = f"{row.method} {row.path}"
            assert f'"{NS}"' not in response.text, f"{where} leaked namespace {NS}"
            if row.names_object:
                assert response.status_code == 404, f"{where}: {response.status_code}"
                assert response.json()["code"] == "not_found"
            elif row.path == "/v1/whoami":  # the caller's own token, in its own namespace
                assert response.status_code == 200 and response.json()["namespace"] == "beta"
            elif row.path == "/v1/capabilities":  # the machine's, the same for every caller
                assert response.status_code == 200 and "sandbox" in response.json()
            elif row.method == "GET":
                assert response.status_code == 200 and all(
                    NS not in json.dumps(item) for item in response.json()["items"]
                ), where
            else:  # creates in its own namespace, where agent 'helper' does not exist
                assert response.status_code in (200, 201, 422), where
    # The objects are untouched: alpha still sees them as they were.
    with server.client(server.mint(NS, Role.VIEWER)) as viewer:
        assert viewer.get(f"/v1/tasks/{objects['task_id']}").json()["state"] == "queued"
        assert viewer.get(f"/v1/sessions/{objects['session_id']}").status_code == 200


def test_no_token_is_401_everywhere(server: LiveServer) -> None:
    objects = dict.fromkeys(
        [
            "kind",
            "resource",
            "task_id",
            "run_id",
            "approve",
            "reject",
            "session_id",
            "token_id",
            "memory",
            "system",
            "key",
            "n",
            "together",
        ],
        "x",
    )
    objects["agent"] = "helper"
    objects["namespace"] = NS
    with server.client() as anonymous:
        for row in MATRIX:
            response = call(anonymous, row, objects)
            assert response.status_code == 401, f"{row.method} {row.path}"
            assert response.headers["www-authenticate"].startswith("Bearer")


def test_the_same_session_id_in_two_namespaces_is_two_sessions(server: LiveServer) -> None:
    with server.client(server.mint(NS, Role.ADMIN)) as admin:
        first = admin.post("/v1/agents/helper/prompt", json={"input": "x", "session": "shared"})
        assert first.json()["session_id"] == "shared"
    with server.client(server.mint("gamma", Role.ADMIN)) as other:
        apply(other, resources("chatter", ["{text: hi}"]))
        # Neither taken (409) nor the other namespace's: a session of gamma's own.
        response = other.post("/v1/agents/chatter/prompt", json={"input": "y", "session": "shared"})
        assert response.status_code == 200, response.text
        assert (response.json()["state"], response.json()["output"]) == ("succeeded", "hi")
        mine = other.get("/v1/sessions/shared").json()
        assert (mine["agent"], mine["namespace"]) == ("chatter", "gamma")
        texts = [
            m["message"]["content"]
            for m in other.get("/v1/sessions/shared/messages").json()["items"]
        ]
        assert texts == ["y", "hi"]
    with server.client(server.mint(NS, Role.ADMIN)) as admin:
        theirs = admin.get("/v1/sessions/shared").json()
        assert (theirs["agent"], theirs["namespace"]) == ("helper", NS)
        assert admin.get("/v1/sessions/shared/messages").json()["items"] == []


def test_probing_another_namespaces_session_id_is_404(server: LiveServer) -> None:
    with server.client(server.mint(NS, Role.ADMIN)) as admin:
        admin.post("/v1/agents/helper/prompt", json={"input": "x", "session": "private-id"})
        assert admin.get("/v1/sessions/private-id").status_code == 200
    with server.client(server.mint("delta", Role.ADMIN)) as prober:
        for method in ("GET", "DELETE"):
            response = prober.request(method, "/v1/sessions/private-id")
            assert (response.status_code, response.json()["code"]) == (404, "not_found")
            assert NS not in response.text
        probe = prober.get("/v1/sessions/private-id/messages")
        assert probe.status_code == 404
        # Using the id tells it nothing either (it was a 409 "taken"): it opens its own.
        apply(prober, resources("prober", ["{text: mine}"]))
        body = {"agent": "prober", "input": "x", "session": "private-id", "delay_seconds": 3600}
        assert prober.post("/v1/tasks", json=body).status_code == 201
        assert prober.get("/v1/sessions/private-id").json()["namespace"] == "delta"
    with server.client(server.mint(NS, Role.VIEWER)) as viewer:
        assert viewer.get("/v1/sessions/private-id").json()["agent"] == "helper"
