"""What this machine offers the sandbox, and the operator's settings for it.

:class:`SandboxHost` is the seam tests and front doors inject: where to look for
``bwrap`` (a ``PATH`` or an explicit path), ``CORRAL_HOME`` (never shown to a tool
but for the workspace), ``CORRAL_SANDBOX_ALLOWED_PATHS`` and where a call's cgroups
are made. :meth:`SandboxHost.probe`
answers "does bubblewrap work here" by starting one real sandbox, once per ``bwrap``
path and process: worker and server start-ups call it (in a thread) and log the answer.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from corral.resources.isolation import allowed_paths_from_env, corral_home_from_env
from corral.tools.sandbox.bwrap import SandboxLayout, bwrap_argv

__all__ = ["BwrapProbe", "SandboxHost", "find_cgroup", "find_pids_cgroup"]

#: how long the probe's trial sandbox may take
_PROBE_SECONDS = 10.0
#: the trial sandbox: the namespaces a tool's sandbox takes, around a program that does nothing
_TRIAL = ("--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc",
          "--dev", "/dev", "--", "/bin/true")  # fmt: skip
#: kernel knobs every kernel has, that a tool's sandbox must not be able to open for writing
_KNOBS = ("/proc/sys/kernel/domainname", "/proc/sys/vm/drop_caches")
_probes: dict[str, BwrapProbe] = {}
_probe_lock = threading.Lock()


@dataclass(frozen=True)
class BwrapProbe:
    """Whether bubblewrap works here: its path, version, and why not when it does not."""

    works: bool
    path: str | None = None
    version: str | None = None
    user_namespaces: bool = False
    reason: str = ""
    #: whether a tool's sandbox sees ``/proc/sys`` read-only (``None``: no sandbox to ask)
    proc_sys_read_only: bool | None = None

    def describe(self) -> str:
        """One line for a start-up log and ``corral doctor``."""
        if self.works:
            return f"bubblewrap {self.version or '?'} at {self.path}: tools run sandboxed"
        return f"no working bubblewrap ({self.reason})"


def _probe(bwrap: str) -> BwrapProbe:
    try:
        done = subprocess.run(
            [bwrap, "--version"], capture_output=True, text=True, timeout=_PROBE_SECONDS
        )
        version = done.stdout.strip().removeprefix("bubblewrap").strip() or None
        trial = subprocess.run(
            [bwrap, *_TRIAL],
            capture_output=True,
            text=True,
            timeout=_PROBE_SECONDS,
            env={"PATH": "/usr/bin:/bin"},
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return BwrapProbe(False, bwrap, reason=f"{bwrap} cannot be run: {exc}")
    if trial.returncode != 0:
        why = trial.stderr.strip().splitlines()[-1:] or [f"exit code {trial.returncode}"]
        return BwrapProbe(False, bwrap, version, reason=f"a trial sandbox failed: {why[0]}")
    guarded = _proc_sys_read_only(bwrap)
    return BwrapProbe(True, bwrap, version, user_namespaces=True, proc_sys_read_only=guarded)


def _proc_sys_read_only(bwrap: str) -> bool:
    """Whether a sandbox laid out as a tool's fails to open a kernel knob for writing
    (opened for appending: nothing is written, and nothing truncated, when it opens)."""
    knobs = [k for k in _KNOBS if os.path.exists(k)]
    layout = SandboxLayout(workspace=None, cwd="/tmp")
    script = 'for knob in "$@"; do (exec 3>>"$knob") 2>/dev/null && exit 0; done; exit 3'
    argv = bwrap_argv(bwrap, layout, ["/bin/sh", "-c", script, "sh", *knobs])
    try:
        done = subprocess.run(
            argv, capture_output=True, timeout=_PROBE_SECONDS, env={"PATH": "/usr/bin:/bin"}
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 3  # (bwrap's own failures exit 1)


def find_cgroup(controller: str) -> Path | None:
    """A cgroup directory this process may create ``controller``-limited children in.

    The cgroup v1 hierarchy of ``controller`` (``pids``, ``memory``), or the v2 cgroup
    of this process when ``controller`` is delegated to its children; ``None`` when
    there is neither (a server that is not root seldom has one).
    """
    v1 = Path("/sys/fs/cgroup") / controller
    if (v1 / "cgroup.procs").exists() and os.access(v1, os.W_OK):
        return v1
    try:
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in own:
        if line.startswith("0::"):
            for mount in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                here = mount / line[3:].lstrip("/")
                try:
                    delegated = (here / "cgroup.subtree_control").read_text().split()
                except OSError:
                    continue
                if controller in delegated and os.access(here, os.W_OK):
                    return here
    return None


def find_pids_cgroup() -> Path | None:
    """Where pids-limited cgroups can be made (:func:`find_cgroup` of ``pids``)."""
    return find_cgroup("pids")


@dataclass(frozen=True)
class SandboxHost:
    """The machine's side of isolation (see the module docstring)."""

    corral_home: Path
    allowed_paths: tuple[Path, ...] = ()
    #: the PATH ``bwrap`` is looked up on; ``None``: this process's PATH
    search_path: str | None = None
    #: an explicit ``bwrap``; wins over ``search_path``
    bwrap: str | None = None
    #: where pids-limited cgroups are made; ``None``: found by :func:`find_pids_cgroup`
    pids_cgroup: Path | None = field(default=None)
    #: where memory-limited cgroups are made; ``None``: found by :func:`find_cgroup`
    memory_cgroup: Path | None = field(default=None)

    @staticmethod
    def from_env(
        environ: Mapping[str, str] | None = None, *, corral_home: Path | None = None
    ) -> SandboxHost:
        """The host as the environment describes it (``corral_home`` wins over ``CORRAL_HOME``)."""
        env = os.environ if environ is None else environ
        home = corral_home.resolve() if corral_home is not None else corral_home_from_env(env)
        return SandboxHost(home, allowed_paths_from_env(env), search_path=env.get("PATH"))

    def bwrap_path(self) -> str | None:
        """The ``bwrap`` this host would run, or ``None`` when there is none."""
        if self.bwrap is not None:
            return self.bwrap if os.access(self.bwrap, os.X_OK) else None
        path = self.search_path if self.search_path is not None else os.environ.get("PATH", "")
        return shutil.which("bwrap", path=path)

    def probe(self) -> BwrapProbe:
        """Whether bubblewrap works here (a trial sandbox, once per ``bwrap`` and process).

        Blocking the first time (a few milliseconds): call it from a thread at start-up.
        """
        path = self.bwrap_path()
        if path is None:
            where = self.bwrap or "the PATH"
            return BwrapProbe(False, reason=f"bwrap was not found on {where}")
        with _probe_lock:
            if path not in _probes:
                _probes[path] = _probe(path)
            return _probes[path]

    def cgroup_root(self) -> Path | None:
        """Where this host makes pids-limited cgroups (``None``: nowhere)."""
        return self.pids_cgroup if self.pids_cgroup is not None else find_pids_cgroup()

    def memory_cgroup_root(self) -> Path | None:
        """Where this host makes memory-limited cgroups (``None``: nowhere)."""
        return self.memory_cgroup if self.memory_cgroup is not None else find_cgroup("memory")
