"""Agents made from stored YAML resources and run end to end in embedded mode.

Real store (SQLite), real HTTP (the fake OpenAI-compatible server under the real
``openai`` client), real subprocesses and a real MCP server.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from corral.core.events import EventType
from corral.core.runs import RunRecord, RunState
from corral.core.settings import Settings
from corral.resources.loader import load_text
from corral.runtime.local import run_agent
from corral.store import Store
from corral.testing.fake_openai import FakeOpenAIServer, FakeReply, FakeToolCall
from corral.tools.sandbox.host import SandboxHost
from fixtures_models import fake_openai_fixture, openai_server_fixture

__all__ = ["fake_openai_fixture", "openai_server_fixture"]

TESTS = Path(__file__).parent
PROBE = TESTS / "tool_programs" / "probe.py"
CALC_MCP = TESTS / "mcp_servers" / "calc_server.py"
HANG_MCP = TESTS / "mcp_servers" / "hang_server.py"


def endpoint(name: str, base_url: str, *, timeout: float = 5, attempts: int = 1) -> str:
    return f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: {name}}}
spec:
  provider: openai
  model: test-model
  base_url: {base_url}
  timeout_seconds: {timeout}
  retry: {{max_attempts: {attempts}, initial_backoff_seconds: 0.01, max_backoff_seconds: 0.05}}
  pricing: {{input_per_million: 1.0, output_per_million: 2.0}}
"""


ADD_TOOL = f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: add}}
spec:
  type: python
  python: {{function: "agent_tools:add", path: "{TESTS}"}}
"""


def agent(model: str, *, tools: str = "[add]", extra: str = "") -> str:
    return f"""
apiVersion: corral/v1
kind: Agent
metadata: {{name: helper}}
spec:
  model: {model}
  instructions: Use tools for arithmetic.
  tools: {tools}
{extra}"""


async def apply(store: Store, *docs: str) -> None:
    await store.apply(load_text("---".join(docs), "test.yaml"))


async def check_stored(store: Store, record: RunRecord) -> list[EventType]:
    stored = await store.get_run(record.id)
    assert stored == record  # what the runner returned is the run as stored, field by field
    events = await store.list_events(record.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[0].type is EventType.RUN_START and events[-1].type is EventType.RUN_FINISH
    return [e.type for e in events]


@pytest.mark.parametrize("stream", [True, False])
async def test_multi_step_tool_run_over_openai_is_recorded(
    env: tuple[Store, Settings], fake_openai: FakeOpenAIServer, stream: bool
) -> None:
    store, settings = env
    fake_openai.add_reply(
        FakeReply(tool_calls=[FakeToolCall("add", {"a": 2, "b": 3})]),
        FakeReply(tool_calls=[FakeToolCall("add", {"a": 5, "b": 10})]),
        FakeReply(text="2 + 3 + 10 = 15"),
    )
    await apply(
        store,
        endpoint("fake", fake_openai.base_url),
        ADD_TOOL,
        agent("fake", extra=f"  stream: {str(stream).lower()}"),
    )
    record = await run_agent(store, settings, "helper", "what is 2+3+10?")

    assert record.state is RunState.SUCCEEDED, record.error
    assert record.output == "2 + 3 + 10 = 15"
    assert record.steps == 3
    assert record.usage.input_tokens == 30 and record.usage.requests == 3
    assert record.cost_usd == pytest.approx((30 * 1.0 + 15 * 2.0) / 1e6)
    types = await check_stored(store, record)
    assert types.count(EventType.TOOL_RESULT) == 2
    assert (EventType.TEXT_DELTA in types) is stream
    # What the real client sent: the tool schema, then the tool results in the conversation.
    first, last = fake_openai.requests[0].json, fake_openai.requests[-1].json
    assert first["tools"][0]["function"]["name"] == "add"
    assert first["tools"][0]["function"]["parameters"]["required"] == ["a", "b"]
    tool_contents = [m["content"] for m in last["messages"] if m["role"] == "tool"]
    assert tool_contents == ["5", "15"]


async def test_fallback_endpoint_takes_over_when_the_primary_keeps_failing(
    env: tuple[Store, Settings], fake_openai: FakeOpenAIServer
) -> None:
    store, settings = env
    with FakeOpenAIServer() as broken:
        broken.fail(500, times=None)
        fake_openai.add_reply(FakeReply(text="hello from the fallback"))
        await apply(
            store,
            endpoint("primary", broken.base_url, attempts=2),
            endpoint("backup", fake_openai.base_url),
            ADD_TOOL,
            agent("primary", extra="  fallback_models: [backup]"),
        )
        record = await run_agent(store, settings, "helper", "hi")
        assert broken.calls == 2  # retried once, then gave up on it
    assert record.state is RunState.SUCCEEDED
    assert record.output == "hello from the fallback"
    events = await store.list_events(record.id)
    [created] = [e for e in events if e.type is EventType.MESSAGE_CREATE]
    assert created.data.endpoint == "backup"


async def test_429_is_retried_after_the_servers_delay(
    env: tuple[Store, Settings], fake_openai: FakeOpenAIServer
) -> None:
    store, settings = env
    fake_openai.fail(429, times=1, retry_after="0.2")
    fake_openai.add_reply(FakeReply(text="ok"))
    await apply(store, endpoint("fake", fake_openai.base_url, attempts=3), ADD_TOOL, agent("fake"))
    started = time.monotonic()
    record = await run_agent(store, settings, "helper", "hi")
    assert record.state is RunState.SUCCEEDED
    assert fake_openai.calls == 2
    assert time.monotonic() - started >= 0.2


async def test_slow_model_endpoint_fails_the_run_with_a_timeout(
    env: tuple[Store, Settings], fake_openai: FakeOpenAIServer
) -> None:
    store, settings = env
    fake_openai.delay(10)
    await apply(
        store,
        endpoint("fake", fake_openai.base_url, timeout=0.5),
        ADD_TOOL,
        agent("fake", extra="  max_attempts: 1"),
    )
    started = time.monotonic()
    record = await run_agent(store, settings, "helper", "hi")
    assert time.monotonic() - started < 5
    # A timeout is retryable: with no attempt left, the run goes to the dead letter state.
    assert record.state is RunState.DEAD_LETTER
    assert record.error is not None and record.error["code"] == "model_timeout"
    assert EventType.ERROR in await check_stored(store, record)


SCRIPTED_MCP_AND_EXEC = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: script}
spec:
  provider: scripted
  script:
    - tool_calls:
        - {name: calc__add, arguments: {a: 20, b: 22}}
        - {name: probe, arguments: {mode: echo}}
    - text: done
"""


