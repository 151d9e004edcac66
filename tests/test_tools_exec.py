"""The ``exec`` tool kind, with a real program: locked environment, errors, process trees.

The process-tree tests run the program unsandboxed (``isolation: {mode: none}``): they
check the host-side tree that keeps hold of such programs, by host pids. What the
sandbox adds (a PID namespace that dies whole) is in ``tests/test_isolation.py``.

What every kind does (invalid input, timeouts, cancellation, the output cap, failures, the
idempotency key) is in ``tests/conformance/test_tool_kinds.py``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest

from corral.core.errors import ConfigurationError, ToolError
from corral.resources.isolation import IsolationSpec
from corral.resources.kinds import EnvValue, ExecToolSpec, ToolSpecModel
from corral.tools import exec as exec_tool
from corral.tools.base import Tool, ToolContext
from corral.tools.governance import GovernedTool, ToolPolicy
from corral.tools.sandbox.host import SandboxHost
from processes import alive
from sandboxing import require_bwrap

PROBE = Path(__file__).parent / "tool_programs" / "probe.py"
PARAMETERS = {"type": "object", "properties": {"mode": {"type": "string"}}}


def make(
    *,
    env: dict[str, str | EnvValue] | None = None,
    cwd: str | None = None,
    secrets: dict[str, str] | None = None,
    command: list[str] | None = None,
    mode: Literal["auto", "sandbox", "none"] = "none",
) -> Tool:
    spec = ToolSpecModel(
        type="exec",
        parameters=PARAMETERS,
        exec=ExecToolSpec(
            command=command or [sys.executable, str(PROBE)],
            env=env or {},
            cwd=cwd,
            isolation=IsolationSpec(mode=mode),
        ),
    )
    return exec_tool.create("probe", spec, secrets or {})


def context(workspace: Path) -> ToolContext:
    return ToolContext(
        run_id="run-7",
        agent="ops",
        namespace="default",
        call_id="call-3",
        idempotency_key="run-7:2:call-3",
        workspace=workspace,
    )


async def wait_for(path: Path, timeout: float = 10.0) -> str:
    with anyio.fail_after(timeout):
        while not path.exists() or not path.read_text():
            await anyio.sleep(0.02)
    return path.read_text()


async def test_host_environment_does_not_reach_the_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "host-secret")
    monkeypatch.setenv("SSH_AUTH_SOCK", "/tmp/agent.sock")
    monkeypatch.setenv("HOME", "/root/real-home")
    tool = make(
        env={"GREETING": "hi", "API_TOKEN": EnvValue(secret="token")}, secrets={"token": "s3cr3t"}
    )

    result: dict[str, Any] = await tool.call({"mode": "echo", "n": 1}, context(tmp_path))

    env = result["env"]
    assert set(env) == {
        "PATH", "LANG", "HOME", "TMPDIR", "GREETING", "API_TOKEN",
        "CORRAL_IDEMPOTENCY_KEY", "CORRAL_RUN_ID", "CORRAL_TOOL_CALL_ID", "CORRAL_PROCESS_TREE",
    }  # fmt: skip
    workspace = tmp_path.resolve()
    assert env["HOME"] == str(workspace / "home")
    assert env["TMPDIR"] == str(workspace / "tmp")
    assert (workspace / "home").is_dir() and (workspace / "tmp").is_dir()
    assert env["PATH"] == exec_tool.SAFE_PATH
    assert env["LANG"] == "C.UTF-8"
    assert env["API_TOKEN"] == "s3cr3t" and env["GREETING"] == "hi"
    assert env["CORRAL_RUN_ID"] == "run-7" and env["CORRAL_TOOL_CALL_ID"] == "call-3"
    assert result["cwd"] == str(workspace)
    assert result["arguments"] == {"mode": "echo", "n": 1}


async def test_tool_env_may_override_path_and_cwd_is_inside_workspace(tmp_path: Path) -> None:
    tool = make(env={"PATH": "/opt/tools/bin"}, cwd="jobs/a")
    result = await tool.call({"mode": "echo"}, context(tmp_path))
    assert result["env"]["PATH"] == "/opt/tools/bin"
    assert result["cwd"] == str(tmp_path.resolve() / "jobs" / "a")


async def test_a_sandboxed_program_sees_its_workspace_at_slash_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_bwrap(SandboxHost.from_env())
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "host-secret")
    tool = make(env={"GREETING": "hi"}, cwd="jobs/a", mode="auto")
    assert isinstance(tool, exec_tool.ExecTool) and tool.isolation.mode == "sandbox"

    result: dict[str, Any] = await tool.call({"mode": "echo"}, context(tmp_path))

    env = result["env"]
    assert set(env) == {
        "PATH", "LANG", "HOME", "TMPDIR", "GREETING", "PWD",
        "CORRAL_IDEMPOTENCY_KEY", "CORRAL_RUN_ID", "CORRAL_TOOL_CALL_ID", "CORRAL_PROCESS_TREE",
    }  # fmt: skip
    assert (env["HOME"], env["TMPDIR"]) == ("/workspace/home", "/tmp")
    assert result["cwd"] == env["PWD"] == "/workspace/jobs/a"
    assert (tmp_path / "jobs" / "a").is_dir()


async def test_plain_text_output_is_returned_as_text(tmp_path: Path) -> None:
    assert await make().call({"mode": "text"}, context(tmp_path)) == "hello from probe"


async def test_a_failed_programs_error_details_carry_its_exit_code_and_stderr(
    tmp_path: Path,
) -> None:
    with pytest.raises(ToolError) as caught:
        await make().call({"mode": "fail"}, context(tmp_path))
    assert caught.value.info.details == {
        "exit_code": 3,
        "stderr": "something went wrong: disk on fire",
    }


async def test_cancellation_kills_the_whole_process_group(tmp_path: Path) -> None:
    tool = make()
    started = time.monotonic()
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            await tool.call({"mode": "sleep"}, context(tmp_path))

        tg.start_soon(run)
        pids = [int(p) for p in (await wait_for(tmp_path / "pids.txt")).split()]
        assert all(alive(pid) for pid in pids)
        tg.cancel_scope.cancel()
    assert time.monotonic() - started < 8
    with anyio.fail_after(5):
        while any(alive(pid) for pid in pids):
            await anyio.sleep(0.02)


async def test_processes_left_behind_after_exit_are_killed(tmp_path: Path) -> None:
    started = time.monotonic()
    assert await make().call({"mode": "orphan"}, context(tmp_path)) == "done"
    assert time.monotonic() - started < 8  # not held up by the orphan's copy of stdout
    _, orphan = (int(p) for p in (tmp_path / "pids.txt").read_text().split())
    with anyio.fail_after(5):
        while alive(orphan):
            await anyio.sleep(0.02)


async def daemon_of(tmp_path: Path) -> int:
    pid = int(await wait_for(tmp_path / "daemon.txt"))
    assert alive(pid) and os.getsid(pid) == pid  # a session of its own: killpg misses it
    return pid


async def gone(pid: int) -> None:
    """Wait until ``pid`` no longer exists: dead and reaped, not a zombie."""
    with anyio.fail_after(5):
        while Path(f"/proc/{pid}").exists():
            await anyio.sleep(0.02)


async def test_a_daemon_that_left_the_group_dies_when_the_tool_times_out(tmp_path: Path) -> None:
    tool = GovernedTool(make(), ToolPolicy(timeout_seconds=1.0))
    with pytest.raises(ToolError) as caught:
        await tool.execute({"mode": "daemon"}, context(tmp_path))
    assert caught.value.code == "timeout"
    await gone(int((tmp_path / "daemon.txt").read_text()))


async def test_a_daemon_that_left_the_group_dies_when_the_call_is_cancelled(
    tmp_path: Path,
) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(make().call, {"mode": "daemon"}, context(tmp_path))
        daemon = await daemon_of(tmp_path)
        tg.cancel_scope.cancel()
    await gone(daemon)


async def test_a_daemon_left_behind_by_a_program_that_exited_dies_with_the_call(
    tmp_path: Path,
) -> None:
    assert await make().call({"mode": "daemon-exit"}, context(tmp_path)) == "done"
    await gone(int((tmp_path / "daemon.txt").read_text()))


async def test_runaway_output_is_capped(tmp_path: Path) -> None:
    with pytest.raises(ToolError) as caught:
        await make().call({"mode": "flood"}, context(tmp_path))
    assert caught.value.code == "output_too_large"


def test_configuration_problems_are_found_at_create() -> None:
    with pytest.raises(ConfigurationError, match="not found"):
        make(command=["corral-no-such-program-xyz"])
    with pytest.raises(ConfigurationError, match="secret 'missing'"):
        make(env={"X": EnvValue(secret="missing")})
    with pytest.raises(ConfigurationError, match="inside the agent workspace"):
        make(cwd="../outside")


def test_program_is_found_on_the_host_path() -> None:
    tool = make(command=["python3", str(PROBE)])
    assert isinstance(tool, exec_tool.ExecTool)


def test_a_sandboxed_program_is_found_on_the_sandboxes_path_first() -> None:
    require_bwrap(SandboxHost.from_env())
    tool = make(command=["sh", "-c", "true"], mode="sandbox")
    assert isinstance(tool, exec_tool.ExecTool)
    assert os.path.dirname(tool.command[0]) in exec_tool.SAFE_PATH.split(":")


async def test_large_arguments_do_not_deadlock_the_pipes(tmp_path: Path) -> None:
    blob = "y" * (1024 * 1024)
    result = await make().call({"mode": "echo", "blob": blob}, context(tmp_path))
    assert result["arguments"]["blob"] == blob
