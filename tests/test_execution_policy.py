"""Execution policies: ``Agent.spec.execution`` over a namespace's ``NamespacePolicy``.

Applied through the real store (embedded), the real server (remote) and the CLI in
both modes; built by the real :class:`~corral.runtime.builder.AgentBuilder`; the
sandbox made unavailable through the sandbox host seam (a ``PATH`` without ``bwrap``).
"""

from __future__ import annotations

import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from cli_harness import invoke
from corral.core.errors import ConfigurationError, ResourceError, ToolError
from corral.core.events import EventType
from corral.core.runs import RunState
from corral.core.settings import Settings
from corral.core.tokens import Role
from corral.resources.execution import (
    EffectivePolicy,
    ExecutionSpec,
    effective_policy,
    isolation_under,
)
from corral.resources.isolation import IsolationSpec
from corral.resources.loader import load_text
from corral.runtime.builder import AgentBuilder
from corral.runtime.local import run_agent
from corral.store import Store
from corral.tools.base import ToolContext
from corral.tools.exec import ExecTool
from policy_documents import agent, post_yaml
from sandboxing import require_bwrap, sandbox_host
from server_harness import LiveServer
from test_isolation import _http_server

TESTS = Path(__file__).parent
HOSTILE = TESTS / "tool_programs" / "hostile.py"

MODEL = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: m}
spec: {provider: scripted, script: [{text: done}]}
"""
PY_TOOL = f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: add}}
spec:
  type: python
  python: {{function: "agent_tools:add", path: "{TESTS}"}}
"""


def exec_tool(isolation: str = "{}") -> str:
    return f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: hostile}}
spec:
  type: exec
  parameters: {{type: object}}
  exec:
    command: ["{sys.executable}", "{HOSTILE}"]
    isolation: {isolation}
"""


def namespace_policy(execution: str, name: str = "default", namespace: str = "default") -> str:
    return f"""
