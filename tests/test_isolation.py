"""Sandboxed ``exec`` tools, attacked by a real hostile program (tests/tool_programs/hostile.py).

Every test runs the program in a real bubblewrap sandbox over a fake ``CORRAL_HOME``
holding what a tool must never see: the master key, the admin token, the database and
another agent's workspace. Where bubblewrap does not work these tests skip, and in CI
they fail (tests/sandboxing.py).
"""

from __future__ import annotations

import http.server
import os
import secrets
import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import ValidationError

from corral.core.errors import ResourceError, ToolError
from corral.resources.isolation import IsolationLimits, IsolationSpec
from corral.resources.kinds import ExecToolSpec, McpServerSpec, ToolSpecModel
from corral.resources.loader import load_path, load_text
from corral.tools import exec as exec_tool
from corral.tools.base import ToolContext
from corral.tools.governance import GovernedTool, ToolPolicy
from corral.tools.sandbox.host import SandboxHost, find_pids_cgroup
from mcp_clients import CALC, connected
from sandboxing import PYTHON_PREFIX, require_bwrap, sandbox_host

HOSTILE = Path(__file__).parent / "tool_programs" / "hostile.py"
EXAMPLES = Path(__file__).parent.parent / "examples"


@dataclass
class Machine:
    """A fake CORRAL_HOME with one agent's workspace, and the sandbox host over it."""

    home: Path
    workspace: Path
    other_workspace: Path
    host: SandboxHost

    def context(self) -> ToolContext:
        return ToolContext(
            run_id="run-1",
            agent="me",
            namespace="default",
            call_id="call-1",
            idempotency_key="run-1:1:call-1",
            workspace=self.workspace,
        )

    def tool(self, *, timeout: float = 30.0, **isolation: Any) -> GovernedTool:
        spec = ToolSpecModel(
            type="exec",
            parameters={"type": "object"},
            timeout_seconds=timeout,
            exec=ExecToolSpec(
                command=[sys.executable, str(HOSTILE)],
                isolation=IsolationSpec.model_validate({"mode": "sandbox", **isolation}),
            ),
        )
        tool = exec_tool.create("hostile", spec, {}, sandbox_host=self.host)
        return GovernedTool(tool, ToolPolicy.of_tool(spec))

    async def call(self, arguments: dict[str, Any], **isolation: Any) -> Any:
        return await self.tool(**isolation).execute(arguments, self.context())


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    home = (tmp_path / "corral-home").resolve()
    workspaces = home / "work" / "agents" / "default"
    (workspaces / "me").mkdir(parents=True)
    (workspaces / "other").mkdir()
    (home / "secret.key").write_text("MASTER-KEY")
    (home / "admin.token").write_text("ADMIN-TOKEN")
    (home / "corral.db").write_text("SQLITE-DB")
    (workspaces / "other" / "notes.txt").write_text("OTHER-AGENT")
    host = sandbox_host(home)
    require_bwrap(host)
    return Machine(home, workspaces / "me", workspaces / "other", host)


async def test_corral_home_and_host_files_are_not_there(machine: Machine) -> None:
    home = machine.home
    paths = [
        str(home / "secret.key"),
        str(home / "admin.token"),
        str(home / "corral.db"),
        str(machine.other_workspace / "notes.txt"),
        "/workspace/../other/notes.txt",
        str(Path.home() / ".ssh" / "id_rsa"),
        "/etc/shadow",
    ]
    result = await machine.call({"mode": "read", "paths": paths})
    assert result == dict.fromkeys(paths, "ENOENT")
    listed = await machine.call(
        {"mode": "list", "paths": [str(home), str(Path.home()), "/workspace"]}
    )
    assert listed[str(home)] == "ENOENT"
    # the server user's home is absent, or only the way to an allowed bind (pyenv's python)
    toward = (
        PYTHON_PREFIX.relative_to(Path.home()).parts[:1]
        if Path.home() in PYTHON_PREFIX.parents
        else ()
    )
    assert listed[str(Path.home())] in ("ENOENT", list(toward))
    assert listed["/workspace"] == ["home", "tmp"]  # its own workspace, nothing else


