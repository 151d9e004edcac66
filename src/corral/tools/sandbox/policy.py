"""The seam tool kinds run programs through: an :class:`Isolation` per tool.

:func:`resolve_isolation` turns a tool's ``isolation`` spec and the host into one of:

- :class:`Sandboxed` the program runs in a bubblewrap sandbox (:mod:`.bwrap`);
- :class:`Unsandboxed` the program runs as the server's user (``mode: none``, or
  ``auto`` where bubblewrap does not work);
- :class:`Unavailable` ``mode: sandbox`` where bubblewrap does not work: every call
  fails closed with ``isolation_unavailable`` and the reason.

All three apply the same limits (:mod:`.limits`). A tool kind asks its isolation for
the :class:`View` (where the workspace, ``HOME`` and ``TMPDIR`` are as the program
sees them), builds the environment, and asks for a :class:`Launch` per call.

The files a Tool's command names are shown to the sandbox read-only, each file
alone: the program (as named and as its symlinks resolve) and every absolute
argument that names a file; never one in ``CORRAL_HOME``, ``/proc``, ``/sys`` or
``/dev``. A program outside the system directories that lies in an operator-allowed
directory (``CORRAL_SANDBOX_ALLOWED_PATHS``) brings that whole directory, so an
interpreter finds its library beside it (a virtualenv's ``python`` needs the
virtualenv and the interpreter it links to). A bare program name is looked up on
the sandbox's own ``PATH`` first (the system's ``python3``, not a shim of the server
user's).
"""

from __future__ import annotations

import os
import stat
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from corral.core.errors import ConfigurationError, ToolError, ToolErrorCode
from corral.resources.isolation import (
    ALLOWED_PATHS_VARIABLE,
    IsolationLimits,
    IsolationSpec,
    bind_problem,
)
from corral.tools.sandbox.bwrap import (
    DEFAULT_TMP_MB,
    SYSTEM_DIRS,
    WORKSPACE,
    SandboxLayout,
    bwrap_argv,
    host_safe_environment,
)
from corral.tools.sandbox.host import SandboxHost
from corral.tools.sandbox.limits import CallCgroup, limit_hit, prlimit_argv, sandbox_limits
from corral.tools.sandbox.programs import Interpreter, interpreters, symlink_chain

__all__ = [
    "Isolation",
    "Launch",
    "Sandboxed",
    "Unavailable",
    "Unsandboxed",
    "View",
    "private_parent",
    "resolve_isolation",
]


@dataclass(frozen=True)
class View:
    """Paths as the program sees them."""

    workspace: str
    home: str
    tmp: str


@dataclass
class Launch:
    """How to start one call's program, and what to make of how it ended."""

    argv: list[str]
    #: the host directory the launcher starts in (bwrap changes into the sandbox's own)
    cwd: Path
    limits: IsolationLimits
    sandboxed: bool
    #: the environment ``argv`` starts with (a sandbox's launchers get no loader variables)
    env: dict[str, str] = field(default_factory=dict[str, str])
    cgroup: CallCgroup | None = None
    #: named in messages as ``$CORRAL_HOME``
    corral_home: Path | None = None

    def limit_hit(self, returncode: int, stderr: str) -> str | None:
        """The limit the program hit, when it failed and that can be told (see :mod:`.limits`)."""
        if self.cgroup is None:
            return limit_hit(self.limits, returncode, stderr)
        return limit_hit(
            self.limits,
            returncode,
            stderr,
            pids_max_events=self.cgroup.max_events(),
            oom_kills=self.cgroup.oom_kills(),
        )

    def setup_failure(self, returncode: int, stderr: str) -> ToolError | None:
        """The error of a sandbox ``bwrap`` could not set up (its one line, exit code 1).

        ``bwrap`` fails before the program starts, so the program cannot have written
        anything; a program that fakes the line only mislabels its own failure.
        """
        lines = stderr.strip().splitlines()
        if not self.sandboxed or returncode != 1 or len(lines) != 1:
            return None
        if not lines[0].startswith("bwrap: "):
            return None
        message = lines[0].removeprefix("bwrap: ")
        if self.corral_home is not None:  # the workspace's host path names it
            message = message.replace(str(self.corral_home), "$CORRAL_HOME")
        if message.startswith("execvp ") and message.endswith("No such file or directory"):
            message += (
                " (the program, or the interpreter its #! line names, is not in the sandbox:"
                " an interpreter outside the system's directories needs its installation"
                f" allowed with {ALLOWED_PATHS_VARIABLE})"
            )
        return ToolError(
            ToolErrorCode.ISOLATION_UNAVAILABLE, f"the sandbox could not be set up: {message}"
        )

    async def aclose(self) -> None:
        """Release what the launch made (its cgroup), after its processes are gone."""
        if self.cgroup is not None:
            await self.cgroup.remove()


