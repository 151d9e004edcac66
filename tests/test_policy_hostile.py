"""A namespace's admin against the server: secure defaults outside ``default``, python
tools in the sandbox, and the network rule over every outbound tool kind.

Real store, real bubblewrap sandbox, real subprocesses, a real HTTP service on the
host's loopback and a real ``corral serve``; the operator's settings as the environment
gives them.
"""

from __future__ import annotations

import http.server
import json
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest
import wasmtime

from cli_harness import invoke
from corral.core.errors import ConfigurationError, ResourceError, ToolError
from corral.core.runs import RunState
from corral.core.settings import Settings
from corral.core.tokens import Role
from corral.resources.loader import load_text
from corral.runtime.builder import AgentBuilder
from corral.runtime.local import run_agent
from corral.store import Store
from corral.tools.base import Tool, ToolContext
from corral.tools.exec import ExecTool
from corral.tools.python import PythonTool
from corral.tools.python_sandbox import SandboxedPythonTool
from policy_documents import agent, post_yaml
from sandboxing import require_bwrap, sandbox_host
from server_harness import LiveServer

TESTS = Path(__file__).parent
HOSTILE = TESTS / "tool_programs" / "hostile.py"
PYTHON_TOOLS = TESTS / "tool_programs" / "python_tools"
TENANT = "acme"

MODEL = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: m}
spec: {provider: scripted, script: [{text: done}]}
"""


def exec_tool(isolation: str = "{}", name: str = "hostile") -> str:
    return f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: {name}}}
spec:
  type: exec
  parameters: {{type: object}}
  exec:
    command: ["{sys.executable}", "{HOSTILE}"]
    isolation: {isolation}
"""


def python_tool(function: str, extra: str = "", name: str = "reach") -> str:
    return f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: {name}}}
spec:
  type: python
  python: {{function: "reach:{function}", path: "{PYTHON_TOOLS}"{extra}}}
"""


def outbound_tools(url: str) -> str:
    return f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: web}}
spec:
  type: http
  parameters: {{type: object}}
  http: {{url: "{url}", allow_private: true}}
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: peer}}
spec:
  type: a2a
  a2a: {{url: "{url}", allow_private: true}}
---
apiVersion: corral/v1
kind: McpServer
metadata: {{name: remote}}
spec: {{transport: streamable-http, url: "{url}/mcp"}}
"""


class _LoopbackService(http.server.BaseHTTPRequestHandler):
    """What listens on the host's loopback: it answers any POST with its secret."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"secret": "of a loopback service"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def loopback_service() -> Iterator[int]:
    """A real HTTP service on the host's loopback: its port."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _LoopbackService)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()


def namespace_policy(spec: str, namespace: str = TENANT) -> str:
    return f"""
apiVersion: corral/v1
kind: NamespacePolicy
metadata: {{name: default, namespace: {namespace}}}
spec: {spec}
"""


async def apply(store: Store, *docs: str, namespace: str = TENANT) -> None:
    batch = load_text("---".join(docs), "policy.yaml", default_namespace=namespace)
    await store.apply(batch)


def context(workspace: Path, namespace: str = TENANT) -> ToolContext:
    return ToolContext("run-1", "helper", namespace, "call-1", "run-1:1:call-1", workspace)


async def built_tool(
    store: Store, settings: Settings, stack: AsyncExitStack, namespace: str = TENANT
) -> tuple[Tool, Path]:
    host = sandbox_host(settings.home)
    builder = AgentBuilder(store, settings, namespace, sandbox_host=host)
    built = await builder.build("helper", stack)
    (governed,) = built.toolset.by_name.values()
    return governed.tool, built.workspace


@pytest.fixture
def secrets_of_the_server(env: tuple[Store, Settings]) -> list[str]:
    """What a tool must not read: the server's secret key and admin token files."""
    _, settings = env
    for name in ("secret.key", "admin.token"):
        (settings.home / name).write_text(f"the server's {name}\n")
        (settings.home / name).chmod(0o600)
    return [str(settings.home / "secret.key"), str(settings.home / "admin.token")]


# --------------------------------------------------------------------------- secure by default


