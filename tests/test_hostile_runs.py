"""Bad input that used to create runs which could only fail, or resources that could only
fail at run time: refused up front, with a clear message and a stable code."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from cli_harness import invoke
from server_harness import LiveServer, apply

CORRAL = [sys.executable, "-m", "corral"]
BAD_SCHEMA = {"type": "objectx"}

STRUCTURED = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: answers}
spec:
  provider: scripted
  script: [{text: '{"sum": 5}'}]
---
apiVersion: corral/v1
kind: Agent
metadata: {name: structured}
spec:
  model: answers
"""


def corral(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_HOME"] = str(home)
    return invoke(args, env)


# --------------------------------------------------------------------------- output schemas


def test_prompt_object_with_an_invalid_schema_exits_2_and_creates_no_run(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (tmp_path / "agent.yaml").write_text(STRUCTURED)
    assert corral(home, "apply", "-f", str(tmp_path / "agent.yaml")).returncode == 0
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(BAD_SCHEMA))

    proc = corral(home, "prompt-object", "structured", "--schema", str(schema), "2 + 3?")

    assert proc.returncode == 2, proc.stderr
    assert "not a valid JSON Schema" in proc.stderr and "'objectx'" in proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    listed = corral(home, "tasks", "list", "-o", "json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []


def test_prompt_object_with_an_invalid_schema_exits_2_in_remote_mode_too(
    server: LiveServer, client: httpx.Client, tmp_path: Path
) -> None:
    apply(client, STRUCTURED)
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(BAD_SCHEMA))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(CORRAL_URL=server.url, CORRAL_TOKEN=server.admin)
    proc = subprocess.run(
        [*CORRAL, "prompt-object", "structured", "--schema", str(schema), "2 + 3?"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "objectx" in proc.stderr and "Traceback" not in proc.stderr


def test_prompt_object_with_an_invalid_schema_is_422_over_the_api(client: httpx.Client) -> None:
    apply(client, STRUCTURED)
    response = client.post(
        "/v1/agents/structured/prompt-object", json={"input": "2 + 3?", "schema": BAD_SCHEMA}
    )
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "body.schema"
    assert client.get("/v1/tasks", params={"agent": "structured"}).json()["items"] == []


def test_an_agent_with_an_invalid_output_schema_is_refused_at_apply(
    client: httpx.Client, tmp_path: Path
) -> None:
    text = STRUCTURED.replace("model: answers", f"model: answers\n  output_schema: {BAD_SCHEMA}")
    text = text.replace("name: structured", "name: badly-typed")
    response = client.post(
        "/v1/resources", content=text, headers={"Content-Type": "application/yaml"}
    )
    assert response.status_code == 422
    [problem] = response.json()["errors"]
    assert problem["field"] == "spec.output_schema" and "objectx" in problem["reason"]
    assert client.get("/v1/resources/agent/badly-typed").status_code == 404

    (tmp_path / "agent.yaml").write_text(text)
    proc = corral(tmp_path / "home", "apply", "-f", str(tmp_path / "agent.yaml"))
    assert proc.returncode == 2 and "spec.output_schema" in proc.stderr


# --------------------------------------------------------------------------- relative paths


def _tool(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "corral/v1", "kind": "Tool", "metadata": {"name": name}, "spec": spec}


RELATIVE = [
    (
        _tool("py", {"type": "python", "python": {"function": "m:f", "path": "./lib"}}),
        "spec.python.path",
    ),
    (
        _tool("py-bare", {"type": "python", "python": {"function": "m:f", "path": "lib"}}),
        "spec.python.path",
    ),
    (
        _tool("ex", {"type": "exec", "exec": {"command": ["./tool.py"]}, "parameters": {}}),
        "spec.exec.command[0]",
    ),
    (
        _tool("ex-dir", {"type": "exec", "exec": {"command": ["bin/tool"]}, "parameters": {}}),
        "spec.exec.command[0]",
    ),
    (
        _tool(
            "ex-arg",
            {"type": "exec", "exec": {"command": ["python3", "../x.py"]}, "parameters": {}},
        ),
        "spec.exec.command[1]",
    ),
    (
        {
            "apiVersion": "corral/v1",
            "kind": "McpServer",
            "metadata": {"name": "files"},
            "spec": {"transport": "stdio", "command": ["./server.py", "--root", "/srv"]},
        },
        "spec.command[0]",
    ),
]


@pytest.mark.parametrize(
    ("document", "field"), RELATIVE, ids=[d["metadata"]["name"] for d, _ in RELATIVE]
)
def test_relative_program_paths_are_refused_over_the_api_naming_the_field(
    client: httpx.Client, document: dict[str, Any], field: str
) -> None:
    response = client.post("/v1/resources", json=[document])
    assert response.status_code == 422, response.text
    [problem] = response.json()["errors"]
    assert (problem["field"], problem["document"]) == (field, 0)
    assert "relative" in problem["reason"]
    kind, name = document["kind"].lower(), document["metadata"]["name"]
    assert client.get(f"/v1/resources/{kind}/{name}").status_code == 404


def test_absolute_paths_and_names_on_the_path_are_still_accepted(client: httpx.Client) -> None:
    documents = [
        _tool("abs", {"type": "exec", "exec": {"command": ["/bin/cat"]}, "parameters": {}}),
        _tool("on-path", {"type": "exec", "exec": {"command": ["cat", "-"]}, "parameters": {}}),
        _tool("py-abs", {"type": "python", "python": {"function": "m:f", "path": "/srv/lib"}}),
    ]
    response = client.post("/v1/resources", json=documents)
    assert response.status_code == 200, response.text


def test_the_cli_still_sends_paths_relative_to_the_file_as_absolute(
    server: LiveServer, tmp_path: Path
) -> None:
    (tmp_path / "tools.yaml").write_text(
        """
apiVersion: corral/v1
kind: Tool
metadata: {name: rel}
spec:
  type: exec
  exec: {command: [./tool.sh]}
  parameters: {type: object}
"""
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(CORRAL_URL=server.url, CORRAL_TOKEN=server.admin)
    proc = subprocess.run(
        [*CORRAL, "apply", "-f", str(tmp_path / "tools.yaml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    with server.client(server.admin) as client:
        stored = client.get("/v1/resources/tool/rel").json()
    assert stored["spec"]["exec"]["command"] == [str(tmp_path / "tool.sh")]


# --------------------------------------------------------------------------- header secrets

# a key pasted with its line break, or with a non-ASCII character: no HTTP header can carry it
UNSENDABLE_KEYS = ["sk-pasted-with-newline\n", "sk-ключ-1234567890", "tok\r\nX-Injected: 1"]


def _header_secret_documents(base_url: str, value: str) -> str:
    return f"""
apiVersion: corral/v1
kind: Secret
metadata: {{name: pasted-key}}
spec: {{value: {json.dumps(value)}}}
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: keyed}}
spec:
  provider: openai
  model: m
  base_url: {base_url}
  api_key: {{secret: pasted-key}}
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: keyed-http}}
spec:
  type: http
  description: posts somewhere
  http:
    url: {base_url}/hook
    allow_private: true
    auth: {{type: api-key, header: X-Key, secret: pasted-key}}
  parameters: {{type: object}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: keyed-model}}
spec: {{model: keyed}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: keyed-tool}}
spec: {{model: answers, tools: [keyed-http]}}
"""


@pytest.mark.parametrize("value", UNSENDABLE_KEYS, ids=["newline", "non-ascii", "crlf"])
@pytest.mark.parametrize("agent", ["keyed-model", "keyed-tool"])
def test_a_secret_no_header_can_carry_fails_the_run_once_with_a_clear_configuration_error(
    client: httpx.Client, value: str, agent: str
) -> None:
    """Not an ``internal_error`` retried to ``dead_letter``; the reason names the secret only."""
    apply(client, STRUCTURED + "---" + _header_secret_documents("http://127.0.0.1:9/v1", value))
    response = client.post("/v1/agents/" + agent + "/prompt", json={"input": "hi"})
    assert response.status_code == 200, response.text
    task = response.json()
    assert task["state"] == "failed", task
    assert task["attempts"] == 1, task
    error = task["error"]
    assert error["code"] == "configuration_error", error
    assert "'pasted-key' cannot be sent in an HTTP header" in error["message"]
    assert value.strip() not in json.dumps(task) and "ключ" not in json.dumps(task)


# --------------------------------------------------------------------------- numbers


def post_yaml(client: httpx.Client, text: str) -> httpx.Response:
    return client.post(
        "/v1/resources", content=text.encode(), headers={"Content-Type": "application/yaml"}
    )


def post_json(client: httpx.Client, text: str) -> httpx.Response:
    return client.post(
        "/v1/resources", content=text.encode(), headers={"Content-Type": "application/json"}
    )


UNSTORABLE_NUMBERS = [
    ("yaml", "max_cost_usd: .inf", "spec.limits.max_cost_usd", "finite"),
    ("yaml", "max_steps: 0x" + "f" * 5000, "spec.limits.max_steps", "between"),
    ("yaml", "max_steps: 99999999999999999999999", "spec.limits.max_steps", "between"),
    ("json", '"max_cost_usd": Infinity', "spec.limits.max_cost_usd", "finite"),
    ("json", '"max_cost_usd": 1e999', "spec.limits.max_cost_usd", "finite"),
]


@pytest.mark.parametrize(("syntax", "limit", "field", "reason"), UNSTORABLE_NUMBERS)
def test_a_number_no_store_keeps_is_422_and_every_run_still_runs(
    client: httpx.Client, syntax: str, limit: str, field: str, reason: str
) -> None:
    """An infinite limit, once stored, made SQLite's JSON functions fail every worker's claim
    (runs of every namespace stayed queued); a 6,000-digit one answered 503."""
    agent = (
        "apiVersion: corral/v1\nkind: ModelEndpoint\nmetadata: {name: canned}\n"
        "spec: {provider: scripted, script: [{text: fine}]}\n"
    )
    if syntax == "yaml":
        response = post_yaml(
            client,
            agent + "---\napiVersion: corral/v1\nkind: Agent\nmetadata: {name: numbers}\n"
            f"spec: {{model: canned, limits: {{{limit}}}}}\n",
        )
    else:
        body = (
            '[{"apiVersion": "corral/v1", "kind": "ModelEndpoint", "metadata": {"name": "canned"},'
            ' "spec": {"provider": "scripted", "script": [{"text": "fine"}]}},'
            ' {"apiVersion": "corral/v1", "kind": "Agent", "metadata": {"name": "numbers"},'
            f' "spec": {{"model": "canned", "limits": {{{limit}}}}}}}]'
        )
        response = post_json(client, body)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["code"] == "invalid_resource"
    assert [e["field"] for e in problem["errors"]] == [field]
    assert reason in problem["errors"][0]["reason"]
    assert client.get("/v1/resources/Agent/numbers").status_code == 404
    # what the refusal protects: an agent applied next runs
    response = post_yaml(
        client,
        agent + "---\napiVersion: corral/v1\nkind: Agent\nmetadata: {name: plain}\n"
        "spec: {model: canned}\n",
    )
    assert response.status_code == 200, response.text
    try:
        answer = client.post("/v1/agents/plain/prompt", json={"input": "hi", "timeout_seconds": 30})
        assert answer.status_code == 200, answer.text
        assert answer.json()["state"] == "succeeded", answer.text
    finally:
        client.delete("/v1/resources/Agent/plain")
        client.delete("/v1/resources/ModelEndpoint/canned")


# --------------------------------------------------------------------------- remote $ref


class _Counting(http.server.BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        body = b'{"type": "object"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/schema+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def schema_host() -> Iterator[tuple[str, list[str]]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Counting.hits = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/schema.json", _Counting.hits
    finally:
        server.shutdown()
        server.server_close()


def test_a_remote_ref_in_an_output_schema_is_never_fetched(
    client: httpx.Client, schema_host: tuple[str, list[str]]
) -> None:
    """jsonschema fetched it with urllib while validating: any operator made the worker GET
    any address (cloud metadata included), and the run died as an internal error."""
    url, hits = schema_host
    apply(client, STRUCTURED)
    response = client.post(
        "/v1/agents/structured/prompt-object",
        json={"input": "sum", "schema": {"$ref": url}, "timeout_seconds": 30},
    )
    assert response.status_code == 200, response.text
    task = response.json()
    assert hits == []
    assert task["state"] == "failed", task
    assert task["error"]["code"] != "internal_error", task
    # the model was told why its answer could not be checked
    events = client.get(f"/v1/runs/{task['id']}/events").text
    assert "remote references are not fetched" in events
