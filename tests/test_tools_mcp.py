"""The ``mcp`` tool kind against real MCP servers (stdio and streamable HTTP) written with the SDK.

The connected servers are module fixtures: each is opened and closed by one
owner task, as :func:`corral.tools.mcp.open_server_tools` requires, while the
tests call the tools from their own tasks. What every kind does (invalid input, timeouts,
cancellation, the output cap, failures, the idempotency key) is in
``tests/conformance/test_tool_kinds.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
import pytest_asyncio

from corral.core.errors import ConfigurationError, ToolError
from corral.resources.isolation import IsolationSpec
from corral.resources.kinds import EnvValue, HttpAuth, McpServerSpec
from corral.tools.base import Tool, ToolContext
from corral.tools.mcp import McpTool, open_server_tools
from corral.tools.sandbox.host import SandboxHost
from mcp_clients import CALC, SERVERS, connected
from processes import alive

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN = "mcp-test-token"
#: the tests that kill a server by the pid it reports, or read the files it writes outside
#: its workspace, run it unsandboxed: in a sandbox its pid is the PID namespace's own
#: (tests/test_isolation.py runs a sandboxed stdio server)
HOST_PIDS = IsolationSpec(mode="none")


def context(tmp_path: Path) -> ToolContext:
    return ToolContext(
        run_id="run-5",
        agent="mathy",
        namespace="default",
        call_id="call-1",
        idempotency_key="run-5:1:call-1",
        workspace=tmp_path,
    )


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp-workspace")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stdio_tools(workspace: Path) -> AsyncIterator[dict[str, Tool]]:
    spec = McpServerSpec(
        transport="stdio",
        command=[sys.executable, CALC],
        env={"MODE": "test", "API_KEY": EnvValue(secret="calc-key")},
        call_timeout_seconds=0.5,
        idempotent=True,
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_SECRET_ACCESS_KEY", "host-secret")
        async with connected("calc", spec, {"calc-key": "k-42"}, workspace) as tools:
            yield tools


@pytest.fixture(scope="module")
def http_server() -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, CALC, "http", TOKEN], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def http_tools(http_server: str) -> AsyncIterator[dict[str, Tool]]:
    spec = McpServerSpec(
        transport="streamable-http",
        url=http_server,
        auth=HttpAuth(type="bearer", secret="mcp-token"),
        headers={"X-Team": "blue"},
    )
    async with connected("calc-http", spec, {"mcp-token": TOKEN}) as tools:
        yield tools


async def test_stdio_server_tools_are_listed_with_refs_and_schemas(
    stdio_tools: dict[str, Tool],
) -> None:
    assert set(stdio_tools) == {
        "mcp:calc/add",
        "mcp:calc/shout",
        "mcp:calc/environment",
        "mcp:calc/divide",
        "mcp:calc/slow",
        "mcp:calc/pid",
        "mcp:calc/daemon",
        "mcp:calc/echo",
        "mcp:calc/flood",
        "mcp:calc/fail",
    }  # fmt: skip  (not long_job: it runs only as an MCP task)
    add = stdio_tools["mcp:calc/add"]
    assert add.spec.name == "calc__add"
    assert add.spec.description == "Add two integers."
    assert add.spec.parameters["required"] == ["a", "b"]
    assert add.idempotent is True


async def test_stdio_call_returns_structured_or_text_content(
    stdio_tools: dict[str, Tool], tmp_path: Path
) -> None:
    ctx = context(tmp_path)
    assert await stdio_tools["mcp:calc/add"].call({"a": 2, "b": 40}, ctx) == {"result": 42}
    assert await stdio_tools["mcp:calc/shout"].call({"text": "hi"}, ctx) == "HI"


async def test_a_call_tells_the_server_its_idempotency_key_run_and_call_in_its_meta(
    stdio_tools: dict[str, Tool], tmp_path: Path
) -> None:
    result = await stdio_tools["mcp:calc/echo"].call({"text": "hi"}, context(tmp_path))
    assert result["meta"] == {
        "corral/idempotency_key": "run-5:1:call-1",
        "corral/run_id": "run-5",
        "corral/tool_call_id": "call-1",
    }


PLANTED = {"CORRAL_URL": "http://127.0.0.1:9", "CORRAL_AGENT_TOKEN": "eyJhbGciOi.planted.token"}


async def test_a_stdio_server_gets_the_calls_agent_token_and_url_in_its_meta(
    stdio_tools: dict[str, Tool], tmp_path: Path
) -> None:
    ctx = dataclasses.replace(context(tmp_path), environment=PLANTED)
    result = await stdio_tools["mcp:calc/echo"].call({"text": "hi"}, ctx)
    assert result["meta"]["corral/agent_token"] == PLANTED["CORRAL_AGENT_TOKEN"]
    assert result["meta"]["corral/url"] == PLANTED["CORRAL_URL"]


async def test_a_remote_server_never_gets_the_agent_token(
    http_tools: dict[str, Tool], tmp_path: Path
) -> None:
    ctx = dataclasses.replace(context(tmp_path), environment=PLANTED)
    result = await http_tools["mcp:calc-http/echo"].call({"text": "hi"}, ctx)
    assert "corral/agent_token" not in result["meta"] and "corral/url" not in result["meta"]
    assert result["meta"]["corral/run_id"] == "run-5"


async def test_stdio_server_runs_in_a_locked_environment(
    stdio_tools: dict[str, Tool], workspace: Path, tmp_path: Path
) -> None:
    text = await stdio_tools["mcp:calc/environment"].call({}, context(tmp_path))
    env = dict(line.split("=", 1) for line in text.splitlines())
    assert "AWS_SECRET_ACCESS_KEY" not in env
    # isolation auto: sandboxed where bubblewrap works, its workspace then at /workspace
    sandboxed = SandboxHost.from_env().probe().works
    assert env["HOME"] == ("/workspace/home" if sandboxed else str(workspace / "home"))
    assert env["MODE"] == "test" and env["API_KEY"] == "k-42"
    # the SDK always passes these names; their host values do not
    assert env["USER"] == "" and env["LOGNAME"] == ""
    assert set(env) <= {
        "PATH", "LANG", "HOME", "TMPDIR", "MODE", "API_KEY", "USER", "LOGNAME", "SHELL", "TERM",
        "CORRAL_PROCESS_TREE", "PWD",  # (bubblewrap's, its working directory in the sandbox)
    }  # fmt: skip


async def test_a_daemon_the_stdio_server_started_dies_when_the_server_is_closed(
    tmp_path: Path,
) -> None:
    spec = McpServerSpec(transport="stdio", command=[sys.executable, CALC], isolation=HOST_PIDS)
    async with connected("calc", spec, {}, tmp_path) as tools:
        daemon = await tools["mcp:calc/daemon"].call({}, context(tmp_path))
        assert alive(daemon["result"]) and os.getsid(daemon["result"]) == daemon["result"]
    with anyio.fail_after(5):  # dead and reaped, not a zombie
        while Path(f"/proc/{daemon['result']}").exists():
            await anyio.sleep(0.02)


async def test_slow_call_times_out_and_the_session_survives(
    stdio_tools: dict[str, Tool], tmp_path: Path
) -> None:
    with pytest.raises(ToolError) as caught:
        await stdio_tools["mcp:calc/slow"].call({"seconds": 5}, context(tmp_path))
    assert caught.value.code == "timeout"
    assert caught.value.retryable is True
    assert await stdio_tools["mcp:calc/slow"].call({"seconds": 0}, context(tmp_path)) == "awake"


async def test_streamable_http_server_with_bearer_auth(
    http_tools: dict[str, Tool], tmp_path: Path
) -> None:
    assert "mcp:calc-http/add" in http_tools
    result = await http_tools["mcp:calc-http/add"].call({"a": 1, "b": 2}, context(tmp_path))
    assert result == {"result": 3}
    with pytest.raises(ToolError) as caught:
        await http_tools["mcp:calc-http/divide"].call({"a": 1, "b": 0}, context(tmp_path))
    assert "division by zero" in caught.value.info.reason


async def test_streamable_http_server_refuses_a_wrong_token(http_server: str) -> None:
    spec = McpServerSpec(
        transport="streamable-http",
        url=http_server,
        auth=HttpAuth(type="bearer", secret="mcp-token"),
        init_timeout_seconds=5,
    )
    started = time.monotonic()
    with pytest.raises(ToolError) as caught:
        async with connected("calc-http", spec, {"mcp-token": "wrong"}):
            pass
    assert caught.value.code == "unavailable"
    assert time.monotonic() - started < 5


async def test_server_hanging_on_initialize_fails_cleanly(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids.txt"
    spec = McpServerSpec(
        transport="stdio",
        command=[sys.executable, str(SERVERS / "hang_server.py"), str(pid_file)],
        init_timeout_seconds=1,
        isolation=HOST_PIDS,
    )
    started = time.monotonic()
    with pytest.raises(ToolError) as caught:
        async with contextlib.AsyncExitStack() as stack:
            await open_server_tools("stuck", spec, {}, stack, workspace=tmp_path)
    elapsed = time.monotonic() - started
    error = caught.value
    assert error.code == "unavailable"
    assert "within 1.0s" in error.info.reason
    assert "starting up, please wait" in error.info.reason  # the server's stderr
    # the init timeout, plus the SDK's 2 s grace between closing stdin and SIGTERM
    assert elapsed < 6
    pids = [int(pid) for pid in pid_file.read_text().split()]
    with anyio.fail_after(5):
        while any(alive(pid) for pid in pids):
            await anyio.sleep(0.02)


async def test_missing_program_and_secret_are_configuration_errors() -> None:
    async with contextlib.AsyncExitStack() as stack:
        with pytest.raises(ConfigurationError, match="not found"):
            spec = McpServerSpec(transport="stdio", command=["corral-no-such-mcp-server"])
            await open_server_tools("nope", spec, {}, stack)
        with pytest.raises(ConfigurationError, match="secret 'absent'"):
            spec = McpServerSpec(
                transport="stdio",
                command=[sys.executable, CALC],
                env={"K": EnvValue(secret="absent")},
            )
            await open_server_tools("nope", spec, {}, stack)


# --------------------------------------------------------------------------- lost sessions


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


async def wait_dead(pid: int) -> None:
    with anyio.fail_after(10):
        while alive(pid):
            await anyio.sleep(0.01)


async def kill_server(tool: Tool) -> None:
    """Kill the stdio server behind ``tool`` and wait until its connection noticed.

    (A call made in the instant between the two goes out on the dead session and is
    treated as cut off in flight, which is the other test's case.)
    """
    assert isinstance(tool, McpTool)
    pid = int(await tool.call({}, context(Path("."))))
    kill(pid)
    await wait_dead(pid)
    with anyio.fail_after(10):
        await tool.connection.wait_lost()


def stdio_spec(*, idempotent: bool = False) -> McpServerSpec:
    return McpServerSpec(
        transport="stdio",
        command=[sys.executable, CALC],
        idempotent=idempotent,
        isolation=HOST_PIDS,
    )


async def test_tools_that_need_mcp_tasks_are_not_offered_and_logged_once(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    with caplog.at_level(logging.WARNING, logger="corral.tools.mcp"):
        async with connected("calc", stdio_spec(), {}, tmp_path) as tools:
            assert "mcp:calc/long_job" not in tools and "mcp:calc/add" in tools
            await kill_server(tools["mcp:calc/pid"])  # a new session lists the tools again
            await tools["mcp:calc/add"].call({"a": 1, "b": 1}, context(tmp_path))
    lines = [r.getMessage() for r in caplog.records if "MCP task" in r.getMessage()]
    assert len(lines) == 1 and "long_job" in lines[0], lines


async def test_a_stdio_server_that_died_is_started_again_for_the_next_call(
    tmp_path: Path,
) -> None:
    async with connected("calc", stdio_spec(), {}, tmp_path) as tools:
        ctx = context(tmp_path)
        first = int(await tools["mcp:calc/pid"].call({}, ctx))
        await kill_server(tools["mcp:calc/pid"])
        # not idempotent: it may run again only because its call never reached the dead server
        assert await tools["mcp:calc/add"].call({"a": 2, "b": 3}, ctx) == {"result": 5}
        second = int(await tools["mcp:calc/pid"].call({}, ctx))
        assert second != first and alive(second)


async def test_a_call_right_after_the_server_died_runs_on_a_new_one_before_eof_is_seen(
    tmp_path: Path,
) -> None:
    """The server is dead before the call: the call cannot have reached it, so even a tool
    that is not idempotent runs on a new server, whether or not its stdout's end was read."""
    async with connected("calc", stdio_spec(), {}, tmp_path) as tools:
        ctx = context(tmp_path)
        first = int(await tools["mcp:calc/pid"].call({}, ctx))
        kill(first)
        await wait_dead(first)  # dead and reaped; the connection may not have noticed yet
        assert await tools["mcp:calc/add"].call({"a": 2, "b": 3}, ctx) == {"result": 5}
        second = int(await tools["mcp:calc/pid"].call({}, ctx))
        assert second != first and alive(second)


@pytest.mark.parametrize("idempotent", [False, True])
async def test_a_call_in_flight_when_the_server_dies_runs_again_only_if_idempotent(
    tmp_path: Path, idempotent: bool
) -> None:
    async with connected("calc", stdio_spec(idempotent=idempotent), {}, tmp_path) as tools:
        ctx = context(tmp_path)
        pid = int(await tools["mcp:calc/pid"].call({}, ctx))
        outcome: list[object] = []

        async def slow_call() -> None:
            try:
                outcome.append(await tools["mcp:calc/slow"].call({"seconds": 0.5}, ctx))
            except ToolError as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as group:
            group.start_soon(slow_call)
            await anyio.sleep(0.2)  # the call is in the server now
            kill(pid)
        if idempotent:
            assert outcome == ["awake"]
        else:
            [error] = outcome
            assert isinstance(error, ToolError)
            assert error.code == "unavailable" and error.retryable is True
            assert "may or may not have run" in error.info.reason
        # either way the next call gets a new session
        assert await tools["mcp:calc/add"].call({"a": 1, "b": 2}, ctx) == {"result": 3}


def start_http_server(port: int = 0, mode: str = "http") -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen(
        [sys.executable, CALC, mode, TOKEN, str(port)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    return process, int(process.stdout.readline())


@pytest.mark.parametrize("mode", ["http", "http400"], ids=["404", "400"])
async def test_a_restarted_http_server_gets_a_new_session_for_the_next_call(
    tmp_path: Path, mode: str
) -> None:
    process, port = start_http_server(mode=mode)
    spec = McpServerSpec(
        transport="streamable-http",
        url=f"http://127.0.0.1:{port}/mcp",
        auth=HttpAuth(type="bearer", secret="mcp-token"),
    )
    try:
        async with connected("calc-http", spec, {"mcp-token": TOKEN}) as tools:
            ctx = context(tmp_path)
            assert await tools["mcp:calc-http/add"].call({"a": 1, "b": 2}, ctx) == {"result": 3}
            process.kill()
            process.wait(10)
            process, _ = start_http_server(port, mode)
            # the new server refuses the old session id: the call never ran there,
            # so it is made on a new session although the tool is not idempotent
            assert await tools["mcp:calc-http/add"].call({"a": 2, "b": 2}, ctx) == {"result": 4}
    finally:
        process.kill()
        process.wait(10)


def calc_over_http(port: int) -> McpServerSpec:
    """The calc server on ``port`` over streamable HTTP, quick to give up connecting."""
    return McpServerSpec(
        transport="streamable-http",
        url=f"http://127.0.0.1:{port}/mcp",
        auth=HttpAuth(type="bearer", secret="mcp-token"),
        init_timeout_seconds=2,
    )


async def test_a_server_that_cannot_be_reopened_fails_fast_until_the_backoff_passed(
    tmp_path: Path,
) -> None:
    process, port = start_http_server()
    spec = calc_over_http(port)
    try:
        async with connected("calc-http", spec, {"mcp-token": TOKEN}) as tools:
            ctx = context(tmp_path)
            await tools["mcp:calc-http/add"].call({"a": 1, "b": 2}, ctx)
            process.kill()
            process.wait(10)
            errors = []
            started = time.monotonic()
            for _ in range(3):
                with pytest.raises(ToolError) as caught:
                    await tools["mcp:calc-http/add"].call({"a": 1, "b": 2}, ctx)
                errors.append(caught.value)
            assert all(e.code == "unavailable" and e.retryable for e in errors)
            # no call waited for a connect attempt of its own beyond the first reopen
            assert time.monotonic() - started < spec.init_timeout_seconds
            assert "failed to start" in errors[-1].info.reason
            process, _ = start_http_server(port)
            with anyio.fail_after(40):  # the backoff, at most REOPEN_MAX_BACKOFF_SECONDS
                while True:
                    try:
                        result = await tools["mcp:calc-http/add"].call({"a": 3, "b": 4}, ctx)
                        break
                    except ToolError:
                        await anyio.sleep(0.1)
            assert result == {"result": 7}
    finally:
        process.kill()
        process.wait(10)


async def test_a_call_whose_connection_is_refused_is_not_said_to_have_maybe_run(
    tmp_path: Path,
) -> None:
    """The server is gone: connecting for the call is refused, so nothing of it reached the
    server, and the error says the server cannot be reached, not that the call may have run."""
    process, port = start_http_server()
    spec = calc_over_http(port)
    try:
        async with connected("calc-http", spec, {"mcp-token": TOKEN}) as tools:
            ctx = context(tmp_path)
            assert await tools["mcp:calc-http/add"].call({"a": 1, "b": 2}, ctx) == {"result": 3}
            process.kill()
            process.wait(10)
            with pytest.raises(ToolError) as caught:  # add is not idempotent
                await tools["mcp:calc-http/add"].call({"a": 1, "b": 2}, ctx)
    finally:
        process.kill()
        process.wait(10)
    reason = caught.value.info.reason
    assert caught.value.code == "unavailable" and caught.value.retryable, reason
    assert "may or may not have run" not in reason and "failed to start" in reason, reason
    assert "ConnectError" in reason, reason