async def test_a_tenant_without_a_policy_may_not_run_a_tool_outside_the_sandbox(
    env: tuple[Store, Settings],
) -> None:
    store, _ = env
    with pytest.raises(ResourceError) as caught:
        await apply(store, MODEL, exec_tool("{mode: none}"), agent("[hostile]"))
    text = str(caught.value)
    assert "requires a sandbox" in text and "spec.tools[0]" in text
    assert "namespace other than 'default'" in text  # says where the rule comes from
    assert await store.get_resource(TENANT, "Agent", "helper") is None
    # an agent cannot loosen the restricted default either
    with pytest.raises(ResourceError, match="'off' would loosen") as caught:
        await apply(store, MODEL, exec_tool(), agent("[hostile]", "{isolation: off}"))
    assert "spec.execution.isolation" in str(caught.value)


async def test_the_default_namespace_keeps_the_permissive_defaults(
    env: tuple[Store, Settings],
) -> None:
    store, _ = env
    await apply(store, MODEL, exec_tool("{mode: none}"), agent("[hostile]"), namespace="default")
    assert await store.get_resource("default", "Agent", "helper") is not None


async def test_a_tenants_auto_tool_runs_sandboxed_and_reads_no_secret(
    env: tuple[Store, Settings], secrets_of_the_server: list[str]
) -> None:
    store, settings = env
    require_bwrap(sandbox_host(settings.home))
    await apply(store, MODEL, exec_tool(), agent("[hostile]"))
    async with AsyncExitStack() as stack:
        tool, workspace = await built_tool(store, settings, stack)
        assert isinstance(tool, ExecTool) and tool.isolation.mode == "sandbox"
        found = await tool.call(
            {"mode": "read", "paths": secrets_of_the_server}, context(workspace)
        )
    assert set(found.values()) == {"ENOENT"}


async def test_the_operator_relaxes_a_tenant_explicitly(env: tuple[Store, Settings]) -> None:
    store, settings = env
    await apply(store, namespace_policy("{execution: {isolation: preferred}}"))
    await apply(store, MODEL, exec_tool("{mode: none}"), agent("[hostile]"))
    async with AsyncExitStack() as stack:
        tool, _ = await built_tool(store, settings, stack)
        assert isinstance(tool, ExecTool) and tool.isolation.mode == "none"


async def test_a_policy_that_sets_only_the_network_keeps_the_restricted_isolation(
    env: tuple[Store, Settings],
) -> None:
    store, _ = env
    await apply(store, namespace_policy("{execution: {network: deny}}"))
    with pytest.raises(ResourceError, match="requires a sandbox"):
        await apply(store, MODEL, exec_tool("{mode: none}"), agent("[hostile]"))


def test_describe_names_the_restricted_default(tmp_path: Path) -> None:
    env = {"CORRAL_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    docs = tmp_path / "docs.yaml"
    docs.write_text("---".join([MODEL, exec_tool(), agent("[hostile]")]))
    done = invoke(["apply", "-n", TENANT, "-f", str(docs)], env)
    assert done.returncode == 0, done.stderr
    described = invoke(["describe", "-n", TENANT, "agent", "helper"], env)
    assert described.returncode == 0, described.stderr
    assert "isolation:          required (restricted)" in described.stdout


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("home")) as server:
        yield server


def test_a_tenant_admin_over_the_api_gets_422_for_isolation_none(live: LiveServer) -> None:
    tenant = live.mint(TENANT, Role.ADMIN)
    body = "---".join([MODEL, exec_tool("{mode: none}"), agent("[hostile]")])
    with live.client(tenant) as client:
        answer = post_yaml(client, body)
        assert answer.status_code == 422, answer.text
        (problem,) = answer.json()["errors"]
        assert problem["field"] == "spec.tools[0]"
        assert "requires a sandbox" in problem["reason"]
        # nor can the tenant relax itself
        relax = namespace_policy("{execution: {isolation: off}}")
        answer = post_yaml(client, relax)
        assert answer.status_code == 403 and answer.json()["code"] == "forbidden"


