"""Agent systems through the front doors: ``POST /v1/systems/{name}/tasks`` and
``GET /v1/tasks/{id}/messages`` on a real ``corral serve`` (with the Python client),
and ``corral systems run`` / ``corral logs`` embedded and against the server."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli_harness import invoke
from corral.client import Client
from corral.core.tokens import Role
from server_harness import LiveServer, apply, wait_for

TEAM = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: m}
spec: {provider: scripted, script: [{text: "an answer"}]}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: planner}
spec: {model: m}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: researcher}
spec: {model: m}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: critic}
spec: {model: m}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: writer}
spec: {model: m}
---
apiVersion: corral/v1
kind: AgentSystem
metadata: {name: team}
spec:
  entry: planner
  graph:
    planner: {next: [researcher, critic]}
    researcher: {next: [writer]}
    critic: {next: [writer]}
    writer: {join: all}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("home"), workers=4) as live:
        with live.client(live.admin) as admin:
            apply(admin, TEAM)
        yield live


def finished(client: httpx.Client, task_id: str) -> dict[str, object]:
    def done() -> dict[str, object] | None:
        task: dict[str, object] = client.get(f"/v1/tasks/{task_id}").json()
        return task if task["state"] in ("succeeded", "failed", "cancelled") else None

    result: dict[str, object] = wait_for(done, message=f"task {task_id} to finish")
    return result


def test_a_system_task_submitted_over_http_runs_and_lists_its_messages(
    server: LiveServer, client: httpx.Client
) -> None:
    created = client.post(
        "/v1/systems/team/tasks", json={"input": "otters", "idempotency_key": "k-1"}
    )
    assert created.status_code == 201, created.text
    body = created.json()
    assert (body["system"], body["agent"], body["branch_id"]) == ("team", "team", None)
    assert created.headers["Location"] == f"/v1/tasks/{body['id']}"
    again = client.post(
        "/v1/systems/team/tasks", json={"input": "otters", "idempotency_key": "k-1"}
    )
    assert (again.status_code, again.json()["id"]) == (200, body["id"])

    task = finished(client, body["id"])
    assert (task["state"], task["output"]) == ("succeeded", "an answer")
    children = client.get(f"/v1/tasks/{body['id']}/children").json()["items"]
    assert sorted((c["agent"], c["branch_id"]) for c in children) == [
        ("critic", "1.2"),
        ("planner", "1"),
        ("researcher", "1.1"),
        ("writer", "1"),
    ]
    # the messages, two to a page
    seen: list[dict[str, object]] = []
    cursor: str | None = None
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = client.get(f"/v1/tasks/{body['id']}/messages", params=params).json()
        seen += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == 6 and len({m["id"] for m in seen}) == 6
    assert [m["type"] for m in seen].count("join") == 1
    assert {m["state"] for m in seen} == {"done"}

    with Client(server.url, server.admin) as py:
        messages = list(py.iter_task_messages(body["id"], page_size=4))
        assert [m.id for m in messages] == [m["id"] for m in seen]
        submitted = py.submit_system("team", "again")
        assert submitted.created and submitted.task.system == "team"


def test_system_tasks_are_confined_to_their_namespace(
    server: LiveServer, client: httpx.Client
) -> None:
    task = client.post("/v1/systems/team/tasks", json={"input": "x"}).json()["id"]
    with server.client(server.mint("beta", Role.ADMIN)) as foreign:
        refused = foreign.post("/v1/systems/team/tasks", json={"input": "x"})
        assert refused.status_code == 404 and refused.json()["code"] == "not_found"
        assert "default" not in refused.text
        listed = foreign.get(f"/v1/tasks/{task}/messages")
        assert listed.status_code == 404 and listed.json()["code"] == "not_found"


def test_hostile_system_requests_are_refused_cleanly(
    server: LiveServer, client: httpx.Client
) -> None:
    unknown = client.post("/v1/systems/nope/tasks", json={"input": "x"})
    assert unknown.status_code == 404 and "AgentSystem 'nope'" in unknown.json()["detail"]
    for name in ("研究", "UPPER", "a" * 64):
        bad = client.post(f"/v1/systems/{name}/tasks", json={"input": "x"})
        assert bad.status_code in (404, 422), (name, bad.text)
    huge = client.post("/v1/systems/team/tasks", json={"input": "x" * (2 * 1024 * 1024)})
    assert huge.status_code == 413, huge.text
    extra = client.post("/v1/systems/team/tasks", json={"input": "x", "agent": "planner"})
    assert extra.status_code == 422
    nul = client.post("/v1/systems/team/tasks", json={"input": "a\x00b"})
    assert nul.status_code == 422
    forged = client.get("/v1/tasks/run_x/messages", params={"cursor": "garbage"})
    assert forged.status_code in (404, 422)
    # the server keeps serving
    assert client.get("/v1/tasks").status_code == 200


def _corral(home: Path, *args: str, **env: str) -> tuple[int, str, str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    full.update(CORRAL_HOME=str(home), **env)
    proc = invoke(args, full)
    return proc.returncode, proc.stdout, proc.stderr


def test_systems_run_embedded_streams_the_tree_and_logs_shows_each_node(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    path = tmp_path / "team.yaml"
    path.write_text(TEAM)
    assert _corral(home, "apply", "-f", str(path))[0] == 0
    code, out, err = _corral(home, "systems", "run", "team", "write about otters")
    assert code == 0, err
    assert out.strip() == "an answer"
    assert "▶ system team" in err and "⋈ writer joins 2 input(s) (all)" in err
    assert "    critic ✓ an answer" in err and "    researcher ✓ an answer" in err
    assert "  writer ✓ an answer" in err

    code, out, err = _corral(home, "tasks", "list", "-o", "json")
    system = next(t for t in json.loads(out) if t["system"] == "team" and not t["branch_id"])
    code, out, err = _corral(home, "logs", system["id"])
    assert code == 0, err
    assert "⇢ planner branch 1" in out and "  planner ✓ an answer" in out
    assert "    critic ✓ an answer" in out

    code, out, err = _corral(home, "describe", "agentsystem", "team")
    assert code == 0, err
    assert "  planner -> researcher, critic  [entry]" in out
    assert "  writer -> (end)  [output, join all]" in out
    code, out, err = _corral(home, "get", "agentsystems", "-o", "name")
    assert (code, out.strip()) == (0, "agentsystem/team"), err

    code, out, err = _corral(home, "systems", "run", "nope", "x")
    assert code == 2 and "AgentSystem 'nope'" in err


def test_systems_run_against_the_server(server: LiveServer, tmp_path: Path) -> None:
    code, out, err = _corral(
        tmp_path,
        "systems",
        "run",
        "team",
        "remote otters",
        CORRAL_URL=server.url,
        CORRAL_TOKEN=server.admin,
    )
    assert code == 0, err
    assert out.strip() == "an answer"
    assert "⋈ writer joins 2 input(s) (all)" in err
    assert "  writer ✓ an answer" in err
