"""Operations: liveness and readiness answers (``/healthz``, ``/readyz``), capabilities."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from corral.api.common import FromRecord


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready", "not_ready"]
    detail: str = ""


class SandboxOut(FromRecord):
    """Whether exec tools can run in a bubblewrap sandbox on the server's machine."""

    bubblewrap: bool
    path: str | None = Field(description="Where bwrap is (a system path).")
    version: str | None
    user_namespaces: bool
    auto_mode: Literal["sandbox", "none"] = Field(description="What `isolation: auto` means here.")
    max_processes: Literal["rlimit", "cgroup", "unenforced"] = Field(
        description="How the max_processes limit binds."
    )
    reason: str = Field(description="Why there is no sandbox, when there is none.")
    proc_sys_read_only: bool | None = Field(
        default=None,
        description=(
            "Whether a tool's sandbox sees /proc/sys (the kernel's knobs) read-only "
            "(null: no sandbox here)."
        ),
    )
    memory: Literal["cgroup", "rlimit"] = Field(
        default="rlimit",
        description=(
            "How memory_mb (and the sandbox's default) binds: a memory cgroup of all a "
            "call's processes, or rlimits of each process."
        ),
    )


class BackendOut(FromRecord):
    kind: str
    configured: bool
    reachable: bool | None


class CapabilitiesOut(FromRecord):
    """What the server's machine offers (``corral doctor`` says the same of its own)."""

    sandbox: SandboxOut
    wasmtime: bool
    providers: dict[str, bool] = Field(description="Provider name: its library is importable.")
    store: BackendOut
    bus: BackendOut
    wasmtime_version: str | None = Field(
        default=None, description="The installed wasmtime package's version, when there is one."
    )
    memory_vectors: str | None = Field(
        default=None,
        description=(
            "How the store searches Memory vectors: pgvector, or an exact cosine in process "
            "(null: PostgreSQL not asked)."
        ),
    )
