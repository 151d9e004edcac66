"""Programs started through a ``#!`` line in the sandbox: a virtualenv's console scripts.

A console script (what ``pip``, ``pipx`` and ``uv tool`` install) names its virtualenv's
``python`` in its ``#!`` line, and that ``python`` links to the installation it was made
from: the sandbox shows the interpreter and each path on its way, when the operator
allowed where they lie, and says which one and which setting otherwise. The last tests
run a real MCP server from PyPI (``mcp-server-time``), installed into a fresh virtualenv
by pip, sandboxed, as its README says to run it. Real bubblewrap throughout (skipped
locally without it, failed in CI: tests/sandboxing.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from corral.core.errors import ConfigurationError
from corral.resources.isolation import IsolationSpec
from corral.resources.kinds import ExecToolSpec, McpServerSpec, ToolSpecModel
from corral.tools import exec as exec_tool
from corral.tools.base import ToolContext
from corral.tools.sandbox.host import SandboxHost
from corral.tools.sandbox.programs import interpreters, symlink_chain
from mcp_clients import connected
from sandboxing import PYTHON_PREFIX, require_bwrap

#: the PyPI MCP server of the end-to-end tests, at the version they were written against
TIME_SERVER = "mcp-server-time==2026.10.19"
#: the tests' interpreter itself (a virtualenv's python links to it)
BASE_PYTHON = os.path.realpath(sys.executable)
#: a program answering where it runs: its interpreter and that interpreter's prefix
REPORT = "import json, sys; sys.stdin.read(); print(json.dumps([sys.executable, sys.prefix]))\n"


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv without pip (made in a second): its ``python`` links to the tests'
    interpreter's installation, outside the system's directories under pyenv."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([BASE_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
    return venv


def host_allowing(tmp_path: Path, *allowed: Path) -> SandboxHost:
    home = (tmp_path / "corral-home").resolve()
    home.mkdir(exist_ok=True)
    host = SandboxHost(corral_home=home, allowed_paths=tuple(p.resolve() for p in allowed))
    require_bwrap(host)
    return host


def context(tmp_path: Path) -> ToolContext:
    workspace = tmp_path / "corral-home" / "work" / "agents" / "default" / "me"
    workspace.mkdir(parents=True, exist_ok=True)
    return ToolContext("run-1", "me", "default", "call-1", "run-1:1:call-1", workspace)


def script(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    path.chmod(0o755)
    return path


async def run_sandboxed(program: Path, host: SandboxHost, tmp_path: Path) -> Any:
    spec = ToolSpecModel(
        type="exec",
        parameters={"type": "object"},
        exec=ExecToolSpec(command=[str(program)], isolation=IsolationSpec(mode="sandbox")),
    )
    tool = exec_tool.create("report", spec, {}, sandbox_host=host)
    return await tool.call({}, context(tmp_path))


async def test_a_script_naming_a_virtualenvs_python_runs_sandboxed(
    tmp_path: Path, bare_venv: Path
) -> None:
    program = script(tmp_path / "tools", "report", f"#!{bare_venv}/bin/python\n{REPORT}")
    host = host_allowing(tmp_path, program.parent, bare_venv, PYTHON_PREFIX)

    executable, prefix = await run_sandboxed(program, host, tmp_path)

    assert (executable, prefix) == (f"{bare_venv}/bin/python", str(bare_venv))


async def test_pips_sh_form_for_a_long_interpreter_path_runs_sandboxed(
    tmp_path: Path, bare_venv: Path
) -> None:
    """pip writes ``#!/bin/sh`` and an ``exec`` line when the interpreter's path is too
    long for a ``#!`` line or holds a space: the interpreter is still the venv's."""
    form = f"#!/bin/sh\n'''exec' \"{bare_venv}/bin/python\" \"$0\" \"$@\"\n' '''\n"
    program = script(tmp_path / "tools", "report", form + REPORT)
    host = host_allowing(tmp_path, program.parent, bare_venv, PYTHON_PREFIX)

    executable, _ = await run_sandboxed(program, host, tmp_path)

    assert executable == f"{bare_venv}/bin/python"


async def test_an_interpreter_the_operator_did_not_allow_is_named_with_the_setting(
    tmp_path: Path, bare_venv: Path
) -> None:
    program = script(tmp_path / "tools", "report", f"#!{bare_venv}/bin/python\n{REPORT}")
    host = host_allowing(tmp_path, program.parent)

    with pytest.raises(ConfigurationError) as caught:
        await run_sandboxed(program, host, tmp_path)

    message = caught.value.message
    assert f"the interpreter '{bare_venv}/bin/python' that '{program}' names" in message
    assert "CORRAL_SANDBOX_ALLOWED_PATHS" in message


