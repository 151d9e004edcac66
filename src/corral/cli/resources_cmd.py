"""``corral apply``, ``get``, ``describe`` and ``delete``: resources, kubectl style.

Heavy modules (the store, pydantic models, rich) are imported inside the
commands so that ``corral --help`` stays fast. Secret values are never shown:
a backend hands out resources as the API shows them, passed through
:func:`~corral.resources.secrets.redacted`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from corral.cli.common import EXIT_BAD_INPUT, NAMESPACE, fail, namespace_option, run_async

if TYPE_CHECKING:
    from rich.console import Console

    from corral.api import AppliedResource, ResourceOut
    from corral.resources.kinds import Spec

OUTPUTS = ("table", "json", "yaml")


def register(app: typer.Typer) -> None:
    """Add the resource commands to ``app``."""
    app.command(name="apply")(apply)
    app.command(name="get")(get)
    app.command(name="describe")(describe)
    app.command(name="delete")(delete)


# --------------------------------------------------------------------------- shared helpers


@dataclass(frozen=True)
class Applied:
    """What ``apply`` did, one outcome per resource in file order."""

    outcomes: list[AppliedResource]

    @property
    def lines(self) -> list[str]:
        """``agent/assistant created`` per resource."""
        return [f"{o.kind.lower()}/{o.name} {o.action}" for o in self.outcomes]

    @property
    def agents(self) -> list[str]:
        """The names of the agents in the batch."""
        return [o.name for o in self.outcomes if o.kind == "Agent"]


def _kind(text: str) -> str:
    from corral.resources.kinds import kind_of

    try:
        return kind_of(text)
    except ValueError as exc:
        fail(str(exc), EXIT_BAD_INPUT)


def _console() -> Console:
    from rich.console import Console

    # Piped output is not cut to 80 columns: scripts grep it.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 240)


# --------------------------------------------------------------------------- apply


def apply(
    file: list[Path] = typer.Option(
        ..., "-f", "--filename", "--file", help="A YAML file or directory (repeatable)."
    ),
    namespace: str = typer.Option(
        None,
        "-n",
        "--namespace",
        help="Namespace of documents that do not name one (default: the context's, else "
        "'default'; in remote mode the token's).",
        callback=namespace_option,
        show_default=False,
    ),
) -> None:
    """Create or update the resources of YAML files; all or nothing."""
    applied = run_async(_apply(file, namespace))
    if not applied.outcomes:
        fail("no resources found in the given files", EXIT_BAD_INPUT)
    for line in applied.lines:
        typer.echo(line)


async def _apply(files: list[Path], namespace: str) -> Applied:
    from corral.cli.connect import open_backend

    async with open_backend() as backend:
        return Applied(await backend.apply(files, namespace))


# --------------------------------------------------------------------------- get


def get(
    kind: str = typer.Argument(..., help="agent, tool, modelendpoint, secret, ... (plural works)."),
    name: str | None = typer.Argument(None, help="One resource; all of the kind when absent."),
    namespace: str = NAMESPACE,
    output: str = typer.Option("table", "-o", "--output", help="table, json or yaml."),
) -> None:
    """List resources of a kind, or show one."""
    from corral.cli.render import resource_document

    if output not in OUTPUTS:
        fail(f"unknown output format {output!r} (use {', '.join(OUTPUTS)})", EXIT_BAD_INPUT)
    canonical = _kind(kind)
    items = run_async(_get(namespace, canonical, name))
    if output == "json":
        docs = [resource_document(s) for s in items]
        typer.echo(json.dumps(docs[0] if name else docs, indent=2, ensure_ascii=False))
    elif output == "yaml":
        import yaml

        typer.echo(
            yaml.safe_dump_all(
                [resource_document(s) for s in items], sort_keys=False, allow_unicode=True
            ).rstrip()
        )
    elif not items:
        typer.echo(f"No {canonical} resources found in namespace {namespace!r}.", err=True)
    else:
        _print_table(canonical, items)


async def _get(namespace: str, kind: str, name: str | None) -> list[ResourceOut]:
    from corral.cli.connect import open_backend
    from corral.core.errors import NotFoundError

    async with open_backend() as backend:
        if name is None:
            return await backend.list_resources(namespace, kind)
        found = await backend.get_resource(namespace, kind, name)
    if found is None:
        raise NotFoundError(f"{kind} {name!r} not found in namespace {namespace!r}")
    return [found]


def _print_table(kind: str, items: list[ResourceOut]) -> None:
    from rich import box
    from rich.table import Table

    from corral.cli.render import age

    columns = _COLUMNS.get(kind, [])
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for title in ("NAME", "NAMESPACE", *(c[0] for c in columns), "AGE"):
        table.add_column(title, overflow="fold")
    now = time.time()
    for item in items:
        cells = [getter(item.spec) for _, getter in columns]
        meta = item.metadata
        table.add_row(meta.name, meta.namespace, *cells, age(now - item.status.created_at))
    _console().print(table)


def _attr(*path: str) -> Callable[[Spec], str]:
    def getter(spec: Spec) -> str:
        value: Any = spec
        for part in path:
            value = getattr(value, part, None)
        if isinstance(value, list):
            return ", ".join(str(v) for v in value) or "-"
        return "-" if value in (None, "") else str(value)

    return getter


def _target(spec: Spec) -> str:
    command = getattr(spec, "command", None) or []
    return getattr(spec, "url", None) or " ".join(command) or "-"


def _secret_source(spec: Spec) -> str:
    # Only where the value comes from: never the value, never the ciphertext.
    env = getattr(spec, "from_env", None)
    return f"env:{env}" if env else "encrypted"


_COLUMNS: dict[str, list[tuple[str, Callable[[Spec], str]]]] = {
    "Agent": [("MODEL", _attr("model")), ("TOOLS", _attr("tools"))],
    "ModelEndpoint": [("PROVIDER", _attr("provider")), ("MODEL", _attr("model"))],
    "Tool": [("TYPE", _attr("type")), ("RISK", _attr("risk"))],
    "McpServer": [("TRANSPORT", _attr("transport")), ("TARGET", _target)],
    "Secret": [("SOURCE", _secret_source)],
    "AgentRole": [("PERMISSIONS", _attr("permissions"))],
    "ToolPermission": [("EFFECT", _attr("effect")), ("TOOLS", _attr("tools"))],
}


# --------------------------------------------------------------------------- describe


def describe(
    kind: str = typer.Argument(..., help="The kind (agent, tool, ...)."),
    name: str = typer.Argument(..., help="The resource's name."),
    namespace: str = NAMESPACE,
) -> None:
    """Show one resource in full: metadata, generation, times, spec and who uses it."""
    import yaml

    from corral.cli.render import resource_document

    canonical = _kind(kind)
    found, used_by = run_async(_describe(namespace, canonical, name))
    doc = resource_document(found)
    labels = ", ".join(f"{k}={v}" for k, v in sorted(doc["metadata"]["labels"].items()))
    lines = [
        f"Name:        {found.metadata.name}",
        f"Namespace:   {found.metadata.namespace}",
        f"Kind:        {found.kind}",
        f"Labels:      {labels or '<none>'}",
        f"Generation:  {found.status.generation}",
        f"Created:     {_when(found.status.created_at)}",
        f"Updated:     {_when(found.status.updated_at)}",
        f"Used by:     {', '.join(used_by) or '<none>'}",
        "Spec:",
    ]
    spec_text = yaml.safe_dump(doc["spec"], sort_keys=False, allow_unicode=True)
    lines.extend("  " + line for line in spec_text.rstrip().splitlines())
    typer.echo("\n".join(lines))


async def _describe(namespace: str, kind: str, name: str) -> tuple[ResourceOut, list[str]]:
    from corral.cli.connect import open_backend
    from corral.core.errors import NotFoundError
    from corral.resources.loader import format_path
    from corral.resources.references import referrers

    async with open_backend() as backend:
        found = await backend.get_resource(namespace, kind, name)
        if found is None:
            raise NotFoundError(f"{kind} {name!r} not found in namespace {namespace!r}")
        others = await backend.list_resources(namespace, None)
    used_by = [
        f"{r.kind.lower()}/{r.metadata.name} ({format_path(field)})"
        for r, field in referrers((kind, name), others)
    ]
    return found, used_by


def _when(timestamp: float) -> str:
    from corral.cli.render import age

    moment = datetime.fromtimestamp(timestamp, tz=UTC).isoformat(timespec="seconds")
    return f"{moment.replace('+00:00', 'Z')} ({age(time.time() - timestamp)} ago)"


# --------------------------------------------------------------------------- delete


def delete(
    kind: str = typer.Argument(..., help="The kind (agent, tool, ...)."),
    name: str = typer.Argument(..., help="The resource's name."),
    namespace: str = NAMESPACE,
) -> None:
    """Delete a resource; refused while another resource references it."""
    canonical = _kind(kind)
    run_async(_delete(namespace, canonical, name))
    typer.echo(f"{canonical.lower()}/{name} deleted")


async def _delete(namespace: str, kind: str, name: str) -> None:
    from corral.cli.connect import open_backend

    async with open_backend() as backend:
        await backend.delete_resource(namespace, kind, name)