async def test_no_host_process_environment_is_readable(
    machine: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = f"HOST-SECRET-{secrets.token_hex(8)}"
    monkeypatch.setenv("CLOUD_KEY", marker)  # in the environment of this (the server's) process
    found = await machine.call({"mode": "environ", "marker": marker})
    assert found == []
    parent = await machine.call(
        {"mode": "read", "paths": ["/proc/1/environ", f"/proc/{os.getpid()}/environ"]}
    )
    assert marker not in str(parent)
    # the sandbox's /proc is its own: the server's pid is not there
    assert parent[f"/proc/{os.getpid()}/environ"] == "ENOENT" or os.getpid() < 10


async def test_without_network_nothing_on_the_host_answers(machine: Machine) -> None:
    with _http_server() as port:
        for target in (5432, port):
            answer = await machine.call({"mode": "connect", "host": "127.0.0.1", "port": target})
            assert answer == "ECONNREFUSED"  # its own loopback, where nothing listens


async def test_with_network_a_local_server_answers(machine: Machine) -> None:
    with _http_server() as port:
        body = await machine.call(
            {"mode": "fetch", "url": f"http://127.0.0.1:{port}/"}, network=True
        )
    assert body == "hello from the host"


async def test_writes_land_only_in_the_workspace_and_tmp(machine: Machine) -> None:
    outside = [str(machine.home / "owned"), "/usr/owned", "/etc/owned", "/owned"]
    result = await machine.call(
        {"mode": "write", "paths": [*outside, "/workspace/mine", "/tmp/scratch"]}
    )
    assert all(result[p] in ("ENOENT", "EROFS", "EACCES", "EPERM") for p in outside), result
    assert result["/workspace/mine"] == result["/tmp/scratch"] == "written"
    assert (machine.workspace / "mine").read_text() == "owned"
    assert not any(Path(p).exists() for p in outside)  # nothing reached the host


async def test_a_read_only_workspace_refuses_writes(machine: Machine) -> None:
    (machine.workspace / "data.txt").write_text("given")
    result = await machine.call({"mode": "read", "paths": ["/workspace/data.txt"]}, workspace="ro")
    assert result == {"/workspace/data.txt": "read:given"}
    written = await machine.call({"mode": "write", "paths": ["/workspace/x"]}, workspace="ro")
    assert written == {"/workspace/x": "EROFS"}


def _processes_with(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


async def test_a_setsid_daemon_dies_with_the_timed_out_call(machine: Machine) -> None:
    token = f"corral-daemon-{secrets.token_hex(6)}"
    tool = machine.tool(timeout=2.0)
    errors: list[ToolError] = []

    async def call() -> None:
        try:
            await tool.execute({"mode": "daemon", "token": token}, machine.context())
        except ToolError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as group:
        group.start_soon(call)
        with anyio.fail_after(10):
            while not _processes_with(token):  # the daemon runs, seen from the host
                await anyio.sleep(0.02)
    assert [e.code for e in errors] == ["timeout"]
    with anyio.fail_after(5):
        while _processes_with(token):
            await anyio.sleep(0.02)


async def test_a_setsid_daemon_dies_when_the_program_exits(machine: Machine) -> None:
    token = f"corral-daemon-{secrets.token_hex(6)}"
    assert await machine.call({"mode": "daemon", "token": token, "exit": True}) == "started"
    with anyio.fail_after(5):  # its PID namespace ended with the program
        while _processes_with(token):
            await anyio.sleep(0.02)


async def test_a_fork_bomb_hits_max_processes(machine: Machine) -> None:
    with pytest.raises(ToolError) as caught:
        await machine.call({"mode": "forks", "count": 60}, limits={"max_processes": 8})
    assert caught.value.code == "resource_exhausted"
    assert caught.value.info.details["limit"] == "max_processes"
    assert "max_processes" in caught.value.info.reason


async def test_the_pids_cgroup_of_a_call_is_removed_after_it(machine: Machine) -> None:
    root = find_pids_cgroup()
    if os.geteuid() != 0 or root is None:
        pytest.skip("a pids cgroup is only made for a server running as root")
    parent = root / f"corral-test-{secrets.token_hex(6)}"  # this test's own, to count in
    parent.mkdir()
    try:
        machine.host = replace(machine.host, pids_cgroup=parent)
        with pytest.raises(ToolError):
            await machine.call({"mode": "forks", "count": 60}, limits={"max_processes": 8})
        assert await machine.call({"mode": "forks", "count": 2}, limits={"max_processes": 8}) == 2
        assert [p.name for p in parent.iterdir() if p.is_dir()] == []
    finally:
        parent.rmdir()


async def test_memory_past_memory_mb_is_resource_exhausted(machine: Machine) -> None:
    with pytest.raises(ToolError) as caught:
        await machine.call({"mode": "memory", "mb": 512}, limits={"memory_mb": 128})
    assert caught.value.code == "resource_exhausted"
    assert caught.value.info.details["limit"] == "memory_mb"
    # under the limit the same program answers
    assert await machine.call({"mode": "memory", "mb": 8}, limits={"memory_mb": 128}) == 8 << 20


async def test_cpu_past_cpu_seconds_is_resource_exhausted(machine: Machine) -> None:
    with pytest.raises(ToolError) as caught:
        await machine.call({"mode": "spin"}, limits={"cpu_seconds": 1})
    assert caught.value.info.details["limit"] == "cpu_seconds"


async def test_a_file_past_max_file_mb_is_resource_exhausted(machine: Machine) -> None:
    with pytest.raises(ToolError) as caught:
        await machine.call({"mode": "bigfile", "mb": 8}, limits={"max_file_mb": 2})
    assert caught.value.info.details["limit"] == "max_file_mb"


async def test_wall_seconds_stops_the_call_as_resource_exhausted(machine: Machine) -> None:
    with pytest.raises(ToolError) as caught:
        await machine.call({"mode": "daemon", "token": "wall"}, limits={"wall_seconds": 0.5})
    assert caught.value.code == "resource_exhausted"
    assert caught.value.info.details == {"limit": "wall_seconds"}


async def test_sandbox_mode_without_bwrap_fails_closed(tmp_path: Path) -> None:
    host = sandbox_host(tmp_path, search_path=str(tmp_path / "no-bwrap-here"))
    assert not host.probe().works
    spec = ToolSpecModel(
        type="exec",
        parameters={"type": "object"},
        exec=ExecToolSpec(
            command=[sys.executable, str(HOSTILE)], isolation=IsolationSpec(mode="sandbox")
        ),
    )
    tool = exec_tool.create("hostile", spec, {}, sandbox_host=host)
    context = Machine(tmp_path, tmp_path, tmp_path, host).context()
    with pytest.raises(ToolError) as caught:
        await tool.call({"mode": "read", "paths": []}, context)
    assert caught.value.code == "isolation_unavailable"
    assert "bwrap was not found" in caught.value.info.reason
    # auto falls back to running unsandboxed, and says so
    auto = spec.model_copy(
        update={"exec": spec.exec.model_copy(update={"isolation": IsolationSpec()})}
    )  # type: ignore[union-attr]
    unsandboxed = exec_tool.create("hostile", auto, {}, sandbox_host=host)
    assert isinstance(unsandboxed, exec_tool.ExecTool) and unsandboxed.isolation.mode == "none"
    assert await unsandboxed.call({"mode": "read", "paths": []}, context) == {}


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("{home}", "CORRAL_HOME"),
        ("{home}/workspaces", "CORRAL_HOME"),
        ("{parent}", "CORRAL_HOME"),  # a parent of CORRAL_HOME shows it too
        ("/proc", "/proc"),
        ("/proc/1", "/proc"),
        ("/etc", "not under a directory the operator allowed"),
        ("relative/path", "absolute"),
        ("{allowed}/../etc", "'..'"),
    ],
)
def test_binds_of_corral_home_proc_or_unallowed_paths_are_refused_at_apply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str, why: str
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("CORRAL_HOME", str(home))
    monkeypatch.setenv("CORRAL_SANDBOX_ALLOWED_PATHS", f"{tmp_path}:{PYTHON_PREFIX}")
    bind = path.format(home=home, parent=tmp_path, allowed=tmp_path)
    for field in ("read_only_paths", "writable_paths"):
        with pytest.raises(ValidationError, match=why):
            IsolationSpec.model_validate({field: [bind]})
    allowed = tmp_path / "data"
    assert IsolationSpec.model_validate({"read_only_paths": [str(allowed)]}).read_only_paths