apiVersion: corral/v1
kind: NamespacePolicy
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  execution: {execution}
"""


async def apply(store: Store, *docs: str) -> None:
    await store.apply(load_text("---".join(docs), "policy.yaml"))


def context(workspace: Path) -> ToolContext:
    return ToolContext("run-1", "helper", "default", "call-1", "run-1:1:call-1", workspace)


# --------------------------------------------------------------------------- the policy itself


def test_precedence_is_agent_over_namespace_over_default() -> None:
    assert effective_policy(None, None) == EffectivePolicy(
        sources=(
            ("isolation", "default"),
            ("network", "default"),
            ("allowed_tool_types", "default"),
        )
    )
    namespace = ExecutionSpec(isolation="required", network="deny", allowed_tool_types=["http"])
    own = ExecutionSpec(allowed_tool_types=["exec", "http"])
    policy = effective_policy(own, namespace)
    assert (policy.isolation, policy.network, policy.allowed_tool_types) == (
        "required",
        "deny",
        ("exec", "http"),
    )
    assert dict(policy.sources) == {
        "isolation": "namespace",
        "network": "namespace",
        "allowed_tool_types": "agent",
    }
    assert effective_policy(ExecutionSpec(isolation="off"), None).isolation == "off"


def test_policy_turns_a_tools_isolation_tighter_or_looser() -> None:
    deny = EffectivePolicy(network="deny")
    assert isolation_under(deny, IsolationSpec(network=True)).network is False
    required = EffectivePolicy(isolation="required")
    assert isolation_under(required, IsolationSpec()).mode == "sandbox"
    off = EffectivePolicy(isolation="off")
    assert isolation_under(off, IsolationSpec()).mode == "none"
    assert isolation_under(off, IsolationSpec(mode="sandbox")).mode == "sandbox"
    assert isolation_under(EffectivePolicy(), IsolationSpec()) == IsolationSpec()


@pytest.mark.parametrize(
    ("execution", "reason"),
    [
        (
            "{allowed_tool_types: [python, shell]}",
            "allowed_tool_types[1]': Input should be 'python'",
        ),
        ("{allowed_tool_types: [python, python]}", "a tool type is listed twice"),
        ("{allowed_tool_types: [" + ", ".join(["exec"] * 5000) + "]}", "at most 6 items"),
        ("{isolation: sometimes}", "isolation"),
        ("{network: maybe}", "network"),
        ("{sandbox: true}", "sandbox"),
    ],
)
def test_malformed_execution_blocks_are_refused_with_the_field(execution: str, reason: str) -> None:
    with pytest.raises(ResourceError) as caught:
        load_text(agent("[]", execution), "a.yaml")
    assert reason in str(caught.value)
    assert "spec.execution" in str(caught.value)


def test_a_namespace_policy_is_validated_like_an_agents_block() -> None:
    with pytest.raises(ValidationError):
        ExecutionSpec.model_validate({"allowed_tool_types": ["python", "bash"]})


# --------------------------------------------------------------------------- apply, embedded


async def test_apply_refuses_a_tool_of_a_forbidden_type_naming_it(
    env: tuple[Store, Settings],
) -> None:
    store, _ = env
    with pytest.raises(ResourceError) as caught:
        await apply(store, MODEL, PY_TOOL, agent("[add]", "{allowed_tool_types: [exec, http]}"))
    text = str(caught.value)
    assert "tool 'add' is of type 'python'" in text and "spec.tools[0]" in text
    assert await store.get_resource("default", "Agent", "helper") is None  # all or nothing
    # the namespace's policy refuses it the same way, in the batch or stored
    await apply(store, MODEL, PY_TOOL, namespace_policy("{allowed_tool_types: [http, mcp]}"))
    with pytest.raises(ResourceError, match="tool 'add' is of type 'python'"):
        await apply(store, agent("[add]"))


async def test_an_agent_may_tighten_its_namespace_policy_but_not_loosen_it(
    env: tuple[Store, Settings],
) -> None:
    store, _ = env
    await apply(
        store,
        MODEL,
        PY_TOOL,
        namespace_policy("{isolation: required, network: deny, allowed_tool_types: [python]}"),
    )
    for loose, field in [
        ("{isolation: preferred}", "isolation"),
        ("{network: allow}", "network"),
        ("{allowed_tool_types: [python, exec]}", "allowed_tool_types"),
    ]:
        with pytest.raises(ResourceError) as caught:
            await apply(store, agent("[add]", loose))
        assert f"spec.execution.{field}" in str(caught.value)
        assert "loosen" in str(caught.value) or "does not allow exec" in str(caught.value)
    await apply(store, agent("[add]", "{isolation: required, allowed_tool_types: [python]}"))


async def test_required_refuses_a_tool_that_says_no_sandbox_at_apply(
    env: tuple[Store, Settings],
) -> None:
    store, _ = env
    with pytest.raises(ResourceError, match=r"isolation\.mode 'none'.*requires a sandbox"):
        await apply(
            store, MODEL, exec_tool("{mode: none}"), agent("[hostile]", "{isolation: required}")
        )
    with pytest.raises(ResourceError, match=r"isolation\.mode 'none'"):
        await apply(
            store,
            MODEL,
            exec_tool("{mode: none}"),
            namespace_policy("{isolation: required}"),
            agent("[hostile]"),
        )


async def test_mcp_servers_count_as_type_mcp_and_their_isolation_is_checked(
    env: tuple[Store, Settings],
) -> None:
    store, _ = env
    server = f"""
apiVersion: corral/v1
kind: McpServer
metadata: {{name: calc}}
spec:
  transport: stdio
  command: ["{sys.executable}", "{TESTS / "mcp_servers" / "calc_server.py"}"]
  isolation: {{mode: none}}