class Isolation(ABC):
    """How a tool's programs run; see the module docstring."""

    #: what calls actually run under: ``sandbox``, ``none`` or ``unavailable``
    mode: str

    def __init__(
        self, limits: IsolationLimits, host: SandboxHost, defaulted: frozenset[str] = frozenset()
    ) -> None:
        self.limits = limits
        self.host = host
        #: the limits the tool left unset, that the sandbox's defaults filled
        self.defaulted = defaulted

    @abstractmethod
    def view(self, workspace: Path) -> View:
        """Where the program sees its workspace, ``HOME`` and ``TMPDIR``."""

    @abstractmethod
    def launch(
        self, argv: Sequence[str], workspace: Path, cwd: str, env: Mapping[str, str]
    ) -> Launch:
        """The launch of ``argv`` (host paths) in ``cwd`` (relative to the workspace) with
        ``env`` (the program's whole environment)."""

    def _bounds(self, *, nproc: bool) -> tuple[CallCgroup | None, list[str]]:
        """The call's cgroup, where one binds a limit, and the ``prlimit`` prefix of the rest.

        ``memory_mb`` binds all the call's processes together through a memory cgroup
        where one can be made, and each process's address space (``RLIMIT_AS``) when
        the tool set it; the sandbox's default binds ``RLIMIT_DATA`` where there is no
        cgroup (an address space limit breaks runtimes that reserve more than they
        use). ``max_processes`` binds through a pids cgroup when the server is root
        (``RLIMIT_NPROC`` does not bind root).
        """
        limits = rlimits = self.limits
        roots: dict[str, Path] = {}
        data_mb = None
        if limits.memory_mb is not None:
            root = self.host.memory_cgroup_root()
            if root is not None:
                roots["memory"] = root
            if "memory_mb" in self.defaulted:
                rlimits = rlimits.model_copy(update={"memory_mb": None})
                data_mb = None if root is not None else limits.memory_mb
        if limits.max_processes is not None and os.geteuid() == 0:
            root = self.host.cgroup_root()
            if root is not None:
                roots["pids"] = root
        if not roots:
            return None, prlimit_argv(rlimits, nproc=nproc, data_mb=data_mb)
        try:
            cgroup = CallCgroup(
                roots, max_processes=limits.max_processes, memory_mb=limits.memory_mb
            )
        except OSError as exc:
            raise ToolError(
                ToolErrorCode.ISOLATION_UNAVAILABLE,
                f"the call's cgroup could not be made: {exc.strerror or exc}",
            ) from exc
        return cgroup, prlimit_argv(rlimits, nproc=nproc, data_mb=data_mb)

    def _launch(
        self,
        command: list[str],
        cwd: Path,
        env: Mapping[str, str],
        cgroup: CallCgroup | None,
        *,
        sandboxed: bool,
    ) -> Launch:
        """``command``, in the call's cgroup when it has one."""
        if cgroup is not None:
            command = [*cgroup.join_argv(), *command]
        return Launch(
            command, cwd, self.limits, sandboxed, dict(env), cgroup, self.host.corral_home
        )


class Unsandboxed(Isolation):
    """The program runs as the server's user, in the host's view (limits still apply)."""

    mode = "none"

    def view(self, workspace: Path) -> View:
        return View(str(workspace), str(workspace / "home"), str(workspace / "tmp"))

    def launch(
        self, argv: Sequence[str], workspace: Path, cwd: str, env: Mapping[str, str]
    ) -> Launch:
        cgroup, rlimits = self._bounds(nproc=False)
        return self._launch([*rlimits, *argv], workspace / cwd, env, cgroup, sandboxed=False)


class Unavailable(Isolation):
    """``mode: sandbox`` where bubblewrap does not work: every call fails closed."""

    mode = "unavailable"

    def __init__(self, limits: IsolationLimits, host: SandboxHost, reason: str) -> None:
        super().__init__(limits, host)
        self.reason = reason

    def view(self, workspace: Path) -> View:
        return View(WORKSPACE, f"{WORKSPACE}/home", "/tmp")

    def launch(
        self, argv: Sequence[str], workspace: Path, cwd: str, env: Mapping[str, str]
    ) -> Launch:
        raise ToolError(
            ToolErrorCode.ISOLATION_UNAVAILABLE,
            f"this tool must run sandboxed, and the sandbox cannot run here: {self.reason}",
        )


