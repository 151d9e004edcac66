"""``corral doctor``: what this machine offers Corral (the data of ``GET /v1/capabilities``).

It looks at the machine it runs on: the tool sandbox, wasmtime, the model providers'
libraries, and the store and bus the environment configures (``CORRAL_DB_URL``,
``CORRAL_NATS_URL``), without opening the store. A server's own answer is
``GET /v1/capabilities``.
"""

from __future__ import annotations

import typer

from corral.cli.common import run_async
from corral.cli.output import output_option


def register(app: typer.Typer) -> None:
    app.command(name="doctor")(doctor)


def _yes(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def _proc_sys(read_only: bool | None) -> str:
    if read_only is None:
        return "unknown (no sandbox)"
    if read_only:
        return "read-only (and /proc/kcore, /proc/sysrq-trigger... masked or read-only)"
    return "WRITABLE: a tool could set the host kernel's knobs; do not run untrusted tools here"


def _allowed_paths_lines() -> list[tuple[str, str]]:
    """The operator's allowed paths, and whether this directory needs to be one of them.

    A tool's program in a directory other users may not enter (a home directory of
    mode 0700) is shown to its sandbox only under ``CORRAL_SANDBOX_ALLOWED_PATHS``.
    """
    import os
    from pathlib import Path

    from corral.resources.isolation import ALLOWED_PATHS_VARIABLE, allowed_paths_from_env
    from corral.tools.sandbox.policy import private_parent

    allowed = allowed_paths_from_env()
    lines = [("sandbox allowed paths", ":".join(map(str, allowed)) or "none")]
    if os.geteuid() == 0:
        lines.append(
            (
                "running as",
                "root: what tools leave on the host is root's; run Corral as a user of its "
                "own (docs/deploy.md)",
            )
        )
    here = Path(os.getcwd()).resolve()
    closed = private_parent(here / "program")
    if closed is not None and not any(here == a or a in here.parents for a in allowed):
        lines.append(
            (
                "this directory",
                f"private ({closed} is closed to other users): tools whose programs lie here "
                f"run sandboxed only with {ALLOWED_PATHS_VARIABLE}={here}",
            )
        )
    return lines


def doctor(output: str = output_option(formats=("table", "json", "yaml"))) -> None:
    """Say what this machine offers: tool sandbox, wasmtime, providers, store and bus."""
    from corral.api import CapabilitiesOut
    from corral.cli.output import document, dumps_json, dumps_yaml
    from corral.core.settings import Settings
    from corral.runtime.capabilities import gather_capabilities

    found = CapabilitiesOut.model_validate(run_async(gather_capabilities(Settings.from_env())))
    if output != "table":
        dump = dumps_json if output == "json" else dumps_yaml
        typer.echo(dump(document(found)))
        return
    box = found.sandbox
    if box.bubblewrap:
        sandbox = f"bubblewrap {box.version or '?'} at {box.path}, user namespaces work"
    else:
        sandbox = f"unavailable ({box.reason})"
    lines = [
        ("sandbox", sandbox),
        (
            "isolation auto",
            f"{box.auto_mode} (max_processes: {box.max_processes}, memory_mb: {box.memory})",
        ),
        ("sandbox /proc/sys", _proc_sys(box.proc_sys_read_only)),
        (
            "wasmtime",
            _yes(found.wasmtime)
            + (f" ({found.wasmtime_version})" if found.wasmtime_version else ""),
        ),
        *((f"provider {name}", _yes(ok)) for name, ok in found.providers.items()),
        ("store", f"{found.store.kind}, reachable: {_yes(found.store.reachable)}"),
        (
            "memory vectors",
            found.memory_vectors
            or "decided by the database: pgvector where CREATE EXTENSION vector works, "
            "else an exact cosine in SQL (the server's /v1/capabilities says which)",
        ),
        (
            "bus",
            f"{found.bus.kind}, configured: {_yes(found.bus.configured)}, "
            f"reachable: {_yes(found.bus.reachable)}",
        ),
    ]
    lines += _allowed_paths_lines()
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        typer.echo(f"{key.ljust(width)}  {value}")
