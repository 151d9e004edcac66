"""The ``bwrap`` command line of one sandbox.

What the sandbox holds:

- new user, PID, IPC, UTS and cgroup namespaces, and a new network namespace (only
  loopback, nothing listening) unless ``network: true``; no capabilities; a session
  of its own (``--new-session``: no ``TIOCSTI`` into a terminal); it dies with the
  process that started it (``--die-with-parent``), and when its PID 1 ends the
  kernel kills everything left in its PID namespace, ``setsid()`` daemons included;
- a fresh ``/proc`` (the sandbox's processes only) whose kernel knobs are read-only
  (``/proc/sys``, ``/proc/sysrq-trigger``, ... :data:`PROC_READ_ONLY`) and whose
  windows on the kernel's memory and state are masked (``/proc/kcore``, ...
  :data:`PROC_MASKED`), on every kernel: bubblewrap leaves ``/proc/sys`` writable
  where ``access()`` says it is not (gVisor), and a sysctl written there reaches the
  host's kernel; and a minimal ``/dev``, read-only but for its devices and a
  ``/dev/shm`` of the size of ``/tmp``;
- the system's ``/usr`` (and ``/bin``, ``/sbin``, ``/lib*``) read-only, and of
  ``/etc`` only the files name resolution, certificates, users and the dynamic linker
  read (:data:`ETC_ENTRIES`);
- the agent workspace at ``/workspace`` (read-write, read-only, or absent), a tmpfs
  ``/tmp`` of ``tmp_mb`` (:data:`DEFAULT_TMP_MB`), and the extra binds the tool declared and the operator allowed; every
  other path is read-only.

Nothing else of the host is there: not ``CORRAL_HOME`` (keys, tokens, the database,
other agents' workspaces), not ``/root`` or ``/home``, not other processes. The
environment is not given on the command line (where ``ps`` would show secrets): the
``bwrap`` process is started with the tool's environment, which it passes on, less
the variables that steer the dynamic linker, libc or a shell (:func:`host_safe_environment`):
``bwrap`` runs on the host, as the server's user, and ``LD_PRELOAD`` of a library the
program wrote into its workspace would run there. Those few reach the program by
``--setenv`` (on the command line: paths, not secrets).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "DEFAULT_TMP_MB",
    "ETC_ENTRIES",
    "PROC_MASKED",
    "PROC_READ_ONLY",
    "SYSTEM_DIRS",
    "WORKSPACE",
    "SandboxLayout",
    "bwrap_argv",
    "host_safe_environment",
]

#: where the agent workspace appears inside a sandbox
WORKSPACE = "/workspace"
#: host directories every sandbox sees read-only (a symlink stays a symlink)
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: the entries of /etc a sandbox sees, read-only, where the host has them
ETC_ENTRIES = (
    "resolv.conf", "hosts", "host.conf", "nsswitch.conf", "gai.conf", "services",
    "protocols", "passwd", "group", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
    "localtime", "ssl/certs", "ssl/openssl.cnf", "ca-certificates", "ca-certificates.conf",
    "alternatives", "mime.types",
)  # fmt: skip
#: entries of ``/proc`` a sandbox sees read-only, where the kernel has them
PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")
#: files of ``/proc`` a sandbox sees as an empty ``/dev/null``, and directories as an
#: empty read-only tmpfs, where the kernel has them (the list container runtimes mask)
PROC_MASKED = (
    "kcore", "kmsg", "keys", "key-users", "latency_stats", "timer_list", "timer_stats",
    "sched_debug", "acpi", "scsi", "asound",
)  # fmt: skip
#: the size of a sandbox's ``/tmp`` (a tmpfs: memory) unless its limits say otherwise
DEFAULT_TMP_MB = 256
#: variables glibc's dynamic linker and libc, or a shell, act on (glibc drops the same
#: ones for setuid programs), and the prefixes of more
_HOST_UNSAFE = frozenset({
    "GCONV_PATH", "GETCONF_DIR", "HOSTALIASES", "LOCALDIR", "LOCPATH", "NIS_PATH",
    "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TZDIR", "TZ",
    "ENV", "BASH_ENV", "IFS", "CDPATH", "SHELLOPTS", "BASHOPTS", "PS4",
})  # fmt: skip
_HOST_UNSAFE_PREFIXES = ("LD_", "MALLOC_", "GLIBC_", "BASH_FUNC_")


@dataclass(frozen=True)
class SandboxLayout:
    """What one sandbox shows and shares (see the module docstring)."""

    workspace: Path | None
    workspace_writable: bool = True
    network: bool = False
    read_only: Sequence[Path] = field(default_factory=tuple[Path, ...])
    writable: Sequence[Path] = field(default_factory=tuple[Path, ...])
    #: the working directory inside the sandbox
    cwd: str = WORKSPACE
    hostname: str = "corral-sandbox"
    #: the size of the tmpfs ``/tmp``, MiB
    tmp_mb: int = DEFAULT_TMP_MB


def host_safe_environment(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``env`` split in what may reach ``bwrap`` on the host and what only the sandbox gets."""
    outside: dict[str, str] = {}
    inside: dict[str, str] = {}
    for name, value in env.items():
        unsafe = name in _HOST_UNSAFE or name.startswith(_HOST_UNSAFE_PREFIXES)
        (inside if unsafe else outside)[name] = value
    return outside, inside


