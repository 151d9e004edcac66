"""``corral apply``, ``get``, ``describe`` and ``delete``: resources, kubectl style.

Heavy modules (the store, pydantic models, rich) are imported inside the
commands so that ``corral --help`` stays fast. Secret values are never shown:
a backend hands out resources as the API shows them, passed through
:func:`~corral.resources.secrets.redacted`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from corral.cli.common import (
    EXIT_BAD_INPUT,
    NAMESPACE,
    escape,
    fail,
    namespace_option,
    print_error,
    run_async,
)
from corral.cli.output import CHANGE_FORMATS, output_option

if TYPE_CHECKING:
    from corral.api import AppliedResource, MemoryStatsOut, ResourceOut, Task
    from corral.cli.backend import Backend
    from corral.cli.output import Column, View
    from corral.core.selectors import Selector


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

FILES_HELP = "A YAML file or directory, '-' for standard input (repeatable)."


def read_stdin(files: list[Path]) -> str | None:
    """The text of standard input when ``-f -`` is among ``files`` (read once, no more than
    the document size limit; not UTF-8 is exit 2)."""
    from corral.core.errors import CorralError
    from corral.core.settings import Settings
    from corral.resources.loader import STDIN_SOURCE

    dashes = [f for f in files if str(f) == "-"]
    if not dashes:
        return None
    if len(dashes) > 1:
        fail("-f - (standard input) can be given once", EXIT_BAD_INPUT)
    limits = Settings.from_env().document_limits
    data = sys.stdin.buffer.read(limits.max_bytes + 1)
    try:
        limits.check_size(len(data), STDIN_SOURCE)
        return data.decode("utf-8")
    except CorralError as exc:
        fail(escape(exc.message), EXIT_BAD_INPUT)
    except UnicodeDecodeError as exc:
        fail(f"{STDIN_SOURCE}: not UTF-8 text (byte {exc.start})", EXIT_BAD_INPUT)


def apply(
    file: list[Path] = typer.Option(..., "-f", "--filename", "--file", help=FILES_HELP),
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
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Check everything and say per resource what would happen; change nothing.",
    ),
) -> None:
    """Create or update the resources of YAML files (or stdin with -f -); all or nothing."""
    from corral.cli.output import print_change
    from corral.cli.views import APPLIED

    stdin = read_stdin(file)
    applied = run_async(_apply(file, namespace, stdin, dry_run))
    if not applied.outcomes:
        fail("no resources found in the given files", EXIT_BAD_INPUT)
    if output is not None:
        print_change(APPLIED, applied.outcomes, output, many=True)
        return
    for line in applied.lines:
        typer.echo(f"{line} (dry run)" if dry_run else line)


async def _apply(files: list[Path], namespace: str, stdin: str | None, dry_run: bool) -> Applied:
    from corral.cli.connect import open_backend

    async with open_backend() as backend:
        return Applied(await backend.apply(files, namespace, stdin=stdin, dry_run=dry_run))


# --------------------------------------------------------------------------- get


def parsed_selector(value: str | None) -> Selector | None:
    """The ``-l`` label selector, parsed (malformed: exit 2)."""
    from corral.core.selectors import InvalidSelectorError, parse_selector

    if value is None:
        return None
    try:
        return parse_selector(value)
    except InvalidSelectorError as exc:
        fail(escape(exc.message), EXIT_BAD_INPUT)


def selector_option(value: str | None) -> str | None:
    """A typer callback: the ``-l`` label selector, checked as it is parsed."""
    parsed_selector(value)
    return value


SELECTOR = typer.Option(
    None,
    "-l",
    "--selector",
    help="Only resources whose labels match: key=value, key!=value, key, !key; "
    "comma-separated, all must hold.",
    callback=selector_option,
    metavar="SELECTOR",
)


#: an agent's newest runs by its namespace and name
Runs = dict[tuple[str, str], list["Task"]]


@dataclass(frozen=True)
class Query:
    """What ``get`` lists: a namespace (``None``: all), a kind, a name, a selector."""

    namespace: str | None
    kind: str
    name: str | None = None
    selector: Selector | None = None


def get(
    kind: str = typer.Argument(..., help="agent, tool, modelendpoint, secret, ... (plural works)."),
    name: str | None = typer.Argument(None, help="One resource; all of the kind when absent."),
    namespace: str = NAMESPACE,
    output: str = output_option(),
    all_namespaces: bool = typer.Option(
        False,
        "-A",
        "--all-namespaces",
        help="Every namespace the caller may see (remote: the token's).",
    ),
    selector: str | None = SELECTOR,
    watch: bool = typer.Option(
        False, "-w", "--watch", help="After the list, print resources again as they change."
    ),
    watch_timeout: float | None = typer.Option(
        None, "--watch-timeout", min=0, help="Stop watching after this many seconds (exit 0)."
    ),
    watch_interval: float = typer.Option(
        1.0, "--watch-interval", min=0.05, hidden=True, help="Seconds between two looks."
    ),
) -> None:
    """List resources of a kind, or show one.

    ``-o yaml`` prints documents ``apply -f`` takes back (one per resource, ``---``
    between them); ``-o wide`` adds the generation and labels, and for agents their
    runs: LAST RUN, RUNS and FAILURES among the newest runs.
    """
    canonical = _kind(kind)
    if name is not None and selector is not None:
        fail("a name and a label selector (-l) cannot go together", EXIT_BAD_INPUT)
    if name is not None and all_namespaces:
        fail("a resource cannot be named across all namespaces (-A)", EXIT_BAD_INPUT)
    query = Query(None if all_namespaces else namespace, canonical, name, parsed_selector(selector))
    if watch:
        run_async(_watch(query, output, watch_timeout, watch_interval))
        return
    wide_agents = output == "wide" and canonical == "Agent"
    items, runs = run_async(_get(query, runs=wide_agents))
    _print_got(query, items, runs, output)


def _get_view(query: Query, runs: Runs | None, output: str) -> View[ResourceOut]:
    from corral.cli.views import resource_view

    wide_agents = output == "wide" and query.kind == "Agent"
    # (a watch shows no run columns: it does not follow the runs)
    extra = agent_run_columns(runs) if wide_agents and runs is not None else None
    return resource_view(query.kind, extra, namespace_first=query.namespace is None)


def _print_got(query: Query, items: list[ResourceOut], runs: Runs, output: str) -> None:
    from corral.cli.output import no_resources, print_list, print_one
    from corral.cli.render import resource_document

    view = _get_view(query, runs, output)
    if output == "yaml" and query.name is None:
        import yaml

        if not items:
            no_resources(query.namespace)
            return
        typer.echo(
            yaml.safe_dump_all(
                [resource_document(s) for s in items], sort_keys=False, allow_unicode=True
            ).rstrip()
        )
    elif query.name is None:
        print_list(view, items, output, namespace=query.namespace)
    else:
        print_one(view, items[0], output)


async def _fetch(backend: Backend, query: Query) -> list[ResourceOut]:
    from corral.core.errors import NotFoundError

    if query.name is None:
        return await backend.list_resources(query.namespace, query.kind, selector=query.selector)
    assert query.namespace is not None
    one = await backend.get_resource(query.namespace, query.kind, query.name)
    if one is None:
        raise NotFoundError(
            f"{query.kind} {query.name!r} not found in namespace {query.namespace!r}"
        )
    return [one]


async def _get(query: Query, *, runs: bool = False) -> tuple[list[ResourceOut], Runs]:
    from corral.cli.connect import open_backend

    async with open_backend() as backend:
        found = await _fetch(backend, query)
        recent: Runs = {}
        if runs:
            for item in found:
                recent[item.metadata.namespace, item.metadata.name] = await backend.list_runs(
                    item.metadata.namespace, item.metadata.name, RUN_STATS_PAGE, None
                )
    return found, recent


async def _watch(query: Query, output: str, seconds: float | None, interval: float) -> None:
    """``get -w``: the list (as without ``-w``), then each change as it is seen."""
    import anyio

    from corral.cli.connect import open_backend
    from corral.cli.output import no_resources
    from corral.cli.watch import Watch, interrupt_sets, printer, watch
    from corral.core.errors import NotFoundError

    show = printer(_get_view(query, None, output), output)

    async def fetch() -> list[ResourceOut]:
        try:
            return await _fetch(backend, query)
        except NotFoundError:  # the one watched was deleted: shown once as gone
            return []

    stop = anyio.Event()
    # Ctrl-C handled from before the list is printed: one right after it is never lost
    with interrupt_sets(stop):
        async with open_backend() as backend:
            first = await _fetch(backend, query)
            if first:
                show(first)
            else:
                no_resources(query.namespace)
            spec = Watch(fetch, _identity, _version, show, interval)
            await watch(spec, first, seconds=seconds, stop=stop)


def _identity(resource: ResourceOut) -> tuple[str, str, str]:
    return (resource.metadata.namespace, resource.kind, resource.metadata.name)


def _version(resource: ResourceOut) -> tuple[int, float]:
    return (resource.status.generation, resource.status.updated_at)


#: how many of an agent's newest runs ``get agents -o wide`` counts
RUN_STATS_PAGE = 100


def agent_run_columns(runs: Runs) -> list[Column[ResourceOut]]:
    """LAST RUN, RUNS and FAILURES of each agent, from its newest runs (at most
    :data:`RUN_STATS_PAGE`: more are counted as ``100+``)."""
    from corral.cli.output import Column, ago
    from corral.core.runs import RunState

    failed = {RunState.FAILED, RunState.DEAD_LETTER}

    def of(resource: ResourceOut) -> list[Task]:
        return runs.get((resource.metadata.namespace, resource.metadata.name), [])

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
    name: str | None = typer.Argument(
        None, help="The resource's name; all of the kind when absent."
    ),
    namespace: str = NAMESPACE,
    selector: str | None = SELECTOR,
) -> None:
    """Show resources in full: metadata, generation, times, spec and who uses them.

    Without a name, every resource of the kind (matching ``-l``), one after another.
    """
    from corral.cli.output import no_resources

    canonical = _kind(kind)
    if name is not None and selector is not None:
        fail("a name and a label selector (-l) cannot go together", EXIT_BAD_INPUT)
    query = Query(namespace, canonical, name, parsed_selector(selector))
    described = run_async(_describe(query))
    if not described:
        no_resources(namespace)
        return
    typer.echo("\n\n".join(_describe_text(*one) for one in described))


def _describe_text(found: ResourceOut, used_by: list[str], extra: list[str]) -> str:
    import yaml

    from corral.cli.output import when
    from corral.cli.render import resource_document

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
    return "\n".join(lines + extra)


def _graph_lines(found: ResourceOut) -> list[str]:
    """An AgentSystem's graph, one node a line: where its output goes and how it joins."""
    from corral.resources.systems import AgentSystemSpec

    spec = found.spec
    if not isinstance(spec, AgentSystemSpec):
        return []
    lines = ["Graph:"]
    output = spec.output_node()
    for name in spec.nodes():
        node = spec.node(name)
        marks = [
            m
            for m in ("entry" if name == spec.entry else "", "output" if name == output else "")
            if m
        ]
        if node.join is not None:
            marks.append(f"join {node.join}")
        targets = ", ".join(node.next) or "(end)"
        route = " by output" if node.route == "by_output" else ""
        note = f"  [{', '.join(marks)}]" if marks else ""
        lines.append(f"  {name} ->{route} {targets}{note}")
    return lines