class Sandboxed(Isolation):
    """The program runs in a bubblewrap sandbox (see :mod:`.bwrap`)."""

    mode = "sandbox"

    def __init__(
        self,
        spec: IsolationSpec,
        host: SandboxHost,
        bwrap: str,
        read_only: Sequence[Path] = (),
        writable: Sequence[Path] = (),
    ) -> None:
        limits, defaulted = sandbox_limits(spec.limits)
        super().__init__(limits, host, defaulted)
        self.spec = spec
        self.bwrap = bwrap
        self.read_only = tuple(read_only)
        self.writable = tuple(writable)
        # what each bind resolved to when it was checked: a call binds it only unchanged
        self._checked = {p: os.path.realpath(p) for p in (*self.read_only, *self.writable)}

    def view(self, workspace: Path) -> View:
        if self.spec.workspace == "rw":
            return View(WORKSPACE, f"{WORKSPACE}/home", "/tmp")
        return View(WORKSPACE if self.spec.workspace == "ro" else "/tmp", "/tmp/home", "/tmp")

    def launch(
        self, argv: Sequence[str], workspace: Path, cwd: str, env: Mapping[str, str]
    ) -> Launch:
        self._recheck()
        program = [os.path.abspath(argv[0]), *argv[1:]]
        if self.spec.workspace == "none":
            inside = "/tmp"
        else:
            inside = os.path.normpath(f"{WORKSPACE}/{cwd}") if cwd else WORKSPACE
        layout = SandboxLayout(
            workspace=None if self.spec.workspace == "none" else workspace,
            workspace_writable=self.spec.workspace == "rw",
            network=self.spec.network,
            read_only=self.read_only,
            writable=self.writable,
            cwd=inside,
            tmp_mb=self.limits.tmp_mb if self.limits.tmp_mb is not None else DEFAULT_TMP_MB,
        )
        # bwrap (and the cgroup's shell) run on the host: the loader variables a Tool
        # declares (LD_PRELOAD of a library its program wrote) must not reach them
        outside, inside_only = host_safe_environment(env)
        cgroup, rlimits = self._bounds(nproc=True)
        command = bwrap_argv(self.bwrap, layout, [*rlimits, *program], setenv=inside_only)
        return self._launch(command, workspace, outside, cgroup, sandboxed=True)

    def _recheck(self) -> None:
        """Fail the call when a bind now resolves elsewhere than when it was checked.

        A directory writable by some tool (an allowed ``writable_paths``) may be where a
        bound path lies: a symlink put there after the checks would bind what it points
        to (``CORRAL_HOME``). This narrows that to the moment between here and ``bwrap``.
        """
        for path, checked in self._checked.items():
            if os.path.realpath(path) != checked:
                raise ToolError(
                    ToolErrorCode.ISOLATION_UNAVAILABLE,
                    f"the sandbox will not show {str(path)!r}: it was replaced "
                    "(by a symlink, or moved) since the tool was built",
                )


@dataclass(frozen=True)
class _Binds:
    read_only: list[Path] = field(default_factory=list[Path])
    writable: list[Path] = field(default_factory=list[Path])


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _binds(spec: IsolationSpec, argv: Sequence[str], host: SandboxHost, owner: str) -> _Binds:
    """The extra binds of a sandbox: the declared ones, checked, and the command's files."""
    binds = _Binds()
    for paths, into in (
        (spec.read_only_paths, binds.read_only),
        (spec.writable_paths, binds.writable),
    ):
        for path in paths:
            problem = bind_problem(path, host.corral_home, host.allowed_paths)
            if problem is not None:
                raise ConfigurationError(f"{owner}: isolation: {problem}")
            into.append(Path(path).resolve())
    # The program as named and each path its symlinks lead to (a venv's python and the
    # interpreter it links to), the interpreters its #! line names, then every absolute
    # argument that names a file.
    for file in symlink_chain(Path(argv[0])):
        _show(file, binds, host, owner, root_allowed=True)
    for interpreter in interpreters(Path(argv[0])):
        for file in symlink_chain(interpreter.path):
            _show_interpreter(file, interpreter, binds, host, owner)
    for argument in argv[1:]:
        if os.path.isabs(argument) and os.path.isfile(argument):
            _show(Path(argument), binds, host, owner, root_allowed=False)
    return binds


