"""What a sandboxed tool can leave on the host, or set of the host's kernel.

A real bubblewrap sandbox, and a real second host user (``nobody``, through
``setpriv``) trying what a local unprivileged user would.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.core.errors import ConfigurationError, ToolError
from corral.core.settings import Settings
from corral.resources.isolation import IsolationSpec
from corral.resources.kinds import ExecToolSpec, ToolSpecModel
from corral.runtime.capabilities import sandbox_capability
from corral.runtime.workspaces import prepare_workspace
from corral.tools import exec as exec_tool
from corral.tools.base import Tool, ToolContext
from corral.tools.sandbox.bwrap import PROC_MASKED
from corral.tools.sandbox.host import SandboxHost
from sandboxing import require_bwrap, sandbox_host

HOSTILE = Path(__file__).parent / "tool_programs" / "hostile.py"
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture
def public_parent() -> Iterator[Path]:
    """A directory every user may enter (pytest's own tmp_path is private to its user):
    only what Corral makes inside it stands between another user and the files."""
    parent = Path(tempfile.mkdtemp(prefix="corral-public-"))
    parent.chmod(0o755)
    yield parent
    shutil.rmtree(parent, ignore_errors=True)


def _settings(home: Path) -> Settings:
    return Settings(home=home, db_url=f"sqlite:///{home / 'corral.db'}", secret_key=None)


def _tool(host: SandboxHost, command: list[str], **isolation: Any) -> Tool:
    spec = ToolSpecModel(
        type="exec",
        parameters={"type": "object"},
        timeout_seconds=30,
        exec=ExecToolSpec(
            command=command,
            isolation=IsolationSpec.model_validate({"mode": "sandbox", **isolation}),
        ),
    )
    return exec_tool.create("planter", spec, {}, sandbox_host=host)


def _context(workspace: Path) -> ToolContext:
    return ToolContext(
        run_id="run-1",
        agent="me",
        namespace="default",
        call_id="call-1",
        idempotency_key="run-1:1:call-1",
        workspace=workspace,
    )


def _as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("a second host user needs root and setpriv")
    return subprocess.run([*NOBODY, *argv], capture_output=True, text=True, timeout=30)


async def test_a_setuid_file_a_tool_planted_grants_nothing_to_another_host_user(
    public_parent: Path,
) -> None:
    home = public_parent / "corral-home"
    settings = _settings(home)
    workspace = prepare_workspace(settings, "agents", "default", "me")
    (home / "secret.key").write_text("MASTER-KEY")
    (home / "secret.key").chmod(0o600)
    host = sandbox_host(home)
    require_bwrap(host)
    plant = "cp /usr/bin/python3 /workspace/py && chmod 4755 /workspace/py && echo planted"
    assert await _tool(host, ["/bin/sh", "-c", plant]).call({}, _context(workspace)) == "planted"
    planted = workspace / "py"
    assert planted.is_file()
    # the bit does not survive the call ...
    assert not planted.stat().st_mode & (stat.S_ISUID | stat.S_ISGID)
    # ... and no other user reaches the workspace, nor CORRAL_HOME, to run it
    for directory in (home, settings.workspaces, workspace):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    read_key = f"print(open({str(home / 'secret.key')!r}).read())"
    done = _as_nobody(str(planted), "-c", read_key)
    assert done.returncode != 0 and "MASTER-KEY" not in done.stdout
    assert "Permission denied" in done.stderr
    assert _as_nobody("/bin/ls", str(workspace)).returncode != 0


async def test_setgid_bits_and_setuid_bits_deep_in_the_workspace_are_cleared_too(
    tmp_path: Path,
) -> None:
    home = tmp_path / "corral-home"
    workspace = prepare_workspace(_settings(home), "agents", "default", "me")
    host = sandbox_host(home)
    require_bwrap(host)
    plant = (
        "mkdir -p /workspace/a/b && cp /bin/true /workspace/a/b/t && "
        "chmod 2755 /workspace/a/b/t && chmod 6755 /workspace/a && "
        "ln -s /usr/bin/true /workspace/link && echo planted"
    )
    assert await _tool(host, ["/bin/sh", "-c", plant]).call({}, _context(workspace)) == "planted"
    for path in (workspace / "a", workspace / "a" / "b" / "t"):
        assert not path.stat().st_mode & (stat.S_ISUID | stat.S_ISGID), path
    assert (workspace / "link").is_symlink()  # left alone, and its target too


async def test_a_failed_or_timed_out_call_still_leaves_no_setuid_file(tmp_path: Path) -> None:
    home = tmp_path / "corral-home"
    workspace = prepare_workspace(_settings(home), "agents", "default", "me")
    host = sandbox_host(home)
    require_bwrap(host)
    plant = "cp /bin/true /workspace/t && chmod 4755 /workspace/t && sleep 60"
    tool = _tool(host, ["/bin/sh", "-c", plant], limits={"wall_seconds": 1})
    with pytest.raises(ToolError) as caught:
        await tool.call({}, _context(workspace))
    assert caught.value.code == "resource_exhausted"
    assert not (workspace / "t").stat().st_mode & stat.S_ISUID


def test_an_existing_corral_home_and_workspace_made_by_an_older_version_are_tightened(
    public_parent: Path,
) -> None:
    home = public_parent / "corral-home"
    former = home / "workspaces" / "default" / "me"
    former.mkdir(parents=True)
    for directory in (home, home / "workspaces", former):
        directory.chmod(0o755)
    workspace = prepare_workspace(_settings(home), "agents", "default", "me")
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE(workspace.stat().st_mode) == 0o700
    assert _as_nobody("/bin/ls", str(home)).returncode != 0


async def test_the_sandbox_cannot_write_the_kernels_knobs(tmp_path: Path) -> None:
    home = tmp_path / "corral-home"
    workspace = prepare_workspace(_settings(home), "agents", "default", "me")
    host = sandbox_host(home)
    require_bwrap(host)
    knobs = " ".join(
        k
        for k in ("/proc/sys/kernel/domainname", "/proc/sys/vm/drop_caches", "/proc/sysrq-trigger")
        if Path(k).exists()
    )
    # opened for appending, nothing written: a sysctl written here reached the host's kernel
    probe = f'for k in {knobs}; do (exec 3>>"$k") 2>/dev/null && echo "$k"; done; echo end'
    tool = _tool(host, ["/bin/sh", "-c", probe])
    assert await tool.call({}, _context(workspace)) == "end"
    masked = [f"/proc/{entry}" for entry in PROC_MASKED if os.path.isfile(f"/proc/{entry}")]
    reader = _tool(host, [sys.executable, str(HOSTILE)])
    read = await reader.call({"mode": "read", "paths": masked}, _context(workspace))
    assert all(not answer.startswith("read:") or answer == "read:" for answer in read.values())


def test_doctor_says_the_sandbox_sees_proc_sys_read_only(tmp_path: Path) -> None:
    host = sandbox_host(tmp_path / "corral-home")
    require_bwrap(host)
    assert sandbox_capability(host).proc_sys_read_only is True
    done = subprocess.run(
        [str(Path(sys.executable).parent / "corral"), "doctor"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CORRAL_HOME": str(tmp_path / "corral-home")},
    )
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("sandbox /proc/sys"))
    assert "read-only" in line


async def test_a_program_in_a_private_project_runs_with_the_one_step_its_error_names(
    tmp_path: Path,
) -> None:
    # a project in a home directory of mode 0700: the user's own tool program
    home_dir = tmp_path / "home-of-me"
    project = home_dir / "project" / "tools"
    project.mkdir(parents=True)
    home_dir.chmod(0o700)
    program = project / "hello.sh"
    # it says hello, then looks around the private home it lies in
    program.write_text('#!/bin/sh\necho hello from $(pwd); cat "$1/.netrc" 2>&1; ls -a "$1"\n')
    program.chmod(0o755)
    (home_dir / ".netrc").write_text("machine x password SECRET")
    workspace = prepare_workspace(_settings(tmp_path / "corral-home"), "agents", "default", "me")
    host = sandbox_host(tmp_path / "corral-home")
    require_bwrap(host)
    with pytest.raises(ConfigurationError) as caught:
        _tool(host, [str(program)])
    assert f"CORRAL_SANDBOX_ALLOWED_PATHS={project}" in str(caught.value)
    assert str(home_dir) in str(caught.value)  # the directory that closes the way
    allowed = SandboxHost(
        host.corral_home, allowed_paths=(*host.allowed_paths, project), search_path=None
    )
    seen = await _tool(allowed, [str(program), str(home_dir)]).call({}, _context(workspace))
    assert str(seen).startswith("hello from /workspace")
    # what the user did not point it at is not there: the rest of the private home
    assert "SECRET" not in seen and ".netrc: No such file" in seen
    assert seen.split()[-3:] == [".", "..", "project"]  # the way to the tools, empty


def test_doctor_names_the_setting_a_private_project_directory_needs(tmp_path: Path) -> None:
    project = tmp_path / "private" / "project"
    project.mkdir(parents=True)
    (tmp_path / "private").chmod(0o700)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "corral"), "doctor"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=project,
        env={**os.environ, "CORRAL_HOME": str(tmp_path / "corral-home")},
    )
    assert done.returncode == 0, done.stderr
    assert f"CORRAL_SANDBOX_ALLOWED_PATHS={project}" in done.stdout