def _execution_lines(found: ResourceOut, others: list[ResourceOut]) -> list[str]:
    """An Agent's effective execution policy, each field with where it came from."""
    from corral.resources.execution import (
        NAMESPACE_POLICY_KIND,
        NAMESPACE_POLICY_NAME,
        NamespacePolicySpec,
        effective_policy,
        namespace_defaults,
    )
    from corral.resources.kinds import AgentSpec

    if not isinstance(found.spec, AgentSpec):
        return []
    defaults = next(
        (
            o.spec.execution
            for o in others
            if o.kind == NAMESPACE_POLICY_KIND
            and o.metadata.name == NAMESPACE_POLICY_NAME
            and isinstance(o.spec, NamespacePolicySpec)
        ),
        None,
    )
    restricted = namespace_defaults(found.metadata.namespace)
    policy = effective_policy(found.spec.execution, defaults, restricted)
    sources = dict(policy.sources)
    return [
        "Execution (effective):",
        f"  isolation:          {policy.isolation} ({sources['isolation']})",
        f"  network:            {policy.network} ({sources['network']})",
        f"  allowed_tool_types: {', '.join(policy.allowed_tool_types) or '<none>'} "
        f"({sources['allowed_tool_types']})",
    ]


async def _describe(query: Query) -> list[tuple[ResourceOut, list[str], list[str]]]:
    from corral.cli.connect import open_backend
    from corral.resources.loader import format_path
    from corral.resources.references import referrers

    assert query.namespace is not None
    async with open_backend() as backend:
        found = await _fetch(backend, query)
        others = await backend.list_resources(query.namespace, None) if found else []
        memories = {
            one.metadata.name: await _memory_stats(backend, query.namespace, one.metadata.name)
            for one in found
            if one.kind == "Memory"
        }
    return [
        (
            one,
            [
                f"{r.kind.lower()}/{r.metadata.name} ({format_path(field)})"
                for r, field in referrers((one.kind, one.metadata.name), others)
            ],
            _execution_lines(one, others)
            + (_memory_lines(one, memories[one.metadata.name]) if one.kind == "Memory" else [])
            + _graph_lines(one),
        )
        for one in found
    ]