def test_a_tenants_wasm_tool_over_its_namespaces_cap_is_422_at_the_field(
    live: LiveServer, tmp_path: Path
) -> None:
    module = tmp_path / "probe.wasm"
    module.write_bytes(wasmtime.wat2wasm((TESTS / "tool_programs/wasm/probe.wat").read_text()))
    with live.client(live.admin) as client:
        cap = namespace_policy("{wasm: {max_memory_mb: 16}}", namespace="wasm-tenant")
        answer = post_yaml(client, cap)
        assert answer.status_code == 200, answer.text
    tool = f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: big}}
spec:
  type: wasm
  parameters: {{type: object}}
  wasm: {{module: "{module}", entrypoint: echo, max_memory_mb: 4096}}
"""
    with live.client(live.mint("wasm-tenant", Role.ADMIN)) as client:
        answer = post_yaml(client, tool)
    assert answer.status_code == 422, answer.text
    (problem,) = answer.json()["errors"]
    assert problem["field"] == "spec.wasm.max_memory_mb"
    assert "wasm.max_memory_mb (16)" in problem["reason"]


# --------------------------------------------------------------------------- python tools


async def test_a_tenants_python_tool_runs_in_the_sandbox_and_reads_no_secret(
    env: tuple[Store, Settings], secrets_of_the_server: list[str]
) -> None:
    store, settings = env
    require_bwrap(sandbox_host(settings.home))
    await apply(store, MODEL, python_tool("read"), agent("[reach]"))
    async with AsyncExitStack() as stack:
        tool, workspace = await built_tool(store, settings, stack)
        assert isinstance(tool, SandboxedPythonTool)
        assert tool.spec.parameters["properties"]["paths"]["type"] == "array"  # from the sandbox
        found = await tool.call({"paths": secrets_of_the_server}, context(workspace))
    assert set(found.values()) == {"FileNotFoundError"}
    # in the default namespace the same tool is the server, and reads them
    await apply(store, MODEL, python_tool("read"), agent("[reach]"), namespace="default")
    async with AsyncExitStack() as stack:
        tool, workspace = await built_tool(store, settings, stack, namespace="default")
        assert isinstance(tool, PythonTool)
        found = await tool.call({"paths": secrets_of_the_server}, context(workspace))
    assert set(found.values()) == {"read"}


async def test_a_sandboxed_python_tool_sees_none_of_the_servers_environment(
    env: tuple[Store, Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, settings = env
    require_bwrap(sandbox_host(settings.home))
    monkeypatch.setenv("CORRAL_TEST_SERVER_ONLY", "a value of the server's")
    await apply(store, MODEL, python_tool("environment"), agent("[reach]"))
    async with AsyncExitStack() as stack:
        tool, workspace = await built_tool(store, settings, stack)
        names = ["CORRAL_TEST_SERVER_ONLY", "CORRAL_HOME", "CORRAL_RUN_ID"]
        found = await tool.call({"names": names}, context(workspace))
    assert found == {"CORRAL_TEST_SERVER_ONLY": None, "CORRAL_HOME": None, "CORRAL_RUN_ID": "run-1"}


async def test_the_server_never_imports_a_sandboxed_function(
    env: tuple[Store, Settings],
) -> None:
    store, settings = env
    require_bwrap(sandbox_host(settings.home))
    sys.modules.pop("reach", None)
    await apply(store, MODEL, python_tool("where"), agent("[reach]"))
    async with AsyncExitStack() as stack:
        tool, workspace = await built_tool(store, settings, stack)
        answer = await tool.call({}, context(workspace))
    assert "reach" not in sys.modules
    # the context reaches the function, as the sandbox sees it; its stdout prints did not
    # become the answer (the module prints a forged one when it is imported)
    assert answer["run_id"] == "run-1" and answer["workspace"] == "/workspace"
    assert answer["pid"] != os.getpid()


async def test_a_sandboxed_functions_prints_cannot_forge_its_answer(
    env: tuple[Store, Settings],
) -> None:
    store, settings = env
    require_bwrap(sandbox_host(settings.home))
    await apply(store, MODEL, python_tool("forge"), python_tool("fail", name="failing"))
    await apply(store, agent("[reach]"), agent("[failing]", name="other"))
    async with AsyncExitStack() as stack:
        tool, workspace = await built_tool(store, settings, stack)
        assert await tool.call({"text": "mine"}, context(workspace)) == "mine"
    host = sandbox_host(settings.home)
    async with AsyncExitStack() as stack:
        built = await AgentBuilder(store, settings, TENANT, sandbox_host=host).build("other", stack)
        (governed,) = built.toolset.by_name.values()
        with pytest.raises(ToolError) as caught:
            await governed.tool.call({"reason": "no"}, context(built.workspace))
    assert (caught.value.code, caught.value.info.reason) == ("execution_failed", "ValueError: no")


@pytest.mark.parametrize(
    ("function", "code", "reason"),
    [
        ("vanish", "execution_failed", "python exited with code 3"),
        ("odd_code", "execution_failed", "a code of its own"),
    ],
)
async def test_a_sandboxed_function_that_dies_or_invents_a_code_is_execution_failed(
    env: tuple[Store, Settings], function: str, code: str, reason: str
) -> None:
    store, settings = env
    require_bwrap(sandbox_host(settings.home))
    await apply(store, MODEL, python_tool(function), agent("[reach]"))
    async with AsyncExitStack() as stack:
        tool, workspace = await built_tool(store, settings, stack)
        with pytest.raises(ToolError) as caught:
            await tool.call({}, context(workspace))
    assert caught.value.code == code
    assert reason in caught.value.info.reason
    assert "Traceback" not in caught.value.info.reason


def test_a_sandboxed_python_tool_cannot_be_inline() -> None:
    with pytest.raises(ResourceError, match="isolation 'sandbox' cannot"):
        load_text(python_tool("read", ", isolation: sandbox, inline: true"), "t.yaml")


def _runners() -> list[int]:
    """The pids of sandboxed python runners alive now."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if b"corral.tools.python_runner" in command:
            found.append(int(entry))
    return found