def _shown(file: Path, binds: _Binds) -> bool:
    """Whether the sandbox already shows ``file``: a system directory or a bind holds it."""
    roots = [*map(Path, SYSTEM_DIRS), *binds.read_only, *binds.writable]
    return any(_within(file, root) for root in roots)


def _show(file: Path, binds: _Binds, host: SandboxHost, owner: str, *, root_allowed: bool) -> None:
    """Bind ``file`` read-only unless it is shown: a program (``root_allowed``) brings the
    allowed directory it lies in, so an interpreter finds its library beside it; else the
    file alone, when every user may read it."""
    if _shown(file, binds):
        return
    root = next((r for r in host.allowed_paths if _within(file, r)), None)
    bind = root if root_allowed and root is not None else file
    problem = bind_problem(str(bind), host.corral_home, [bind.resolve()])
    if problem is None and root is None and not _public(file):
        problem = _private_problem(file)
    if problem is not None:
        raise ConfigurationError(f"{owner}: the sandbox cannot show {str(file)!r}: {problem}")
    binds.read_only.append(bind)


def _show_interpreter(
    file: Path, interpreter: Interpreter, binds: _Binds, host: SandboxHost, owner: str
) -> None:
    """Bind the allowed directory of a path on the way to an interpreter, unless it is
    shown: an interpreter needs its installation beside it, never only its file."""
    if _shown(file, binds):
        return
    named = f"the interpreter {str(interpreter.path)!r} that {str(interpreter.script)!r} names"
    if not os.path.lexists(file):
        raise ConfigurationError(f"{owner}: {named} in its #! line does not exist")
    root = next((r for r in host.allowed_paths if _within(file, r)), None)
    problem = None if root is None else bind_problem(str(root), host.corral_home, [root.resolve()])
    if root is None:
        shown = "" if file == interpreter.path else f" ({str(file)!r}, where it links)"
        problem = (
            f"it is not among the system's directories nor under one the operator allowed "
            f"with {ALLOWED_PATHS_VARIABLE}: allow the installation it belongs to{shown}"
        )
    if problem is not None:
        raise ConfigurationError(f"{owner}: the sandbox cannot show {named}: {problem}")
    assert root is not None
    binds.read_only.append(root)


def private_parent(path: Path) -> Path | None:
    """The first directory on the way to ``path`` other users may not enter, or ``None``."""
    for parent in reversed(Path(os.path.abspath(path)).parents):
        try:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return parent
        except OSError:
            return parent
    return None


def _private_problem(file: Path) -> str:
    """Why ``file`` is not shown, and the one setting that shows it."""
    directory = Path(os.path.abspath(file)).parent
    how = (
        f"to run tools from there, the operator allows the directory with "
        f"{ALLOWED_PATHS_VARIABLE}={directory} (`corral doctor` shows the setting)"
    )
    try:
        readable = bool(os.stat(file).st_mode & stat.S_IROTH)
    except OSError:
        readable = False
    closed = private_parent(file)
    if readable and closed is not None:
        return (
            f"only the server's user may read it: it lies in {str(closed)!r}, which other "
            f"users may not enter; {how}"
        )
    return f"only the server's user may read it; {how}"


def _public(file: Path) -> bool:
    """Whether every user of this machine may read ``file`` (as named and as it resolves).

    A Tool's author chooses its command: a file the command names outside the allowed
    paths is shown only when it discloses nothing (``/etc/shadow``, ``~/.ssh/id_rsa``
    and whatever lies in a private directory do not qualify).
    """
    for path in dict.fromkeys([Path(os.path.abspath(file)), file.resolve()]):
        try:
            if not os.stat(path).st_mode & stat.S_IROTH:
                return False
            # every directory on the way must be searchable by others (no private parent)
            for parent in path.parents:
                if not os.stat(parent).st_mode & stat.S_IXOTH:
                    return False
        except OSError:
            return False
    return True


def resolve_isolation(
    spec: IsolationSpec, argv: Sequence[str], host: SandboxHost, *, owner: str
) -> Isolation:
    """The isolation a tool's calls run under (configuration problems raise now).

    Probes bubblewrap unless ``mode: none`` (once per process, blocking the first time).
    """
    if spec.mode == "none":
        return Unsandboxed(spec.limits, host)
    probe = host.probe()
    if not probe.works or probe.path is None:
        if spec.mode == "sandbox":
            return Unavailable(spec.limits, host, probe.reason)
        return Unsandboxed(spec.limits, host)
    binds = _binds(spec, argv, host, owner)
    return Sandboxed(spec, host, probe.path, binds.read_only, binds.writable)