async def _memory_stats(backend: Backend, namespace: str, name: str) -> MemoryStatsOut | str:
    """A Memory's stats, or why they cannot be had (a remote backend that is down):
    the Memory is described all the same."""
    from corral.core.errors import CorralError

    try:
        return await backend.memory_stats(namespace, name)
    except CorralError as exc:
        return f"unavailable ({exc.code}: {exc.message})"


def _memory_lines(memory: ResourceOut, stats: MemoryStatsOut | str) -> list[str]:
    """A Memory's backend, its entries (every scope), its search index and embedding."""
    spec = memory.spec.model_dump(mode="json")
    backend = str(spec.get("backend", "store"))
    if backend == "http" and isinstance(spec.get("http"), dict):
        backend += f" ({spec['http'].get('url')})"
    embedding = spec.get("embedding")
    model = embedding.get("model") if isinstance(embedding, dict) else None
    lines = [f"Backend:     {backend}"]
    if isinstance(stats, str):
        lines.append(f"Entries:     {stats}")
    else:
        lines += [
            f"Entries:     {stats.entries} in {stats.scopes} scope(s), "
            f"{stats.text_chars} characters",
            f"Index:       {stats.index}",
            *([f"Vectors:     {stats.vectors}"] if stats.vectors else []),
        ]
    lines.append(f"Embedding:   {model or '<none> (full-text search only)'}")
    return lines