"""
    with pytest.raises(ResourceError) as caught:
        await apply(store, MODEL, server, agent("['mcp:calc/*']", "{allowed_tool_types: [exec]}"))
    assert "tool 'mcp:calc/*' is of type 'mcp'" in str(caught.value)
    with pytest.raises(ResourceError, match=r"'mcp:calc/\*' says isolation\.mode 'none'"):
        await apply(store, MODEL, server, agent("['mcp:calc/*']", "{isolation: required}"))
    # a dry run makes the same checks
    with pytest.raises(ResourceError, match="of type 'mcp'"):
        batch = "---".join([MODEL, server, agent("['mcp:calc/*']", "{allowed_tool_types: []}")])
        await store.apply(load_text(batch, "policy.yaml"), dry_run=True)
    await apply(store, MODEL, server, agent("['mcp:calc/*']", "{allowed_tool_types: [mcp]}"))


async def test_a_namespace_policy_has_one_name(env: tuple[Store, Settings]) -> None:
    store, _ = env
    with pytest.raises(ResourceError, match="a NamespacePolicy is named 'default'"):
        await apply(store, namespace_policy("{isolation: required}", name="strict"))


# --------------------------------------------------------------------------- build


async def test_a_policy_applied_after_the_agent_fails_its_build_with_a_config_error(
    env: tuple[Store, Settings],
) -> None:
    store, settings = env
    await apply(store, MODEL, PY_TOOL, exec_tool("{mode: none}"), agent("[add, hostile]"))
    await apply(store, namespace_policy("{allowed_tool_types: [exec]}"))
    record = await run_agent(store, settings, "helper", "hi")
    assert record.state is RunState.FAILED
    assert record.error is not None and record.error["code"] == "configuration_error"
    assert "tool 'add' is of type 'python'" in record.error["message"]
    # the other order's second case: a required policy meets a tool that says none
    await apply(store, namespace_policy("{isolation: required}"))
    async with AsyncExitStack() as stack:
        with pytest.raises(ConfigurationError, match=r"'hostile' says isolation\.mode 'none'"):
            await AgentBuilder(store, settings).build("helper", stack)


async def test_an_agent_looser_than_a_later_namespace_policy_fails_its_build(
    env: tuple[Store, Settings],
) -> None:
    store, settings = env
    await apply(store, MODEL, PY_TOOL, agent("[add]", "{isolation: off}"))
    await apply(store, namespace_policy("{isolation: required}"))
    async with AsyncExitStack() as stack:
        with pytest.raises(ConfigurationError, match="'off' would loosen"):
            await AgentBuilder(store, settings).build("helper", stack)


async def test_required_without_bubblewrap_fails_the_call_closed(
    env: tuple[Store, Settings], tmp_path: Path
) -> None:
    store, settings = env
    await apply(store, MODEL, exec_tool(), agent("[hostile]", "{isolation: required}"))
    no_bwrap = tmp_path / "empty-path"
    no_bwrap.mkdir()
    host = sandbox_host(settings.home, search_path=str(no_bwrap))
    async with AsyncExitStack() as stack:
        built = await AgentBuilder(store, settings, sandbox_host=host).build("helper", stack)
        (governed,) = built.toolset.by_name.values()
        with pytest.raises(ToolError) as caught:
            await governed.tool.call({"mode": "read", "paths": []}, context(built.workspace))
    assert caught.value.code == "isolation_unavailable"
    assert "bwrap was not found" in caught.value.info.reason


async def test_without_a_policy_auto_still_falls_back_to_no_sandbox(
    env: tuple[Store, Settings], tmp_path: Path
) -> None:
    store, settings = env
    await apply(store, MODEL, exec_tool(), agent("[hostile]"))
    host = sandbox_host(settings.home, search_path=str(tmp_path))
    async with AsyncExitStack() as stack:
        built = await AgentBuilder(store, settings, sandbox_host=host).build("helper", stack)
        (governed,) = built.toolset.by_name.values()
        assert isinstance(governed.tool, ExecTool) and governed.tool.isolation.mode == "none"


async def test_network_deny_overrides_a_tools_network_true(
    env: tuple[Store, Settings],
) -> None:
    store, settings = env
    host = sandbox_host(settings.home)
    require_bwrap(host)
    await apply(
        store,
        MODEL,
        exec_tool("{network: true}"),
        namespace_policy("{network: deny}"),
        agent("[hostile]"),
    )
    async with AsyncExitStack() as stack:
        built = await AgentBuilder(store, settings, sandbox_host=host).build("helper", stack)
        (governed,) = built.toolset.by_name.values()
        with _http_server() as port:
            answer = await governed.tool.call(
                {"mode": "connect", "host": "127.0.0.1", "port": port}, context(built.workspace)
            )
    assert answer == "ECONNREFUSED"  # the sandbox's own loopback: the host's is not there


async def test_run_start_records_the_effective_policy(env: tuple[Store, Settings]) -> None:
    store, settings = env
    await apply(
        store,
        MODEL,
        PY_TOOL,
        namespace_policy("{network: deny}"),
        agent("[add]", "{allowed_tool_types: [python]}"),
    )
    record = await run_agent(store, settings, "helper", "hi")
    assert record.state is RunState.SUCCEEDED, record.error
    start = (await store.list_events(record.id))[0]
    assert start.type is EventType.RUN_START
    assert start.data.execution == {
        "isolation": "preferred",
        "network": "deny",
        "allowed_tool_types": ["python"],
        "sources": {"isolation": "default", "network": "namespace", "allowed_tool_types": "agent"},
    }


# --------------------------------------------------------------------------- front doors


def _cli_env(home: Path, **extra: str) -> dict[str, str]:
    return {"CORRAL_HOME": str(home), "PATH": "/usr/bin:/bin", **extra}


def test_embedded_cli_apply_refusal_exits_2_and_describe_shows_the_policy(tmp_path: Path) -> None:
    env = _cli_env(tmp_path / "home")
    setup = tmp_path / "setup.yaml"
    setup.write_text("---".join([MODEL, PY_TOOL, namespace_policy("{isolation: required}")]))
    done = invoke(["apply", "-f", str(setup)], env)
    assert done.returncode == 0, done.stderr  # the store's owner may apply a NamespacePolicy
    bad = tmp_path / "bad.yaml"
    bad.write_text(agent("[add]", "{allowed_tool_types: [exec]}"))
    refused = invoke(["apply", "-f", str(bad)], env)
    assert refused.returncode == 2
    assert "tool 'add' is of type 'python'" in refused.stderr
    good = tmp_path / "good.yaml"
    good.write_text(agent("[add]", "{network: deny}"))
    assert invoke(["apply", "-f", str(good)], env).returncode == 0
    described = invoke(["describe", "agent", "helper"], env)
    assert described.returncode == 0, described.stderr
    assert "Execution (effective):" in described.stdout
    assert "isolation:          required (namespace)" in described.stdout
    assert "network:            deny (agent)" in described.stdout
    assert "allowed_tool_types: python, exec, http, mcp, wasm, a2a (default)" in described.stdout
    listed = invoke(["get", "namespacepolicies"], env)
    assert listed.returncode == 0 and "required" in listed.stdout


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with LiveServer(tmp_path_factory.mktemp("home")) as server:
        yield server


def test_a_tenant_admin_may_not_apply_or_delete_a_namespace_policy(live: LiveServer) -> None:
    tenant = live.mint("acme", Role.ADMIN)
    body = namespace_policy("{isolation: off}", namespace="acme")
    with live.client(tenant) as client:
        answer = post_yaml(client, body)
        assert answer.status_code == 403, answer.text
        assert answer.json()["code"] == "forbidden"
        assert "only an admin of namespace 'default'" in answer.json()["detail"]
        # nor for another namespace, nor by deleting the operator's
        other = namespace_policy("{isolation: off}", namespace="default")
        answer = post_yaml(client, other)
        assert answer.status_code == 403
        assert client.delete("/v1/resources/NamespacePolicy/default").status_code == 403


def test_the_operator_sets_a_tenants_policy_and_the_tenants_apply_obeys_it(
    live: LiveServer, tmp_path: Path
) -> None:
    body = namespace_policy("{allowed_tool_types: [exec, http]}", namespace="acme")
    with live.client(live.admin) as client:
        answer = post_yaml(client, body)
        assert answer.status_code == 200, answer.text
    tenant = live.mint("acme", Role.ADMIN)
    with live.client(tenant) as client:
        answer = client.post(
            "/v1/resources",
            content="---".join([MODEL, PY_TOOL, agent("[add]")]),
            headers={"content-type": "application/yaml"},
        )
    assert answer.status_code == 422, answer.text
    (problem,) = answer.json()["errors"]
    assert problem["field"] == "spec.tools[0]"
    assert "tool 'add' is of type 'python'" in problem["reason"]
    # the CLI, remote, says the same with exit code 2; a NamespacePolicy is refused (2)
    env = _cli_env(tmp_path / "empty", CORRAL_URL=live.url, CORRAL_TOKEN=tenant)
    docs = tmp_path / "docs.yaml"
    docs.write_text("---".join([MODEL, PY_TOOL, agent("[add]")]))
    refused = invoke(["apply", "-f", str(docs)], env)
    assert refused.returncode == 2 and "tool 'add' is of type 'python'" in refused.stderr
    policy = tmp_path / "policy.yaml"
    policy.write_text(namespace_policy("{isolation: off}", namespace="acme"))
    forbidden = invoke(["apply", "-f", str(policy)], env)
    assert forbidden.returncode == 2
    assert "only an admin of namespace 'default'" in forbidden.stderr
