"""``corral apply``, ``get``, ``describe`` and ``delete``: resources, kubectl style.

Heavy modules (the store, pydantic models, rich) are imported inside the
commands so that ``corral --help`` stays fast. Secret values are never shown:
a backend hands out resources as the API shows them, passed through
:func:`~corral.resources.secrets.redacted`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from corral.cli.common import EXIT_BAD_INPUT, NAMESPACE, fail, namespace_option, run_async
from corral.cli.output import CHANGE_FORMATS, output_option

if TYPE_CHECKING:
    from corral.api import AppliedResource, ResourceOut, Task
    from corral.cli.output import Column


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
    output: str | None = output_option(None, CHANGE_FORMATS),
) -> None:
    """Create or update the resources of YAML files; all or nothing."""
    from corral.cli.output import print_change
    from corral.cli.views import APPLIED

    applied = run_async(_apply(file, namespace))
    if not applied.outcomes:
        fail("no resources found in the given files", EXIT_BAD_INPUT)
    if output is not None:
        print_change(APPLIED, applied.outcomes, output, many=True)
        return
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
    output: str = output_option(),
) -> None:
    """List resources of a kind, or show one.

    ``-o yaml`` prints documents ``apply -f`` takes back (one per resource, ``---``
    between them); ``-o wide`` adds the generation and labels, and for agents their
    runs: LAST RUN, RUNS and FAILURES among the newest runs.
    """
    from corral.cli.output import no_resources, print_list, print_one
    from corral.cli.render import resource_document
    from corral.cli.views import resource_view

    canonical = _kind(kind)
    wide_agents = output == "wide" and canonical == "Agent"
    items, runs = run_async(_get(namespace, canonical, name, runs=wide_agents))
    view = resource_view(canonical, agent_run_columns(runs) if wide_agents else None)
    if output == "yaml" and name is None:
        import yaml

        if not items:
            no_resources(namespace)
            return
        typer.echo(
            yaml.safe_dump_all(
                [resource_document(s) for s in items], sort_keys=False, allow_unicode=True
            ).rstrip()
        )
    elif name is None:
        print_list(view, items, output, namespace=namespace)
    else:
        print_one(view, items[0], output)


async def _get(
    namespace: str, kind: str, name: str | None, *, runs: bool = False
) -> tuple[list[ResourceOut], dict[str, list[Task]]]:
    from corral.cli.connect import open_backend
    from corral.core.errors import NotFoundError

    async with open_backend() as backend:
        if name is None:
            found = await backend.list_resources(namespace, kind)
        else:
            one = await backend.get_resource(namespace, kind, name)
            if one is None:
                raise NotFoundError(f"{kind} {name!r} not found in namespace {namespace!r}")
            found = [one]
        recent: dict[str, list[Task]] = {}
        if runs:
            for item in found:
                recent[item.metadata.name] = await backend.list_runs(
                    namespace, item.metadata.name, RUN_STATS_PAGE, None
                )
    return found, recent


#: how many of an agent's newest runs ``get agents -o wide`` counts
RUN_STATS_PAGE = 100


def agent_run_columns(runs: dict[str, list[Task]]) -> list[Column[ResourceOut]]:
    """LAST RUN, RUNS and FAILURES of each agent, from its newest runs (at most
    :data:`RUN_STATS_PAGE`: more are counted as ``100+``)."""
    from corral.cli.output import Column, ago
    from corral.core.runs import RunState

    failed = {RunState.FAILED, RunState.DEAD_LETTER}

    def of(resource: ResourceOut) -> list[Task]:
        return runs.get(resource.metadata.name, [])

    def last(resource: ResourceOut) -> str:
        newest = of(resource)[:1]
        return f"{ago(newest[0].created_at)} ({newest[0].state.value})" if newest else "<none>"

    def count(resource: ResourceOut, chosen: list[Task]) -> str:
        full = len(of(resource)) >= RUN_STATS_PAGE
        return f"{len(chosen)}+" if full and chosen else str(len(chosen))

    return [
        Column("LAST RUN", last, wide=True),
        Column("RUNS", lambda r: count(r, of(r)), wide=True),
        Column("FAILURES", lambda r: count(r, [t for t in of(r) if t.state in failed]), wide=True),
    ]


# --------------------------------------------------------------------------- describe


def describe(
    kind: str = typer.Argument(..., help="The kind (agent, tool, ...)."),
    name: str = typer.Argument(..., help="The resource's name."),
    namespace: str = NAMESPACE,
) -> None:
    """Show one resource in full: metadata, generation, times, spec and who uses it."""
    import yaml

    from corral.cli.output import when
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
        f"Created:     {when(found.status.created_at)}",
        f"Updated:     {when(found.status.updated_at)}",
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