def _system_binds() -> list[str]:
    argv: list[str] = []
    for directory in SYSTEM_DIRS:
        if os.path.islink(directory):
            argv += ["--symlink", os.readlink(directory), directory]
        elif os.path.isdir(directory):
            argv += ["--ro-bind", directory, directory]
    argv += ["--dir", "/etc"]
    for entry in ETC_ENTRIES:
        path = f"/etc/{entry}"
        if os.path.lexists(path):
            argv += ["--ro-bind-try", path, path]
    return argv


def _proc_guards(proc: str = "/proc") -> list[str]:
    """Binds over the fresh ``/proc``: its knobs read-only, its kernel windows masked.

    The sources are the host's own ``/proc`` entries (``bwrap`` binds from the old root):
    the same kernel's, and ``/proc/sys`` answers for the namespaces of who reads it.
    """
    argv: list[str] = []
    for entry in PROC_READ_ONLY:
        path = f"{proc}/{entry}"
        if os.path.lexists(path):
            argv += ["--ro-bind", path, path]
    for entry in PROC_MASKED:
        path = f"{proc}/{entry}"
        if os.path.isdir(path):
            argv += ["--tmpfs", path, "--remount-ro", path]
        elif os.path.lexists(path):
            argv += ["--ro-bind", "/dev/null", path]
    return argv


def bwrap_argv(
    bwrap: str,
    layout: SandboxLayout,
    command: Sequence[str],
    *,
    setenv: Mapping[str, str] | None = None,
) -> list[str]:
    """The full command line running ``command`` in a sandbox laid out as ``layout``,
    ``setenv`` added to the environment ``bwrap`` passes on."""
    argv = [
        bwrap,
        "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        "--hostname", layout.hostname,
    ]  # fmt: skip
    if not layout.network:
        argv.append("--unshare-net")
    argv += _system_binds()
    size = str(layout.tmp_mb * 1024 * 1024)
    argv += ["--proc", "/proc", *_proc_guards(), "--dev", "/dev"]
    argv += ["--size", size, "--tmpfs", "/tmp"]
    # bubblewrap's /dev is a writable tmpfs of no set size (the host's memory): read-only
    # (its devices still work), with a /dev/shm as bounded as /tmp
    argv += ["--remount-ro", "/dev", "--size", size, "--tmpfs", "/dev/shm"]
    argv += ["--dir", "/tmp/home"]
    for path in layout.read_only:
        argv += ["--ro-bind", str(path), str(path)]
    for path in layout.writable:
        argv += ["--bind", str(path), str(path)]
    if layout.workspace is not None:
        bind = "--bind" if layout.workspace_writable else "--ro-bind"
        argv += [bind, str(layout.workspace), WORKSPACE]
    # the sandbox's root is a tmpfs of its own: read-only, so only /tmp and binds take writes
    for name, value in (setenv or {}).items():
        argv += ["--setenv", name, value]
    argv += ["--remount-ro", "/", "--chdir", layout.cwd, "--", *command]
    return argv