async def test_a_timed_out_sandboxed_function_is_killed(env: tuple[Store, Settings]) -> None:
    store, settings = env
    require_bwrap(sandbox_host(settings.home))
    spinning = python_tool("spin").replace("type: python", "type: python\n  timeout_seconds: 1")
    await apply(store, MODEL, spinning, agent("[reach]"))
    async with AsyncExitStack() as stack:
        host = sandbox_host(settings.home)
        built = await AgentBuilder(store, settings, TENANT, sandbox_host=host).build(
            "helper", stack
        )
        (governed,) = built.toolset.by_name.values()
        errors: list[ToolError] = []

        async def spin() -> None:
            try:
                await governed.execute({}, context(built.workspace))
            except ToolError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(spin)
            with anyio.fail_after(30):  # the function runs in a process of its own
                while not _runners():
                    await anyio.sleep(0.01)
    assert [e.code for e in errors] == ["timeout"]
    assert _runners() == []  # the call's whole process tree went with it


async def test_a_python_module_in_corral_home_is_refused_at_build(
    env: tuple[Store, Settings],
) -> None:
    store, settings = env
    require_bwrap(sandbox_host(settings.home))
    planted = settings.home / "work" / "agents" / TENANT / "helper"
    planted.mkdir(parents=True)
    (planted / "planted.py").write_text("def f() -> str:\n    return 'ran'\n")
    tool = f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: reach}}
spec:
  type: python
  python: {{function: "planted:f", path: "{planted}"}}
"""
    await apply(store, MODEL, tool, agent("[reach]"))
    async with AsyncExitStack() as stack:
        with pytest.raises(ConfigurationError, match="CORRAL_HOME"):
            await built_tool(store, settings, stack)
    assert "planted" not in sys.modules


async def test_a_sandboxed_python_tool_fails_closed_without_bubblewrap(
    env: tuple[Store, Settings], tmp_path: Path
) -> None:
    store, settings = env
    await apply(store, MODEL, python_tool("read"), agent("[reach]"))
    no_bwrap = tmp_path / "empty-path"
    no_bwrap.mkdir()
    host = sandbox_host(settings.home, search_path=str(no_bwrap))
    async with AsyncExitStack() as stack:
        built = await AgentBuilder(store, settings, TENANT, sandbox_host=host).build(
            "helper", stack
        )
        (governed,) = built.toolset.by_name.values()
        with pytest.raises(ToolError) as caught:
            await governed.tool.call({"paths": []}, context(built.workspace))
    assert caught.value.code == "isolation_unavailable"


async def test_a_tenants_python_tool_answers_in_a_real_run(env: tuple[Store, Settings]) -> None:
    store, settings = env
    require_bwrap(sandbox_host(settings.home))
    model = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: m}
spec:
  provider: scripted
  script:
    - {tool_calls: [{name: reach, arguments: {names: [CORRAL_RUN_ID]}}]}
    - {text: done}
"""
    await apply(store, model, python_tool("environment"), agent("[reach]"))
    record = await run_agent(store, settings, "helper", "hi", namespace=TENANT)
    assert record.state is RunState.SUCCEEDED, record.error
    results = [e for e in await store.list_events(record.id) if e.type.value == "tool.result"]
    assert json.dumps(results[0].data.to_dict()).count(record.id) >= 1


