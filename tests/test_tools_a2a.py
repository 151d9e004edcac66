"""The ``a2a`` tool kind against remote agents built with the official ``a2a-sdk``.

What every kind does is in tests/conformance/test_tool_kinds.py; here: a task's
artifact as the result, the auth profile, the SSRF guard, and remotes that hang, die,
lie, answer too much or redirect; then a Corral agent (scripted model, real server)
that calls a remote agent through the tool.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from a2a_remotes import Remote, serving
from corral.core.errors import ToolError
from corral.core.messages import ToolCall
from corral.core.tokens import Role
from corral.resources.kinds import STORED, A2aToolSpec, ToolSpecModel
from corral.tools import a2a as a2a_tool
from corral.tools.base import Tool, ToolContext
from corral.tools.governance import GovernedTool, ToolOutcome, ToolPolicy, Toolset
from server_harness import LiveServer, apply


@pytest.fixture(scope="module")
def remote() -> Iterator[Remote]:
    with serving() as running:
        yield running


def make(
    url: str, *, allow_private: bool = True, secrets: dict[str, str] | None = None, **block: Any
) -> Tool:
    # read as stored: the url is checked by each call, as for a spec applied earlier
    a2a = A2aToolSpec.model_validate(
        {"url": url, "allow_private": allow_private, **block}, context=STORED
    )
    spec = ToolSpecModel(type="a2a", a2a=a2a)
    return a2a_tool.create("remote", spec, secrets or {})


async def invoke(
    tool: Tool, tmp_path: Path, arguments: dict[str, Any], **policy: Any
) -> ToolOutcome:
    toolset = Toolset([GovernedTool(tool, ToolPolicy(**policy))])
    call = ToolCall("call-1", tool.spec.name, json.dumps(arguments))
    ctx = ToolContext("run-1", "tester", "default", "call-1", "run-1:1:0", tmp_path)
    try:
        return await toolset.invoke(call, ctx)
    finally:
        await tool.aclose()


def test_an_a2a_tool_without_parameters_takes_one_input_text() -> None:
    spec = ToolSpecModel(type="a2a", a2a=A2aToolSpec(url="https://agents.example/x"))

    assert spec.parameters is not None and spec.parameters["required"] == ["input"]


def test_a_private_url_is_refused_at_apply_unless_allowed() -> None:
    with pytest.raises(ValueError, match=r"169\.254"):
        A2aToolSpec(url="http://169.254.169.254/.well-known/agent-card.json")
    assert A2aToolSpec(url="http://127.0.0.1:1/x", allow_private=True).allow_private


async def test_a_completed_tasks_artifact_is_the_result_and_the_auth_header_is_sent(
    remote: Remote, tmp_path: Path
) -> None:
    auth = {"type": "bearer", "secret": "remote-token"}
    tool = make(remote.url("tasker"), auth=auth, secrets={"remote-token": "s3cret"})

    outcome = await invoke(tool, tmp_path, {"input": "the work"})

    assert outcome.error is None, outcome.error
    assert outcome.output == "done: the work"
    assert remote.headers[-1]["authorization"] == "Bearer s3cret"


async def test_a_remote_that_speaks_http_json_only_is_called_over_it(
    remote: Remote, tmp_path: Path
) -> None:
    auth = {"type": "bearer", "secret": "remote-token"}
    tool = make(remote.url("resty"), auth=auth, secrets={"remote-token": "s3cret"})

    outcome = await invoke(tool, tmp_path, {"input": "the rest"})

    assert outcome.error is None, outcome.error
    assert outcome.output == "done: the rest"
    assert remote.headers[-1]["authorization"] == "Bearer s3cret"


async def test_the_guard_blocks_a_private_card_before_any_connection(
    remote: Remote, tmp_path: Path
) -> None:
    seen = len(remote.headers)
    outcome = await invoke(
        make(remote.url("tasker"), allow_private=False), tmp_path, {"input": "x"}
    )

    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.retryable) == ("blocked_destination", False)
    assert len(remote.headers) == seen


async def test_a_remote_that_hangs_is_a_retryable_timeout(remote: Remote, tmp_path: Path) -> None:
    with anyio.fail_after(10):
        outcome = await invoke(
            make(remote.url("hang")), tmp_path, {"input": "x"}, timeout_seconds=0.5
        )

    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.retryable) == ("timeout", True)


async def test_a_remote_that_died_is_retryable_unavailable(tmp_path: Path) -> None:
    with serving() as doomed:
        tool = make(doomed.url("tasker"))
        ctx = ToolContext("run-1", "tester", "default", "c", "k", tmp_path)
        assert await tool.call({"input": "first"}, ctx) == "done: first"
    try:
        with pytest.raises(ToolError) as caught:
            await tool.call({"input": "again"}, ctx)
    finally:
        await tool.aclose()
    assert (caught.value.code, caught.value.retryable) == ("unavailable", True)


async def test_a_remote_that_lies_is_a_malformed_answer(remote: Remote, tmp_path: Path) -> None:
    outcome = await invoke(make(remote.url("liar")), tmp_path, {"input": "x"})

    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.retryable) == ("execution_failed", False)
    assert "malformed answer" in outcome.error.reason


async def test_a_remote_that_answers_too_much_is_output_too_large(
    remote: Remote, tmp_path: Path
) -> None:
    outcome = await invoke(make(remote.url("huge")), tmp_path, {"input": "x"})

    assert outcome.error is not None
    assert outcome.error.code == "output_too_large"


async def test_a_redirect_is_not_followed(remote: Remote, tmp_path: Path) -> None:
    outcome = await invoke(make(remote.card("moved")), tmp_path, {"input": "x"})

    assert outcome.error is not None
    assert outcome.error.code == "execution_failed"
    assert "302" in outcome.error.reason and "169.254.169.254" in outcome.error.reason


async def test_a_host_that_refuses_is_retryable_unavailable(tmp_path: Path) -> None:
    outcome = await invoke(make("http://127.0.0.1:9/x"), tmp_path, {"input": "x"})

    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.retryable) == ("unavailable", True)


def test_a_corral_agent_calls_a_remote_a2a_agent_through_the_tool(
    remote: Remote, tmp_path: Path
) -> None:
    arguments = json.dumps({"input": "compile the report"})
    documents = f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: caller-model}}
spec:
  provider: scripted
  script:
    - {{tool_calls: [{{name: colleague, arguments: {arguments}}}]}}
    - {{text: the colleague answered}}
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: colleague}}
spec:
  type: a2a
  a2a: {{url: "{remote.card("tasker")}", allow_private: true}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: caller}}
spec:
  model: caller-model
  tools: [colleague]
"""
    with LiveServer(tmp_path / "home", workers=1) as live:
        with live.client(live.admin) as admin:
            apply(admin, documents)
        with live.client(live.mint("default", Role.OPERATOR)) as client:
            answer = client.post("/v1/agents/caller/prompt", json={"input": "go"}).json()
            assert (answer["state"], answer["output"]) == ("succeeded", "the colleague answered")
            events = client.get(f"/v1/runs/{answer['id']}/events").json()["items"]
    [result] = [e["data"] for e in events if e["type"] == "tool.result"]
    assert result["output"] == "done: compile the report", result


