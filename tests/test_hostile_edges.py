"""Hostile ``url`` values of an ``http`` Tool: refused when applied (API 422, CLI exit 2,
both naming ``spec.http.url``), and a url that gets past apply fails that tool's calls,
never the agent.

Every spelling of a loopback, private or metadata address counts, not only the dotted
one: ``2130706433``, ``0x7f.1`` and ``127.1`` are 127.0.0.1 to a resolver.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.core.errors import ToolError
from corral.resources.kinds import HttpToolSpec, ToolSpecModel
from corral.tools import http as http_tool
from corral.tools.base import ToolContext
from corral.tools.ssrf import check_destination
from server_harness import LiveServer

HOSTILE_URLS = [
    ("file:///etc/passwd", "scheme 'file' is not allowed"),
    ("gopher://example.com/x", "scheme 'gopher' is not allowed"),
    ("http:///no-host", "no host"),
    ("http://user:password@example.com/hook", "credentials in the URL"),
    ("http://example.com@127.0.0.1/hook", "credentials in the URL"),
    ("http://0177.0.0.1/", "not a valid URL"),
    ("http://2130706433/", "127.0.0.1 is a loopback address"),
    ("http://0x7f.1/", "127.0.0.1 is a loopback address"),
    ("http://0x7f000001/", "127.0.0.1 is a loopback address"),
    ("http://127.1/", "127.0.0.1 is a loopback address"),
    ("http://017700000001/", "127.0.0.1 is a loopback address"),
    ("http://[::1]/", "loopback"),
    ("http://[::ffff:7f00:1]/", "loopback"),
    ("http://169.254.169.254/latest/meta-data", "cloud metadata"),
    ("http://0xa9.0xfe.0xa9.0xfe/latest", "cloud metadata"),
    ("http://10.0.0.1/", "private"),
    ("http://0/", "unspecified"),
    ("http://localhost:8080/", "loopback name"),
    ("http://api.localhost/", "loopback name"),
    ("http://999.1.1.1/", "not a valid"),
    ("http://1.2.3.4.5/", "not a valid IPv4 address"),
    ("http://%31%32%37.0.0.1/", "not a valid IPv4 address"),
]


def tool_document(url: str, *, allow_private: bool = False) -> str:
    return f"""apiVersion: corral/v1
kind: Tool
metadata: {{name: hook}}
spec:
  type: http
  description: posts to a hook
  parameters: {{type: object}}
  http:
    url: "{url}"
    allow_private: {str(allow_private).lower()}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("home"), workers=0) as live:
        yield live


@pytest.mark.parametrize(("url", "reason"), HOSTILE_URLS)
def test_apply_over_the_api_refuses_a_hostile_http_tool_url_with_its_field(
    server: LiveServer, url: str, reason: str
) -> None:
    with server.client(server.admin) as client:
        response = client.post(
            "/v1/resources",
            content=tool_document(url),
            headers={"Content-Type": "application/yaml"},
        )
        assert response.status_code == 422, response.text
        body = response.json()
        assert body["code"] == "invalid_resource"
        [error] = body["errors"]
        assert error["field"] == "spec.http.url"
        assert error["line"] == 9
        assert reason in error["reason"]
        assert client.get("/v1/resources/tool/hook").status_code == 404  # nothing stored


@pytest.mark.parametrize(
    "url", ["http://2130706433:9/", "http://0x7f.1/", "http://[::1]/", "http://localhost/"]
)
def test_a_private_destination_needs_allow_private(server: LiveServer, url: str) -> None:
    with server.client(server.admin) as client:

        def apply(allow_private: bool) -> httpx.Response:
            return client.post(
                "/v1/resources",
                content=tool_document(url, allow_private=allow_private),
                headers={"Content-Type": "application/yaml"},
            )

        assert apply(False).status_code == 422
        assert apply(True).status_code == 200


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "http://user:pw@example.com/", "http://0x7f.1.2.3.4/"]
)
def test_allow_private_does_not_lift_the_scheme_host_and_credentials_rules(
    server: LiveServer, url: str
) -> None:
    with server.client(server.admin) as client:
        response = client.post(
            "/v1/resources",
            content=tool_document(url, allow_private=True),
            headers={"Content-Type": "application/yaml"},
        )
        assert response.status_code == 422, response.text
        assert response.json()["errors"][0]["field"] == "spec.http.url"


