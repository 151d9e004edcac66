"""What this machine offers Corral: the record behind ``corral doctor`` and
``GET /v1/capabilities`` (gathered by :mod:`corral.runtime.capabilities`).

It names programs and backends, never a path of ``CORRAL_HOME`` nor a URL with its
credentials: any authenticated caller may read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class SandboxCapability:
    """Whether exec tools can run in a bubblewrap sandbox here."""

    bubblewrap: bool
    #: where ``bwrap`` is (a system path), its version
    path: str | None
    version: str | None
    user_namespaces: bool
    #: what ``isolation: auto`` means on this machine
    auto_mode: Literal["sandbox", "none"]
    #: how ``max_processes`` binds: RLIMIT_NPROC, a pids cgroup (root), or not at all
    max_processes: Literal["rlimit", "cgroup", "unenforced"]
    #: why there is no sandbox, when there is none
    reason: str = ""
    #: whether a sandbox sees ``/proc/sys`` read-only (``None``: no sandbox here)
    proc_sys_read_only: bool | None = None
    #: how ``memory_mb`` binds: a memory cgroup (all of a call's processes), or rlimits
    #: (each process)
    memory: Literal["cgroup", "rlimit"] = "rlimit"


@dataclass(frozen=True)
class BackendCapability:
    """The store or the bus: which kind, whether it is configured and answers."""

    kind: str
    configured: bool
    reachable: bool | None


@dataclass(frozen=True)
class Capabilities:
    """What this machine offers (see the module docstring)."""

    sandbox: SandboxCapability
    #: the WASM tool runtime (``wasmtime``) is importable
    wasmtime: bool
    #: model providers whose optional library is importable, by provider name
    providers: dict[str, bool] = field(default_factory=dict[str, bool])
    store: BackendCapability = field(
        default_factory=lambda: BackendCapability("sqlite", True, None)
    )
    bus: BackendCapability = field(default_factory=lambda: BackendCapability("local", False, None))
    #: the installed wasmtime package's version (``50.0.1``), ``None`` without it
    wasmtime_version: str | None = None
    #: how the store searches Memory vectors (pgvector, or an exact cosine in
    #: process); ``None`` when it is not known without connecting to PostgreSQL
    memory_vectors: str | None = None