async def test_mcp_and_exec_tools_work_through_an_agent(
    env: tuple[Store, Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, settings = env
    monkeypatch.setenv("CORRAL_TEST_TOKEN", "tok-0123456789")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "host-only")
    await apply(
        store,
        SCRIPTED_MCP_AND_EXEC,
        f"""
apiVersion: corral/v1
kind: McpServer
metadata: {{name: calc}}
spec: {{transport: stdio, command: ["{sys.executable}", "{CALC_MCP}"]}}
""",
        """
apiVersion: corral/v1
kind: Secret
metadata: {name: token}
spec: {from_env: CORRAL_TEST_TOKEN}
""",
        f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: probe}}
spec:
  type: exec
  exec:
    command: ["{sys.executable}", "{PROBE}"]
    env: {{SERVICE_TOKEN: {{secret: token}}}}
  parameters: {{type: object, properties: {{mode: {{type: string}}}}}}
""",
        agent("script", tools='["mcp:calc/add", probe]'),
    )
    record = await run_agent(store, settings, "helper", "go")
    assert record.state is RunState.SUCCEEDED, record.error
    results = {
        e.data.tool: e.data.to_dict()
        for e in await store.list_events(record.id)
        if e.type is EventType.TOOL_RESULT
    }
    assert json.loads(results["mcp:calc/add"]["output"]) == {"result": 42}
    probe = json.loads(results["probe"]["output"])
    assert probe["env"]["SERVICE_TOKEN"] == "[REDACTED:token]"  # reached the tool, not the log
    assert "AWS_SECRET_ACCESS_KEY" not in probe["env"]
    # isolation auto: sandboxed where bubblewrap works, the workspace then at /workspace
    sandboxed = SandboxHost.from_env().probe().works
    workspace = settings.workspaces / "agents" / "default" / "helper"
    assert probe["cwd"] == ("/workspace" if sandboxed else str(workspace))
    stored = json.dumps([e.data.to_dict() for e in await store.list_events(record.id)])
    assert "tok-0123456789" not in stored


async def test_wasm_tools_work_through_an_agent_and_a_limit_hit_lets_the_run_go_on(
    env: tuple[Store, Settings], tmp_path: Path
) -> None:
    import wasmtime

    store, settings = env
    spin = tmp_path / "probe.wasm"
    spin.write_bytes(
        wasmtime.wat2wasm((TESTS / "tool_programs" / "wasm" / "probe.wat").read_text())
    )
    example = TESTS.parent / "examples" / "tools" / "word_count.wasm"
    await apply(
        store,
        """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: script}