async def test_an_interpreter_that_does_not_exist_is_a_configuration_error(
    tmp_path: Path,
) -> None:
    program = script(tmp_path / "tools", "report", "#!/nonexistent/bin/python3 -u\n" + REPORT)
    host = host_allowing(tmp_path, program.parent)

    with pytest.raises(ConfigurationError, match="names in its #! line does not exist"):
        await run_sandboxed(program, host, tmp_path)


async def test_a_script_whose_interpreter_lies_in_corral_home_is_refused(
    tmp_path: Path, bare_venv: Path
) -> None:
    """An allowed directory holding CORRAL_HOME is never bound, as for any bind."""
    host = host_allowing(tmp_path, tmp_path)
    fake = script(host.corral_home / "bin", "python", "#!/bin/sh\necho '{}'\n")
    program = script(tmp_path / "tools", "report", f"#!{fake}\n")

    with pytest.raises(ConfigurationError, match="CORRAL_HOME"):
        await run_sandboxed(program, host, tmp_path)


def test_the_paths_on_the_way_to_a_program_and_its_interpreters(
    tmp_path: Path, bare_venv: Path
) -> None:
    program = script(tmp_path / "venv" / "bin", "tool", f"#!{bare_venv}/bin/python\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "tool").symlink_to("../venv/bin/tool")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    nested = script(tmp_path / "nested", "outer", f"#!{program}\n")

    assert symlink_chain(tmp_path / "bin" / "tool") == [tmp_path / "bin" / "tool", program]
    assert symlink_chain(loop) == [loop]
    python = bare_venv / "bin" / "python"
    assert [i.path for i in interpreters(tmp_path / "bin" / "tool")] == [python]
    assert [i.path for i in interpreters(nested)] == [program, python]
    assert interpreters(Path(BASE_PYTHON)) == []  # a binary
    script(tmp_path / "odd", "noshebang", "echo hi\n")
    script(tmp_path / "odd", "relative", "#!python\n")
    script(tmp_path / "odd", "empty", "#!\n")
    for name in ("noshebang", "relative", "empty", "absent"):
        assert interpreters(tmp_path / "odd" / name) == []


# ------------------------------------------------------------------ a real PyPI MCP server


@pytest.fixture(scope="module")
def time_server(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with ``mcp-server-time`` from PyPI (pip's cache makes it quick
    after the first time): its console script."""
    venv = tmp_path_factory.mktemp("pypi") / "venv"
    subprocess.run([BASE_PYTHON, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", TIME_SERVER]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.fail(f"pip could not install {TIME_SERVER}:\n{done.stderr[-2000:]}")
    return venv / "bin" / "mcp-server-time"


async def current_utc_time(command: Path, host: SandboxHost, tmp_path: Path) -> Any:
    spec = McpServerSpec(
        transport="stdio", command=[str(command)], isolation=IsolationSpec(mode="sandbox")
    )
    workspace = context(tmp_path).workspace
    async with connected("time", spec, {}, workspace, host) as tools:
        answer = await tools["mcp:time/get_current_time"].call(
            {"timezone": "UTC"}, context(tmp_path)
        )
    return answer if isinstance(answer, dict) else json.loads(answer)


async def test_a_pypi_mcp_servers_console_script_runs_sandboxed(
    tmp_path: Path, time_server: Path
) -> None:
    host = host_allowing(tmp_path, time_server.parent.parent, PYTHON_PREFIX)

    answer = await current_utc_time(time_server, host, tmp_path)

    assert answer["timezone"] == "UTC" and answer["datetime"][:2] == "20", answer


async def test_a_pipx_style_entry_point_linking_into_its_venv_runs_sandboxed(
    tmp_path: Path, time_server: Path
) -> None:
    """``~/.local/bin/NAME -> ~/.local/pipx/venvs/NAME/bin/NAME`` (and ``uv tool``'s)."""
    local_bin = tmp_path / "local" / "bin"
    local_bin.mkdir(parents=True)
    (local_bin / "mcp-server-time").symlink_to(os.path.relpath(time_server, local_bin))
    host = host_allowing(tmp_path, local_bin, time_server.parent.parent, PYTHON_PREFIX)

    answer = await current_utc_time(local_bin / "mcp-server-time", host, tmp_path)

    assert answer["timezone"] == "UTC", answer


async def test_a_pypi_console_script_whose_interpreter_is_not_allowed_fails_clearly(
    tmp_path: Path, time_server: Path
) -> None:
    if not PYTHON_PREFIX.is_relative_to(Path.home()) and PYTHON_PREFIX.parts[1] == "usr":
        pytest.skip("the venv's Python is the system's: every sandbox shows it")
    host = host_allowing(tmp_path, time_server.parent.parent)

    with pytest.raises(ConfigurationError) as caught:
        await current_utc_time(time_server, host, tmp_path)

    message = caught.value.message
    assert f"the interpreter '{time_server.parent}/python" in message, message
    assert "where it links" in message and "CORRAL_SANDBOX_ALLOWED_PATHS" in message, message
