"""The ``exec`` tool kind: a program that reads JSON on stdin and answers on stdout.

Each call starts the program in a new session (its own process group) with a
locked-down environment: nothing of the host environment reaches it except
what :func:`locked_environment` sets and what the Tool declares. ``HOME`` and
``TMPDIR`` point into the agent's workspace, the working directory is the
workspace (or ``spec.exec.cwd`` inside it).

Where the program runs is the tool's :class:`~corral.tools.sandbox.policy.Isolation`
(``spec.exec.isolation``): by default a bubblewrap sandbox where bubblewrap works,
which sees the workspace at ``/workspace``, a private ``/tmp`` and the system's
programs, and nothing else of the host (see :mod:`corral.tools.sandbox`). A limit
the program hits is ``resource_exhausted`` naming it.

The program and everything it starts are one
:class:`~corral.tools.processes.ProcessTree`, daemons that left the process
group included. When the call is cancelled or times out the tree gets SIGTERM,
then SIGKILL after a short grace; after the program exits, any process it left
behind is killed too, so a call never leaks processes. stdout and stderr are
read with caps, so a runaway program cannot exhaust the worker's memory. Then
no setuid or setgid bit the program set in its workspace survives the call
(:mod:`corral.tools.sandbox.setid`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from subprocess import PIPE
from typing import Any

import anyio
import anyio.abc

from corral.core.errors import ConfigurationError, ToolError, ToolErrorCode
from corral.resources.kinds import EnvValue, ToolSpecModel
from corral.tools.base import Tool, ToolContext
from corral.tools.naming import declared_spec
from corral.tools.processes import ProcessTree
from corral.tools.sandbox.host import SandboxHost
from corral.tools.sandbox.policy import Isolation, View, resolve_isolation
from corral.tools.sandbox.setid import strip_setid_bits

__all__ = [
    "MAX_STDERR_BYTES",
    "MAX_STDOUT_BYTES",
    "SAFE_PATH",
    "ExecTool",
    "OutputCapture",
    "create",
    "declared_environment",
    "exit_description",
    "locked_environment",
    "parse_output",
    "resolve_program",
    "workspace_directory",
]

#: the PATH a program sees unless its Tool declares another one
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: more stdout than this fails the call with ``output_too_large``
MAX_STDOUT_BYTES = 4 * 1024 * 1024
#: only the last this-many bytes of stderr are kept
MAX_STDERR_BYTES = 64 * 1024
#: how long a program gets to exit after SIGTERM before it is killed
TERM_GRACE_SECONDS = 1.0
#: how much of stderr an error reason quotes
_REASON_STDERR_CHARS = 2000
_READ_CHUNK = 65536


def declared_environment(
    env: Mapping[str, str | EnvValue], secrets: Mapping[str, str], *, owner: str
) -> dict[str, str]:
    """Resolve a Tool's (or McpServer's) declared environment to plain values.

    Raises ``ConfigurationError`` naming ``owner`` when a referenced secret is
    not in ``secrets``.
    """
    resolved: dict[str, str] = {}
    for key, item in env.items():
        if isinstance(item, str):
            resolved[key] = item
        elif item.value is not None:
            resolved[key] = item.value
        else:
            secret = item.secret or ""
            if secret not in secrets:
                raise ConfigurationError(
                    f"{owner}: environment variable {key!r} needs secret {secret!r}, "
                    "which is not available"
                )
            resolved[key] = secrets[secret]
    return resolved


async def locked_environment(
    workspace: Path,
    declared: Mapping[str, str],
    extra: Mapping[str, str] | None = None,
    *,
    view: View | None = None,
) -> dict[str, str]:
    """The whole environment of a tool process.

    ``PATH`` (a fixed safe default), ``LANG``, and ``HOME``/``TMPDIR`` inside
    ``workspace`` (created here; ``view`` says where a sandboxed program sees
    them), then the declared values (which may override any of those), then
    ``extra`` (Corral's own per-call variables, which may not be overridden).
    Nothing is read from the host environment.
    """
    home, tmp = workspace / "home", workspace / "tmp"
    await anyio.Path(workspace).mkdir(parents=True, exist_ok=True)
    for directory in ("home", "tmp"):
        await anyio.to_thread.run_sync(workspace_directory, workspace, directory)
    if view is None:
        view = View(str(workspace), str(home), str(tmp))
    env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "HOME": view.home, "TMPDIR": view.tmp}
    env.update(declared)
    env.update(extra or {})
    return env


def workspace_directory(workspace: Path, relative: str) -> None:
    """Create ``relative`` (and its parents) in ``workspace`` without following a symlink.

    A program writes its workspace: a symlink it left where the server makes the call's
    directories (``home``, ``tmp``, a Tool's ``cwd``) would otherwise have the server
    create directories anywhere on the host. Blocking: call it in a thread.
    """
    fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in PurePosixPath(relative).parts:
            if part in (".", "/"):
                continue
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, dir_fd=fd)
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                raise ToolError(
                    ToolErrorCode.EXECUTION_FAILED,
                    f"{relative!r} in the workspace is a symlink or not a directory "
                    f"({exc.strerror}): a program replaced it; remove it from the workspace",
                ) from exc
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)


def resolve_program(program: str, *, owner: str, prefer_path: str | None = None) -> str:
    """The absolute path of ``program``, looked up on ``prefer_path`` then the *host* PATH.

    The admin installed the program for the host, so it is found the way the
    host would find it; the program then runs with the locked environment. A
    sandboxed tool prefers :data:`SAFE_PATH`, what the sandbox itself shows.
    """
    if os.sep in program:
        path = os.path.abspath(program)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise ConfigurationError(f"{owner}: {path!r} is not an executable file")
        return path
    found = (prefer_path and shutil.which(program, path=prefer_path)) or shutil.which(program)
    if found is None:
        raise ConfigurationError(f"{owner}: program {program!r} was not found on the PATH")
    return found


@dataclass
class _Completed:
    returncode: int
    stdout: bytes
    stderr: bytes
    stdout_overflow: bool


class OutputCapture:
    """Bytes read from one pipe: all of them up to ``limit``, or only the last ``limit``."""

    def __init__(self, limit: int, *, keep_tail: bool) -> None:
        self.limit = limit
        self.keep_tail = keep_tail
        self.data = bytearray()
        self.overflow = False

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > self.limit:
            self.overflow = True
            if self.keep_tail:
                del self.data[: len(self.data) - self.limit]


async def _feed(stream: anyio.abc.ByteSendStream | None, data: bytes) -> None:
    if stream is None:
        return
    try:
        await stream.send(data)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass  # the program exited or closed stdin without reading it all
    finally:
        with contextlib.suppress(anyio.BrokenResourceError, OSError):
            await stream.aclose()


async def _drain(
    stream: anyio.abc.ByteReceiveStream | None, capture: OutputCapture, tree: ProcessTree
) -> None:
    if stream is None:
        return
    try:
        async for chunk in stream:
            capture.add(chunk)
            if capture.overflow and not capture.keep_tail:
                tree.kill()
                return
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass


async def _stop(process: anyio.abc.Process, tree: ProcessTree) -> None:
    """Terminate a still running program, kill whatever is left of its tree, reap it all."""
    with anyio.CancelScope(shield=True):
        if process.returncode is None:
            tree.signal(signal.SIGTERM)
            with anyio.move_on_after(TERM_GRACE_SECONDS):
                await process.wait()
        tree.kill()  # whatever is left, descendants that left the group included, dies now
        with anyio.move_on_after(5.0):
            await process.wait()
        await process.aclose()
        await tree.reap()


async def run_program(
    argv: list[str], stdin: bytes, *, env: Mapping[str, str], cwd: Path
) -> _Completed:
    """Run ``argv`` to completion in its own process group; see the module docstring."""
    tree = ProcessTree()
    try:
        process = await anyio.open_process(
            argv,
            env=tree.environment(env),
            cwd=cwd,
            start_new_session=True,
            stdin=PIPE,
            stdout=PIPE,
            stderr=PIPE,
        )
    except OSError as exc:
        raise ToolError(
            ToolErrorCode.UNAVAILABLE, f"cannot start {argv[0]!r}: {exc.strerror or exc}"
        ) from exc
    tree.started(process.pid)
    out = OutputCapture(MAX_STDOUT_BYTES, keep_tail=False)
    err = OutputCapture(MAX_STDERR_BYTES, keep_tail=True)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_feed, process.stdin, stdin)
            tg.start_soon(_drain, process.stdout, out, tree)
            tg.start_soon(_drain, process.stderr, err, tree)
            async with anyio.create_task_group() as watching:
                watching.start_soon(tree.watch)
                returncode = await process.wait()
                watching.cancel_scope.cancel()
            # Descendants still holding our pipes would keep the readers waiting.
            tree.kill()
    finally:
        await _stop(process, tree)
    return _Completed(returncode, bytes(out.data), bytes(err.data), out.overflow)


def parse_output(stdout: bytes) -> Any:
    """A program's result: its stdout as JSON when it is JSON, else as text."""
    text = stdout.decode("utf-8", errors="replace")
    stripped = text.strip()
    if not stripped:
        return ""
    try:
        return json.loads(stripped)
    except ValueError:
        return text.rstrip("\n")


def exit_description(returncode: int) -> str:
    """``exited with code N`` or ``was killed by SIGX``, for error reasons."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


class ExecTool(Tool):
    """A Tool that runs a program per call; see the module docstring."""

    plants_environment = True

    def __init__(
        self,
        name: str,
        spec: ToolSpecModel,
        program: str,
        env: dict[str, str],
        isolation: Isolation,
    ) -> None:
        assert spec.exec is not None
        self.ref = name
        self.spec = declared_spec(name, spec)
        self.idempotent = spec.idempotent
        self.isolation = isolation
        self._argv = [program, *spec.exec.command[1:]]
        self._cwd = spec.exec.cwd
        self._env = env
        self._wall_seconds = spec.exec.isolation.limits.wall_seconds

    @property
    def command(self) -> list[str]:
        """The command a call runs, its program resolved on the host."""
        return list(self._argv)

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        return parse_output(await self.run(json.dumps(arguments).encode("utf-8"), ctx))

    async def run(self, payload: bytes, ctx: ToolContext) -> bytes:
        """One run of the program with ``payload`` on stdin: its stdout, or the ToolError."""
        workspace = ctx.workspace.resolve()
        await anyio.Path(workspace).mkdir(parents=True, exist_ok=True)
        if self._cwd:
            await anyio.to_thread.run_sync(workspace_directory, workspace, self._cwd)
        env = await locked_environment(
            workspace,
            self._env,
            {
                **ctx.environment,
                "CORRAL_IDEMPOTENCY_KEY": ctx.idempotency_key,
                "CORRAL_RUN_ID": ctx.run_id,
                "CORRAL_TOOL_CALL_ID": ctx.call_id,
            },
            view=self.isolation.view(workspace),
        )
        program = os.path.basename(self._argv[0])
        launch = self.isolation.launch(self._argv, workspace, self._cwd or "", env)
        try:
            with anyio.move_on_after(self._wall_seconds or math.inf) as wall:
                done = await run_program(launch.argv, payload, env=launch.env, cwd=launch.cwd)
            if wall.cancelled_caught:
                raise ToolError(
                    ToolErrorCode.RESOURCE_EXHAUSTED,
                    f"{program} ran past its wall_seconds limit ({self._wall_seconds:g} s)",
                    details={"limit": "wall_seconds"},
                )
            stderr = done.stderr.decode("utf-8", errors="replace")
            limit = launch.limit_hit(done.returncode, stderr)
        finally:
            await launch.aclose()
            # the program's processes are gone: nothing it left may grant privilege
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(strip_setid_bits, workspace)
        setup_failure = launch.setup_failure(done.returncode, stderr)
        if setup_failure is not None:
            raise setup_failure
        if limit is not None:
            tail = stderr.strip()[-_REASON_STDERR_CHARS:]
            raise ToolError(
                ToolErrorCode.RESOURCE_EXHAUSTED,
                f"{program} hit its {limit} limit "
                f"({getattr(self.isolation.limits, limit)}) and {exit_description(done.returncode)}",
                details={"limit": limit, "exit_code": done.returncode, "stderr": tail},
            )
        if done.stdout_overflow:
            raise ToolError(
                ToolErrorCode.OUTPUT_TOO_LARGE,
                f"{program} wrote more than {MAX_STDOUT_BYTES} bytes to stdout and was killed",
            )
        if done.returncode != 0:
            tail = stderr.strip()[-_REASON_STDERR_CHARS:]
            reason = f"{program} {exit_description(done.returncode)}"
            raise ToolError(
                ToolErrorCode.EXECUTION_FAILED,
                f"{reason}: {tail}" if tail else reason,
                details={"exit_code": done.returncode, "stderr": tail},
            )
        return done.stdout


def create(
    name: str,
    spec: ToolSpecModel,
    secrets: Mapping[str, str],
    *,
    sandbox_host: SandboxHost | None = None,
) -> Tool:
    """Build an ``exec`` Tool; configuration problems raise ``ConfigurationError`` now.

    ``sandbox_host`` is the machine's side of isolation (default: read from the
    environment); resolving ``auto`` probes bubblewrap once per process.
    """
    if spec.exec is None:
        raise ConfigurationError(f"Tool {name!r}: type 'exec' needs an 'exec' block")
    owner = f"Tool {name!r}"
    cwd = spec.exec.cwd
    if cwd is not None:
        parts = PurePosixPath(os.path.normpath(cwd)).parts
        if PurePosixPath(cwd).is_absolute() or (parts and parts[0] == ".."):
            raise ConfigurationError(f"{owner}: cwd {cwd!r} must stay inside the agent workspace")
    host = sandbox_host if sandbox_host is not None else SandboxHost.from_env()
    sandboxed = spec.exec.isolation.mode != "none" and host.probe().works
    program = resolve_program(
        spec.exec.command[0], owner=owner, prefer_path=SAFE_PATH if sandboxed else None
    )
    env = declared_environment(spec.exec.env, secrets, owner=owner)
    argv = [program, *spec.exec.command[1:]]
    isolation = resolve_isolation(spec.exec.isolation, argv, host, owner=owner)
    return ExecTool(name, spec, program, env, isolation)