@pytest.mark.parametrize("url", ["http://0x7f.1/", "file:///etc/passwd"])
def test_corral_apply_refuses_a_hostile_url_in_one_line_exit_2(tmp_path: Path, url: str) -> None:
    manifest = tmp_path / "hook.yaml"
    manifest.write_text(tool_document(url))
    env = {**os.environ, "CORRAL_HOME": str(tmp_path / "home")}
    env.pop("CORRAL_DB_URL", None)
    result = subprocess.run(
        [sys.executable, "-m", "corral", "apply", "-f", str(manifest)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "spec.http.url" in output
    assert f"{manifest}:9" in output
    assert "Traceback" not in output


# ----------------------------------------------------------------------------- at call time


class RecordingResolver:
    """A resolver that records the names it is asked for and answers a public address."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        return ["93.184.215.14"]


@pytest.mark.parametrize(
    "url", ["http://0x7f.1/", "http://2130706433/", "http://127.1/", "http://0xa9fea9fe/"]
)
async def test_the_call_time_guard_reads_numeric_spellings_itself(url: str) -> None:
    # Not left to the resolver: one that does not take "0x7f.1" for 127.0.0.1 (or a DNS
    # server answering for it) would otherwise pin the call to whatever it says.
    resolver = RecordingResolver()
    with pytest.raises(ToolError) as caught:
        await check_destination(url, resolver=resolver)
    assert caught.value.code == "blocked_destination"
    assert resolver.asked == []


@pytest.mark.parametrize("url", ["file:///etc/passwd", "http:///x", "http://u:p@example.com/"])
async def test_a_bad_url_past_apply_fails_the_tools_calls_not_the_tool(
    url: str, tmp_path: Path
) -> None:
    # As a Tool stored by an older Corral, or built in Python without validation.
    spec = ToolSpecModel(
        type="http",
        parameters={"type": "object"},
        http=HttpToolSpec.model_construct(url=url, method="POST", headers={}, auth=None),
    )
    requests: list[httpx.Request] = []

    def never(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200)

    tool = http_tool.create("hook", spec, {}, transport=httpx.MockTransport(never))
    context = ToolContext(
        run_id="run-1",
        agent="a",
        namespace="default",
        call_id="call-1",
        idempotency_key="run-1:1:call-1",
        workspace=tmp_path,
    )
    try:
        with pytest.raises(ToolError) as caught:
            await tool.call({}, context)
    finally:
        await tool.aclose()
    assert caught.value.code == "blocked_destination"
    assert caught.value.retryable is False
    assert requests == []


AGENT_WITH_HOOK = """apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: hooker-model}
spec:
  provider: scripted
  script:
    - {tool_calls: [{name: hook, arguments: {}}]}
    - {text: done}
---
apiVersion: corral/v1
kind: Tool
metadata: {name: hook}
spec:
  type: http
  parameters: {type: object}
  http: {url: "https://hook.example.test/x"}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: hooker}
spec:
  model: hooker-model
  tools: [hook]
"""


def test_a_stored_tool_whose_url_apply_would_refuse_fails_its_calls_not_the_agent(
    tmp_path: Path,
) -> None:
    with LiveServer(tmp_path / "home", workers=1) as live, live.client(live.admin) as client:
        applied = client.post(
            "/v1/resources", content=AGENT_WITH_HOOK, headers={"Content-Type": "application/yaml"}
        )
        assert applied.status_code == 200, applied.text
        # As an older Corral, which did not check the url when applying, stored it.
        with sqlite3.connect(tmp_path / "home" / "corral.db") as db:
            changed = db.execute(
                "UPDATE resources SET spec = json_set(spec, '$.http.url', 'file:///etc/passwd')"
                " WHERE kind = 'Tool' AND name = 'hook'"
            ).rowcount
        assert changed == 1

        stored = client.get("/v1/resources/tool/hook")  # it still loads
        assert stored.status_code == 200, stored.text
        assert stored.json()["spec"]["http"]["url"] == "file:///etc/passwd"
        env = {**os.environ, "CORRAL_URL": live.url, "CORRAL_TOKEN": live.admin}
        shown = subprocess.run(
            [sys.executable, "-m", "corral", "get", "tool", "hook", "-o", "json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert shown.returncode == 0, shown.stdout + shown.stderr  # the remote CLI too
        assert "file:///etc/passwd" in shown.stdout

        answer = client.post("/v1/agents/hooker/prompt", json={"input": "call it"})
        assert answer.status_code == 200, answer.text
        assert (answer.json()["state"], answer.json()["output"]) == ("succeeded", "done")
        events = client.get(f"/v1/runs/{answer.json()['id']}/events").json()["items"]
        [result] = [e["data"] for e in events if e["type"] == "tool.result"]
        assert result["error"]["code"] == "blocked_destination"
        assert "scheme 'file' is not allowed" in result["error"]["reason"]
