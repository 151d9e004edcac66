"""What this machine offers the sandbox, and the operator's settings for it.

:class:`SandboxHost` is the seam tests and front doors inject: where to look for
``bwrap`` (a ``PATH`` or an explicit path), ``CORRAL_HOME`` (never shown to a tool
but for the workspace) and ``CORRAL_SANDBOX_ALLOWED_PATHS``. :meth:`SandboxHost.probe`
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

__all__ = ["BwrapProbe", "SandboxHost", "find_pids_cgroup"]

#: how long the probe's trial sandbox may take
_PROBE_SECONDS = 10.0
#: the trial sandbox: the namespaces a tool's sandbox takes, around a program that does nothing
_TRIAL = ("--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc",
          "--dev", "/dev", "--", "/bin/true")  # fmt: skip
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
    return BwrapProbe(True, bwrap, version, user_namespaces=True)


def find_pids_cgroup() -> Path | None:
    """A cgroup directory this process may create pids-limited children in, or ``None``.

    Only needed where ``RLIMIT_NPROC`` does not bind (the server runs as root): the
    cgroup v1 ``pids`` hierarchy, or the v2 cgroup of this process when ``pids`` is
    delegated to its children.
    """
    v1 = Path("/sys/fs/cgroup/pids")
    if (v1 / "cgroup.procs").exists() and os.access(v1, os.W_OK):
        return v1
    try:
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in own:
        if line.startswith("0::"):
            here = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
            try:
                delegated = (here / "cgroup.subtree_control").read_text().split()
            except OSError:
                return None
            if "pids" in delegated and os.access(here, os.W_OK):
                return here
    return None


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
