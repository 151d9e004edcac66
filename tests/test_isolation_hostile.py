"""A namespace admin's attacks on the tool sandbox, each a finding of the sandbox review.

The admin writes the Tool (its command, arguments and environment) and the program
is theirs: these tests try what such a Tool could get of the host beyond what
tests/test_isolation.py already covers, through a real bubblewrap sandbox.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from corral.core.errors import ConfigurationError, ToolError
from corral.resources.isolation import IsolationSpec
from corral.resources.kinds import ExecToolSpec, ToolSpecModel
from corral.tools import exec as exec_tool
from corral.tools.base import Tool, ToolContext
from corral.tools.sandbox.host import SandboxHost
from sandboxing import require_bwrap, sandbox_host

HOSTILE = Path(__file__).parent / "tool_programs" / "hostile.py"


@pytest.fixture
def host(tmp_path: Path) -> SandboxHost:
    home = tmp_path / "corral-home"
    (home / "work" / "agents" / "default" / "me").mkdir(parents=True)
    sandbox = sandbox_host(home)
    require_bwrap(sandbox)
    return sandbox


def _context(host: SandboxHost) -> ToolContext:
    return ToolContext(
        run_id="run-1",
        agent="me",
        namespace="default",
        call_id="call-1",
        idempotency_key="run-1:1:call-1",
        workspace=host.corral_home / "work" / "agents" / "default" / "me",
    )


def _tool(
    host: SandboxHost, command: list[str], env: dict[str, str] | None = None, **isolation: Any
) -> Tool:
    spec = ToolSpecModel(
        type="exec",
        parameters={"type": "object"},
        timeout_seconds=30,
        exec=ExecToolSpec(
            command=command,
            env=env or {},
            # as stored: the binds are checked against ``host`` when the tool is built
            isolation=IsolationSpec.model_validate(
                {"mode": "sandbox", **isolation}, context={"stored": True}
            ),
        ),
    )
    return exec_tool.create("hostile", spec, {}, sandbox_host=host)


def test_a_host_file_only_the_server_may_read_is_never_bound_for_an_argument(
    host: SandboxHost, tmp_path: Path
) -> None:
    key = tmp_path / "id_rsa"
    key.write_text("PRIVATE-KEY")
    key.chmod(0o600)
    shadow = Path("/etc/shadow")
    # the same file through CORRAL_HOME's parent: judged where it lies
    targets = [key, Path(f"{host.corral_home}/../id_rsa")]
    if shadow.exists() and not shadow.stat().st_mode & stat.S_IROTH:
        targets.append(shadow)
    for target in targets:
        with pytest.raises(ConfigurationError, match="the sandbox cannot show") as caught:
            _tool(host, [sys.executable, str(HOSTILE), str(target)])
        assert "only the server's user may read" in str(caught.value) or ".." in str(target)


def test_a_world_readable_file_in_a_private_directory_is_not_bound_either(
    host: SandboxHost, tmp_path: Path
) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    notes = private / "notes.txt"
    notes.write_text("PRIVATE")
    notes.chmod(0o644)
    with pytest.raises(ConfigurationError, match="only the server's user may read"):
        _tool(host, [sys.executable, str(HOSTILE), str(notes)])


def test_a_private_program_outside_the_allowed_paths_is_not_bound(
    host: SandboxHost, tmp_path: Path
) -> None:
    script = tmp_path / "backup.sh"
    script.write_text("#!/bin/sh\necho PASSWORD=hunter2\n")
    script.chmod(0o700)
    with pytest.raises(ConfigurationError, match="only the server's user may read"):
        _tool(host, [str(script)])


async def test_loader_variables_of_a_tool_do_not_reach_the_launchers_on_the_host(
    host: SandboxHost, tmp_path: Path
) -> None:
    # LD_DEBUG_OUTPUT makes the dynamic linker of every process it reaches write a file:
    # on the host, bwrap (and the cgroup's shell) would write it; inside, there is no such path.
    # LD_PRELOAD of a library the program wrote into its workspace would run in them likewise.
    trace = tmp_path / "pwned"
    attack = {"LD_DEBUG": "files", "LD_DEBUG_OUTPUT": str(trace)}
    limits = {"max_processes": 64}  # where a pids cgroup is made, its shell runs on the host too
    tool = _tool(host, [sys.executable, str(HOSTILE)], env=attack, limits=limits)
    await tool.call({"mode": "environment", "names": []}, _context(host))
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("pwned")]
    # the program itself still gets what its Tool declared
    env = {"LD_LIBRARY_PATH": "/nowhere", "GCONV_PATH": "/nowhere", "PLAIN": "yes"}
    tool = _tool(host, [sys.executable, str(HOSTILE)], env=env, limits=limits)
    seen = await tool.call({"mode": "environment", "names": sorted(env)}, _context(host))
    assert seen == env


async def test_tmp_is_a_bounded_tmpfs(host: SandboxHost) -> None:
    tool = _tool(host, [sys.executable, str(HOSTILE)], limits={"tmp_mb": 2})
    with pytest.raises(ToolError) as caught:
        await tool.call({"mode": "bigfile", "mb": 4}, _context(host))
    assert "No space left on device" in caught.value.info.reason
    default = _tool(host, ["/bin/df", "-k", "--output=size", "/tmp"])
    size_kib = int(str(await default.call({}, _context(host))).split()[-1])
    assert size_kib == 256 * 1024


async def test_private_keys_of_the_system_are_not_shown(host: SandboxHost) -> None:
    # a server running as root is root in the sandbox's user namespace too (owner of
    # root's files): what /etc shows must hold no private key
    tool = _tool(host, [sys.executable, str(HOSTILE)])
    listed = await tool.call({"mode": "list", "paths": ["/etc/ssl/private"]}, _context(host))
    assert listed == {"/etc/ssl/private": "ENOENT"}


async def test_a_bind_swapped_for_a_symlink_after_the_tool_was_built_is_refused(
    tmp_path: Path,
) -> None:
    # another tool with a writable bind (or anyone writing the allowed directory) replaces
    # a bound directory by a symlink into CORRAL_HOME between the checks and a call
    home = tmp_path / "corral-home"
    (home / "work" / "agents" / "default" / "me").mkdir(parents=True)
    (home / "secret.key").write_text("MASTER-KEY")
    shared = tmp_path / "shared"
    (shared / "data").mkdir(parents=True)
    base = sandbox_host(home)
    host = SandboxHost(home, allowed_paths=(*base.allowed_paths, shared, HOSTILE.parent))
    require_bwrap(host)
    tool = _tool(host, [sys.executable, str(HOSTILE)], read_only_paths=[str(shared / "data")])
    listing = {"mode": "list", "paths": [str(shared / "data")]}
    assert await tool.call(listing, _context(host)) == {str(shared / "data"): []}
    (shared / "data").rmdir()
    (shared / "data").symlink_to(home)
    with pytest.raises(ToolError) as caught:
        await tool.call(listing, _context(host))
    assert caught.value.code == "isolation_unavailable"
    assert str(home) not in caught.value.info.reason


async def test_symlinks_the_program_left_in_its_workspace_make_nothing_on_the_host(
    host: SandboxHost, tmp_path: Path
) -> None:
    # the server creates the call's cwd (and HOME, TMPDIR) in the workspace on the host:
    # through a symlink the program left there it would create directories anywhere
    outside = tmp_path / "outside"
    outside.mkdir()
    tool = _tool(host, [sys.executable, str(HOSTILE)])
    for link, target in (("jump", str(outside)), ("home", str(tmp_path / "missing" / "home"))):
        answer = await tool.call(
            {"mode": "symlink", "link": f"/workspace/{link}", "target": target}, _context(host)
        )
        assert answer == "linked"
    spec = ToolSpecModel(
        type="exec",
        parameters={"type": "object"},
        timeout_seconds=30,
        exec=ExecToolSpec(
            command=[sys.executable, str(HOSTILE)],
            cwd="jump/made-by-corral",
            isolation=IsolationSpec(mode="sandbox"),
        ),
    )
    jumping = exec_tool.create("jumping", spec, {}, sandbox_host=host)
    for called in (jumping, tool):
        with pytest.raises(ToolError) as caught:
            await called.call({"mode": "list", "paths": ["."]}, _context(host))
        assert caught.value.code == "execution_failed"
        assert "symlink" in caught.value.info.reason
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "missing").exists()


async def test_dev_holds_no_unbounded_memory(host: SandboxHost) -> None:
    # bubblewrap's /dev is a tmpfs of the host's memory: writable, of no set size
    tool = _tool(host, [sys.executable, str(HOSTILE)], limits={"tmp_mb": 2})
    for path, refused in (("/dev/big", "EROFS"), ("/dev/shm/big", "ENOSPC")):
        answer = await tool.call({"mode": "bigfile", "mb": 4, "path": path}, _context(host))
        assert answer == refused
    # what a program writes to /dev/null and its kind still works
    assert await tool.call({"mode": "bigfile", "mb": 1, "path": "/dev/null"}, _context(host)) == (
        "written"
    )


async def test_a_sandbox_that_cannot_be_set_up_is_not_the_programs_failure(
    tmp_path: Path,
) -> None:
    home = tmp_path / "corral-home"
    (home / "work" / "agents" / "default" / "me").mkdir(parents=True)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    base = sandbox_host(home)
    host = SandboxHost(home, allowed_paths=(*base.allowed_paths, scratch, HOSTILE.parent))
    require_bwrap(host)
    tool = _tool(host, [sys.executable, str(HOSTILE)], writable_paths=[str(scratch)])
    scratch.rmdir()  # the operator removed it: bwrap cannot bind it
    with pytest.raises(ToolError) as caught:
        await tool.call({"mode": "list", "paths": ["."]}, _context(host))
    assert caught.value.code == "isolation_unavailable"
    assert caught.value.info.reason.startswith("the sandbox could not be set up: ")
    assert "exited with code" not in caught.value.info.reason


async def test_a_symlink_the_program_makes_to_a_host_path_leads_nowhere(host: SandboxHost) -> None:
    secret = host.corral_home / "secret.key"
    secret.write_text("MASTER-KEY")
    tool = _tool(host, [sys.executable, str(HOSTILE)])
    link = {"mode": "symlink", "link": "/workspace/key", "target": str(secret)}
    assert await tool.call(link, _context(host)) == "linked"
    read = await tool.call({"mode": "read", "paths": ["/workspace/key"]}, _context(host))
    assert read == {"/workspace/key": "ENOENT"}  # resolved in the sandbox, where it is not
