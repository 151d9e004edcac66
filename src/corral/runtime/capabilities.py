"""Gathering :class:`~corral.core.capabilities.Capabilities`: one place for both front
doors (``corral doctor`` and ``GET /v1/capabilities``), and the start-up line that says
how tools are isolated.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
from typing import Literal
from urllib.parse import urlsplit

import anyio

from corral.core.capabilities import BackendCapability, Capabilities, SandboxCapability
from corral.core.settings import Settings
from corral.store.base import Store, StoreError
from corral.tools.sandbox.host import SandboxHost

log = logging.getLogger(__name__)

__all__ = ["announce_isolation", "gather_capabilities", "sandbox_capability"]

#: provider -> the optional module it needs (the others ship with Corral's dependencies)
_PROVIDER_MODULES = {"llama-cpp": "llama_cpp", "openai": "openai", "anthropic": "anthropic"}
_CONNECT_SECONDS = 2.0
_announced = False


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def sandbox_capability(host: SandboxHost) -> SandboxCapability:
    """What the sandbox can do on ``host`` (probes bubblewrap: blocking the first time)."""
    probe = host.probe()
    nproc: Literal["rlimit", "cgroup", "unenforced"] = "rlimit"
    if os.geteuid() == 0:  # RLIMIT_NPROC does not bind root
        nproc = "cgroup" if host.cgroup_root() is not None else "unenforced"
    return SandboxCapability(
        bubblewrap=probe.works,
        path=probe.path,
        version=probe.version,
        user_namespaces=probe.user_namespaces,
        auto_mode="sandbox" if probe.works else "none",
        max_processes=nproc,
        reason=probe.reason,
        proc_sys_read_only=probe.proc_sys_read_only,
        memory="cgroup" if host.memory_cgroup_root() is not None else "rlimit",
    )


async def announce_isolation(host: SandboxHost) -> None:
    """Log once per process how ``exec`` tools are isolated here (probing in a thread)."""
    global _announced
    if _announced:
        return
    _announced = True
    probe = await anyio.to_thread.run_sync(host.probe)
    if probe.works:
        log.info("tool isolation: %s (isolation: auto)", probe.describe())
    else:
        log.warning(
            "tool isolation: %s; exec tools with isolation auto run unsandboxed, "
            "with isolation sandbox they fail (isolation_unavailable)",
            probe.describe(),
        )


def _version(package: str) -> str | None:
    """The installed version of ``package`` (read from its metadata, not imported)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


async def _tcp_reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    if parts.hostname is None:
        return False
    try:
        with anyio.fail_after(_CONNECT_SECONDS):
            stream = await anyio.connect_tcp(parts.hostname, parts.port or default_port)
    except (OSError, TimeoutError, ValueError):
        return False
    await stream.aclose()
    return True


def _creatable(path: str) -> bool:
    """Whether the file ``path`` exists readable, or could be created (its directories too)."""
    if os.path.exists(path):
        return os.access(path, os.R_OK | os.W_OK)
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    return os.access(folder, os.W_OK)


async def _store_capability(settings: Settings, store: Store | None) -> BackendCapability:
    kind = "postgresql" if settings.db_url.startswith("postgresql") else "sqlite"
    if store is not None:
        try:
            await store.get_run("run_capabilities_probe")
        except StoreError:
            return BackendCapability(kind, True, False)
        return BackendCapability(kind, True, True)
    if kind == "sqlite":  # a file: "reachable" when it is there or can be made
        path = settings.db_url.partition(":///")[2]
        return BackendCapability(kind, True, await anyio.to_thread.run_sync(_creatable, path))
    return BackendCapability(kind, True, await _tcp_reachable(settings.db_url, 5432))


async def _memory_vectors(settings: Settings, store: Store | None) -> str | None:
    if store is not None:
        try:
            return await store.memory_vector_index()
        except StoreError:
            return None
    if settings.db_url.startswith("postgresql"):
        return None  # the migration decided it in the database: pgvector or not
    from corral.store.sql.vectors import sqlite_vector_index

    return sqlite_vector_index()


async def gather_capabilities(
    settings: Settings, *, store: Store | None = None, host: SandboxHost | None = None
) -> Capabilities:
    """What this machine offers; ``store`` (an open one) is asked, else its address tried."""
    host = host if host is not None else SandboxHost.from_env(corral_home=settings.home)
    sandbox = await anyio.to_thread.run_sync(sandbox_capability, host)
    nats = settings.nats_url
    bus = BackendCapability("local", False, None)
    if nats:
        bus = BackendCapability("nats", True, await _tcp_reachable(nats.split(",")[0], 4222))
    return Capabilities(
        sandbox=sandbox,
        wasmtime=_importable("wasmtime"),
        providers={name: _importable(module) for name, module in _PROVIDER_MODULES.items()},
        store=await _store_capability(settings, store),
        bus=bus,
        wasmtime_version=_version("wasmtime"),
        memory_vectors=await _memory_vectors(settings, store),
    )