def test_a_corral_agent_calls_a_corral_agent_over_a2a_with_a_token_from_a_secret(
    tmp_path: Path,
) -> None:
    with LiveServer(tmp_path / "home", workers=2) as live:
        token = live.mint("default", Role.OPERATOR)
        arguments = json.dumps({"input": "hi colleague"})
        documents = f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: models}}
spec:
  provider: scripted
  script:
    - {{tool_calls: [{{name: colleague, arguments: {arguments}}}]}}
    - {{text: relayed}}
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: greeter-model}}
spec:
  provider: scripted
  script: [{{text: hello from greeter}}]
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: greeter}}
spec: {{model: greeter-model}}
---
apiVersion: corral/v1
kind: Secret
metadata: {{name: corral-token}}
spec: {{value: "{token}"}}
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: colleague}}
spec:
  type: a2a
  a2a:
    url: "{live.url}/a2a/default/greeter"
    allow_private: true
    auth: {{type: bearer, secret: corral-token}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: caller}}
spec: {{model: models, tools: [colleague]}}
"""
        with live.client(live.admin) as admin:
            apply(admin, documents)
            answer = admin.post("/v1/agents/caller/prompt", json={"input": "go"}).json()
            assert (answer["state"], answer["output"]) == ("succeeded", "relayed"), answer
            events = admin.get(f"/v1/runs/{answer['id']}/events").json()["items"]
            [result] = [e["data"] for e in events if e["type"] == "tool.result"]
            assert result["output"] == "hello from greeter", result
            # the remote task is a run of greeter, keyed by the calling tool call
            [remote] = admin.get("/v1/tasks", params={"agent": "greeter"}).json()["items"]
            assert remote["idempotency_key"].startswith(f"a2a:{answer['id']}:")