# --------------------------------------------------------------------------- delete


def delete(
    kind: str | None = typer.Argument(None, help="The kind (agent, tool, ...)."),
    names: list[str] | None = typer.Argument(
        None, help="The resources' names.", show_default=False
    ),
    file: list[Path] | None = typer.Option(
        None,
        "-f",
        "--filename",
        "--file",
        help="Delete the resources these YAML files or directories declare ('-': stdin).",
        show_default=False,
    ),
    namespace: str = NAMESPACE,
) -> None:
    """Delete resources, named or declared in files; one referenced by another is refused.

    Each is reported as it goes; the exit code is 2 when any could not be deleted
    (not found, still referenced), after trying all of them.
    """
    from corral.cli.deletion import delete_all

    if file and (kind is not None or names):
        fail("give either KIND NAME... or -f FILE, not both", EXIT_BAD_INPUT)
    canonical: str | None = None
    if not file:
        if kind is None:
            fail("say what to delete: KIND NAME... or -f FILE", EXIT_BAD_INPUT)
        canonical = _kind(kind)
        if not names:
            fail(f"name what to delete: corral delete {kind} NAME...", EXIT_BAD_INPUT)
    stdin = read_stdin(file) if file else None
    results = run_async(delete_all(namespace, file or [], stdin, canonical, names or []))
    if not results:
        fail("no resources found in the given files", EXIT_BAD_INPUT)
    failed = 0
    for target, error in results:
        if error is None:
            typer.echo(f"{target.kind.lower()}/{target.name} deleted")
        else:
            failed += 1
            print_error(escape(error))
    if failed:
        raise typer.Exit(EXIT_BAD_INPUT)