def test_an_applied_tool_binding_proc_is_refused_naming_the_field(tmp_path: Path) -> None:
    document = f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: peek}}
spec:
  type: exec
  parameters: {{type: object}}
  exec:
    command: ["{sys.executable}", "{HOSTILE}"]
    isolation: {{read_only_paths: [/proc/1]}}
"""
    with pytest.raises(ResourceError) as caught:
        load_text(document, base_dir=tmp_path)
    assert "spec.exec.isolation.read_only_paths" in str(caught.value)
    assert "never bound into a sandbox" in str(caught.value)


def test_stored_binds_are_checked_again_when_the_tool_is_built(tmp_path: Path) -> None:
    home = tmp_path / "home"
    stored = IsolationSpec.model_validate(
        {"mode": "sandbox", "read_only_paths": [str(home)]}, context={"stored": True}
    )
    spec = ToolSpecModel(
        type="exec",
        parameters={"type": "object"},
        exec=ExecToolSpec(command=[sys.executable, str(HOSTILE)], isolation=stored),
    )
    host = sandbox_host(home)
    require_bwrap(host)
    with pytest.raises(Exception, match="CORRAL_HOME"):
        exec_tool.create("hostile", spec, {}, sandbox_host=host)


async def test_the_demos_exec_tool_runs_sandboxed_by_default(machine: Machine) -> None:
    [word_count] = [
        r for r in load_path(EXAMPLES / "assistant.yaml") if r.resource.name == "word-count"
    ]
    spec = word_count.resource.spec
    assert isinstance(spec, ToolSpecModel) and spec.exec is not None
    assert spec.exec.isolation.mode == "auto"
    tool = exec_tool.create("word-count", spec, {}, sandbox_host=machine.host)
    assert isinstance(tool, exec_tool.ExecTool) and tool.isolation.mode == "sandbox"
    answer = await tool.call({"text": "hello big world"}, machine.context())
    assert answer == {"words": 3, "characters": 15}


def test_ci_fails_instead_of_skipping_without_bwrap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = sandbox_host(tmp_path, search_path=str(tmp_path))
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="bwrap was not found"):
        require_bwrap(missing)
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        require_bwrap(missing)


async def test_a_stdio_mcp_server_runs_sandboxed(machine: Machine) -> None:
    spec = McpServerSpec(
        transport="stdio", command=[sys.executable, CALC], isolation=IsolationSpec(mode="sandbox")
    )
    async with connected("calc", spec, {}, machine.workspace, machine.host) as tools:
        ctx = machine.context()
        assert await tools["mcp:calc/add"].call({"a": 2, "b": 40}, ctx) == {"result": 42}
        env = dict(
            line.split("=", 1)
            for line in (await tools["mcp:calc/environment"].call({}, ctx)).splitlines()
        )
        assert (env["HOME"], env["PWD"]) == ("/workspace/home", "/workspace")
        # a PID namespace of its own: bubblewrap's init is 1, the server right after it
        assert int(await tools["mcp:calc/pid"].call({}, ctx)) < 10


async def test_a_stdio_mcp_server_that_must_be_sandboxed_fails_closed_without_bwrap(
    tmp_path: Path,
) -> None:
    host = sandbox_host(tmp_path, search_path=str(tmp_path))
    spec = McpServerSpec(
        transport="stdio", command=[sys.executable, CALC], isolation=IsolationSpec(mode="sandbox")
    )
    with pytest.raises(ToolError) as caught:
        async with connected("calc", spec, {}, tmp_path, host):
            pass
    assert caught.value.code == "isolation_unavailable"


def test_isolation_is_only_for_stdio_mcp_servers() -> None:
    with pytest.raises(ValidationError, match="'isolation' is for transport 'stdio'"):
        McpServerSpec(
            transport="streamable-http",
            url="https://mcp.example.com/",
            isolation=IsolationSpec(network=True),
        )
    # a stored document spells the defaults out: it loads again
    http = McpServerSpec(transport="streamable-http", url="https://mcp.example.com/")
    stored = http.model_dump(mode="json", exclude_none=True)
    assert McpServerSpec.model_validate(stored, context={"stored": True}) == http


def test_limits_are_validated() -> None:
    with pytest.raises(ValidationError):
        IsolationLimits.model_validate({"memory_mb": 0})
    with pytest.raises(ValidationError):
        IsolationSpec.model_validate({"mode": "chroot"})
    with pytest.raises(ValidationError, match="'cwd' is inside the workspace"):
        ExecToolSpec(command=["true"], cwd="jobs", isolation=IsolationSpec(workspace="none"))


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello from the host"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _http_server:
    """A local HTTP server on a free port for the length of a ``with``."""

    def __enter__(self) -> int:
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return int(self.httpd.server_address[1])

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