spec:
  provider: scripted
  script:
    - tool_calls:
        - {name: wc, arguments: {text: "three little words"}}
        - {name: spin, arguments: {}}
    - text: done
""",
        f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: wc}}
spec:
  type: wasm
  wasm: {{module: "{example}"}}
  parameters: {{type: object, properties: {{text: {{type: string}}}}}}
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: spin}}
spec:
  type: wasm
  wasm: {{module: "{spin}", entrypoint: spin, fuel: 100000}}
  parameters: {{type: object}}
""",
        agent("script", tools="[wc, spin]"),
    )
    record = await run_agent(store, settings, "helper", "go")
    assert record.state is RunState.SUCCEEDED, record.error
    results = {
        e.data.tool: e.data.to_dict()
        for e in await store.list_events(record.id)
        if e.type is EventType.TOOL_RESULT
    }
    assert json.loads(results["wc"]["output"]) == {"words": 3}
    assert results["spin"]["error"]["code"] == "resource_exhausted"
    assert results["spin"]["error"]["details"] == {"limit": "fuel"}


async def test_roles_from_resources_deny_a_listed_tool(env: tuple[Store, Settings]) -> None:
    store, settings = env
    await apply(
        store,
        """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: script}
spec:
  provider: scripted
  script:
    - tool_calls: [{name: add, arguments: {a: 1, b: 2}}]
    - text: not allowed
""",
        ADD_TOOL,
        """
apiVersion: corral/v1
kind: ToolPermission
metadata: {name: only-mcp}
spec: {tools: ["mcp:*"], effect: allow}
---
apiVersion: corral/v1
kind: AgentRole
metadata: {name: reader}
spec: {permissions: [only-mcp]}
""",
        agent("script", extra="  roles: [reader]"),
    )
    record = await run_agent(store, settings, "helper", "1+2?")
    [result] = [
        e.data.to_dict()
        for e in await store.list_events(record.id)
        if e.type is EventType.TOOL_RESULT
    ]
    assert result["error"]["code"] == "permission_denied"


async def test_mcp_server_hanging_on_initialize_fails_the_run_cleanly(
    env: tuple[Store, Settings], tmp_path: Path
) -> None:
    store, settings = env
    pids = tmp_path / "pids.txt"
    await apply(
        store,
        SCRIPTED_MCP_AND_EXEC,
        f"""
apiVersion: corral/v1
kind: McpServer
metadata: {{name: stuck}}
spec:
  transport: stdio
  command: ["{sys.executable}", "{HANG_MCP}", "{pids}"]
  init_timeout_seconds: 1
""",
        agent("script", tools='["mcp:stuck/*"]'),
    )
    started = time.monotonic()
    record = await run_agent(store, settings, "helper", "go")
    assert time.monotonic() - started < 10
    assert record.state is RunState.FAILED
    assert record.error is not None and "stuck" in record.error["message"]
    assert (await store.get_run(record.id)) is not None


async def test_the_agents_tool_choice_goes_out_with_the_model_facing_name(
    env: tuple[Store, Settings], fake_openai: FakeOpenAIServer
) -> None:
    store, settings = env
    fake_openai.add_reply(FakeReply(text="no call needed"))
    mcp = f"""
apiVersion: corral/v1
kind: McpServer
metadata: {{name: calc}}
spec: {{transport: stdio, command: ["{sys.executable}", "{CALC_MCP}"]}}
"""
    await apply(
        store,
        endpoint("fake", fake_openai.base_url),
        ADD_TOOL,
        mcp,
        agent(
            "fake",
            tools='[add, "mcp:calc/shout"]',
            extra="  model_settings: {tool_choice: {name: 'mcp:calc/shout'}}",
        ),
    )
    record = await run_agent(store, settings, "helper", "shout hi")

    assert record.state is RunState.SUCCEEDED, record.error
    sent = fake_openai.requests[0].json
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "calc__shout"}}

    await apply(store, agent("fake", extra="  model_settings: {tool_choice: {name: nope}}"))
    record = await run_agent(store, settings, "helper", "hi")
    assert record.state is RunState.FAILED
    assert record.error is not None
    assert "tool_choice names 'nope', which is not one of its tools" in record.error["message"]
