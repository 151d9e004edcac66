"""The ``isolation`` block of ``exec`` tools: how a tool's program is sandboxed.

The spec is data; what it does lives in :mod:`corral.tools.sandbox`. Extra binds
(``read_only_paths``, ``writable_paths``) are checked when the resource is applied
(:func:`bind_problem`): absolute, not ``/proc``, nothing of ``CORRAL_HOME`` (neither
inside it nor a parent of it), and only under a directory the operator allowed with
``CORRAL_SANDBOX_ALLOWED_PATHS`` (colon separated). The tool kind checks them again
against the live settings when it builds the tool.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from corral.resources.spec import Spec

__all__ = [
    "ALLOWED_PATHS_VARIABLE",
    "FORBIDDEN_ROOTS",
    "IsolationLimits",
    "IsolationSpec",
    "allowed_paths_from_env",
    "bind_problem",
    "capped_limits",
    "corral_home_from_env",
]

#: the operator's list of host directories tools may be given (colon separated)
ALLOWED_PATHS_VARIABLE = "CORRAL_SANDBOX_ALLOWED_PATHS"
#: never bound into a sandbox, whatever the operator allowed
FORBIDDEN_ROOTS = ("/proc", "/sys", "/dev")

IsolationMode = Literal["auto", "sandbox", "none"]


class IsolationLimits(Spec):
    """Resource limits of one call's processes (unset: no limit)."""

    memory_mb: int | None = Field(
        default=None, ge=16, description="address space of each process (RLIMIT_AS), MiB"
    )
    cpu_seconds: int | None = Field(
        default=None, ge=1, description="CPU time of each process (RLIMIT_CPU)"
    )
    max_processes: int | None = Field(
        default=None, ge=1, le=100_000, description="processes (and threads) alive at once"
    )
    max_file_mb: int | None = Field(
        default=None, ge=1, description="largest file a process may write (RLIMIT_FSIZE), MiB"
    )
    tmp_mb: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description="size of the sandbox's /tmp, a tmpfs held in memory, MiB (unset: 256)",
    )
    wall_seconds: float | None = Field(
        default=None, gt=0, description="wall-clock time of the call, then resource_exhausted"
    )


def capped_limits(limits: IsolationLimits, maxima: IsolationLimits | None) -> IsolationLimits:
    """``limits`` with none above ``maxima`` (a NamespacePolicy's): an unset limit takes
    the maximum, a larger one is lowered to it."""
    if maxima is None:
        return limits
    update: dict[str, float] = {}
    for name in IsolationLimits.model_fields:
        top = getattr(maxima, name)
        mine = getattr(limits, name)
        if top is not None and (mine is None or mine > top):
            update[name] = top
    return limits.model_copy(update=update) if update else limits


class IsolationSpec(Spec):
    """How an ``exec`` tool's program is isolated from the host (see README, Isolation)."""

    mode: IsolationMode = Field(
        default="auto",
        description=(
            "sandbox: always in a bubblewrap sandbox, failing the call (isolation_unavailable) "
            "where it cannot; none: as the server's user; auto: sandbox where bubblewrap works"
        ),
    )
    network: bool = Field(default=False, description="share the host's network (sandbox only)")
    workspace: Literal["rw", "ro", "none"] = Field(
        default="rw", description="the agent workspace at /workspace: read-write, read-only, absent"
    )
    limits: IsolationLimits = Field(default_factory=IsolationLimits)
    read_only_paths: list[str] = Field(
        default_factory=list, description="host paths shown read-only at the same path"
    )
    writable_paths: list[str] = Field(
        default_factory=list, description="host paths shown read-write at the same path"
    )

    @field_validator("read_only_paths", "writable_paths")
    @classmethod
    def _allowed_binds(cls, paths: list[str], info: ValidationInfo) -> list[str]:
        if info.context is not None and info.context.get("stored"):
            return paths  # checked again when the tool is built
        for path in paths:
            problem = bind_problem(path, corral_home_from_env(), allowed_paths_from_env())
            if problem is not None:
                raise ValueError(problem)
        return paths


def corral_home_from_env(environ: Mapping[str, str] | None = None) -> Path:
    """``CORRAL_HOME`` as :class:`corral.core.settings.Settings` reads it, resolved."""
    env = os.environ if environ is None else environ
    return Path(env.get("CORRAL_HOME") or Path.home() / ".corral").expanduser().resolve()


def allowed_paths_from_env(environ: Mapping[str, str] | None = None) -> tuple[Path, ...]:
    """The operator's ``CORRAL_SANDBOX_ALLOWED_PATHS``, resolved (relative entries ignored)."""
    env = os.environ if environ is None else environ
    entries = (env.get(ALLOWED_PATHS_VARIABLE) or "").split(":")
    return tuple(Path(e).resolve() for e in entries if e and os.path.isabs(e))


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def bind_problem(path: str, corral_home: Path, allowed: Sequence[Path]) -> str | None:
    """Why ``path`` may not be bound into a sandbox, or ``None`` when it may."""
    if "\0" in path or not PurePosixPath(path).is_absolute():
        return f"{path!r} must be an absolute path"
    if ".." in PurePosixPath(path).parts:
        return f"{path!r} must not contain '..'"
    real = Path(path).resolve()  # a symlink is judged by what it points to
    for forbidden in FORBIDDEN_ROOTS:
        if _within(real, Path(forbidden)):
            return f"{path!r} is under {forbidden}, which is never bound into a sandbox"
    home = corral_home.resolve()
    if _within(real, home) or _within(home, real):
        return f"{path!r} would show CORRAL_HOME (its keys, tokens and database) to the tool"
    if not any(_within(real, root) for root in allowed):
        return (
            f"{path!r} is not under a directory the operator allowed "
            f"({ALLOWED_PATHS_VARIABLE}={':'.join(map(str, allowed)) or 'unset'})"
        )
    return None