# --------------------------------------------------------------------------- network rule


@pytest.mark.parametrize("tool", ["web", "peer", "mcp:remote/*"])
async def test_network_deny_refuses_every_outbound_tool_kind(
    env: tuple[Store, Settings], tool: str
) -> None:
    store, settings = env
    policy = namespace_policy("{execution: {network: deny}}")
    with pytest.raises(ResourceError) as caught:
        await apply(
            store, MODEL, outbound_tools("http://127.0.0.1:9"), policy, agent(f"['{tool}']")
        )
    assert "calls out over the network" in str(caught.value)
    assert "spec.tools[0]" in str(caught.value)
    # an agent stored before the policy fails its build, with the same reason
    await apply(store, MODEL, outbound_tools("http://127.0.0.1:9"), agent(f"['{tool}']"))
    await apply(store, policy)
    async with AsyncExitStack() as stack:
        with pytest.raises(ConfigurationError, match="calls out over the network"):
            await AgentBuilder(store, settings, TENANT).build("helper", stack)


async def test_an_http_tool_with_allow_private_does_not_reach_the_hosts_loopback(
    env: tuple[Store, Settings], monkeypatch: pytest.MonkeyPatch, loopback_service: int
) -> None:
    store, settings = env
    monkeypatch.delenv("CORRAL_ALLOWED_PRIVATE_DESTINATIONS", raising=False)
    url = f"http://127.0.0.1:{loopback_service}"
    await apply(store, MODEL, outbound_tools(url), agent("[web]"))
    async with AsyncExitStack() as stack:
        built = await AgentBuilder(store, settings, TENANT).build("helper", stack)
        (governed,) = built.toolset.by_name.values()
        with pytest.raises(ToolError) as caught:
            await governed.tool.call({}, context(built.workspace))
        assert caught.value.code == "blocked_destination"
        assert "CORRAL_ALLOWED_PRIVATE_DESTINATIONS=unset" in caught.value.info.reason
        # a list naming other private networks does not help
        monkeypatch.setenv("CORRAL_ALLOWED_PRIVATE_DESTINATIONS", "10.0.0.0/8, db.internal")
        with pytest.raises(ToolError, match=r"10\.0\.0\.0/8, db\.internal"):
            await governed.tool.call({}, context(built.workspace))
        # the operator lists the loopback: now it is reached
        monkeypatch.setenv("CORRAL_ALLOWED_PRIVATE_DESTINATIONS", "127.0.0.1/32")
        answer: Any = await governed.tool.call({}, context(built.workspace))
    assert answer["secret"] == "of a loopback service"


async def test_a_malformed_allow_list_allows_nothing_and_stops_a_server_at_start(
    env: tuple[Store, Settings], monkeypatch: pytest.MonkeyPatch, loopback_service: int
) -> None:
    store, settings = env
    monkeypatch.setenv("CORRAL_ALLOWED_PRIVATE_DESTINATIONS", "127.0.0.1/32, not a host!")
    with pytest.raises(ConfigurationError, match="'not a host!' is not an address"):
        Settings.from_env()
    await apply(
        store, MODEL, outbound_tools(f"http://127.0.0.1:{loopback_service}"), agent("[web]")
    )
    async with AsyncExitStack() as stack:
        built = await AgentBuilder(store, settings, TENANT).build("helper", stack)
        (governed,) = built.toolset.by_name.values()
        with pytest.raises(ToolError) as caught:
            await governed.tool.call({}, context(built.workspace))
    assert caught.value.code == "blocked_destination"
