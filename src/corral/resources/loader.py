"""Read resource documents from YAML files, reporting every problem with file, line and field.

YAML is composed into a node tree first so that every node keeps its position;
the documents are then validated per kind with pydantic, and each validation
error is mapped back along its ``loc`` to the line of the offending field. All
problems of all documents are collected and raised as one
:class:`~corral.core.errors.ResourceError`, so a user fixes a file in one pass.

The composer is bounded (:class:`_BoundedLoader`): size, depth, nodes with
aliases expanded and alias uses are counted as the node tree is built, and the
first limit passed stops parsing with a
:class:`~corral.core.errors.DocumentTooComplexError`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import yaml
from pydantic import BaseModel, ValidationError

from corral.core.errors import Location, ResourceError
from corral.core.limits import DocumentLimits
from corral.resources.kinds import (
    API_VERSION,
    KINDS,
    NAME_PATTERN,
    SPEC_TYPES,
    McpServerSpec,
    Metadata,
    Resource,
    ToolSpecModel,
)

FieldPath = tuple[str | int, ...]
M = TypeVar("M", bound=BaseModel)
Problem = tuple[Location, str]

YAML_SUFFIXES = (".yaml", ".yml")
_ENVELOPE_KEYS = ("apiVersion", "kind", "metadata", "spec")
# Pydantic adds the member of a union to ``loc`` (``str``, ``EnvValue``,
# ``function-after[...]``); such tags are not fields a user wrote.
_UNION_TAG = re.compile(r"^([A-Z][A-Za-z0-9]*|str|int|float|bool|dict|list|none|.*\[.*\])$")


def format_path(path: FieldPath) -> str:
    """``("spec", "tools", 2)`` -> ``spec.tools[2]``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


@dataclass(frozen=True)
class LoadedResource:
    """A validated resource with where it came from.

    ``file`` is the file as the user named it (``None`` for text without a
    file), ``line`` the 1-based line where its document starts.
    """

    resource: Resource
    file: str | None
    line: int
    node: yaml.MappingNode

    def line_of(self, path: FieldPath) -> int:
        """The line of the deepest node along ``path`` that exists in the document."""
        return _walk(self.node, path)[0]

    def location(self, path: FieldPath) -> Location:
        """A :class:`Location` of ``path`` in this resource's document."""
        return Location(self.file, self.line_of(path), format_path(path) or None)


def load_path(
    path: Path, *, default_namespace: str = "default", limits: DocumentLimits | None = None
) -> list[LoadedResource]:
    """Load one YAML file, or every ``*.yaml``/``*.yml`` below a directory (sorted, recursive)."""
    return load_paths([path], default_namespace=default_namespace, limits=limits)


#: how a text read from standard input is named in messages (``<stdin>:3``)
STDIN_SOURCE = "<stdin>"


def load_paths(
    paths: Sequence[Path],
    *,
    default_namespace: str = "default",
    limits: DocumentLimits | None = None,
    stdin: str | None = None,
) -> list[LoadedResource]:
    """Load several files or directories as one batch; raise one ResourceError for all problems.

    The path ``-`` stands for ``stdin``, the text the caller read from standard input
    (named ``<stdin>`` in messages; its relative program paths are relative to the
    working directory). A file over one of ``limits`` raises ``DocumentTooComplexError``
    at once.
    """
    limits = limits or DocumentLimits()
    loaded: list[LoadedResource] = []
    problems: list[Problem] = []
    for path in paths:
        if str(path) == "-" and stdin is not None:
            limits.check_size(len(stdin.encode("utf-8", "surrogatepass")), STDIN_SOURCE)
            _load_into(stdin, STDIN_SOURCE, Path.cwd(), default_namespace, limits, loaded, problems)
            continue
        for file in _yaml_files(path, problems):
            try:
                limits.check_size(file.stat().st_size, str(file))  # before reading it
                text = file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                problems.append((Location(str(file)), f"cannot read file: {exc}"))
                continue
            _load_into(text, str(file), file.parent, default_namespace, limits, loaded, problems)
    problems.extend(_duplicates(loaded))
    if problems:
        raise ResourceError(problems)
    return loaded


def load_text(
    text: str,
    source: str | None = None,
    *,
    base_dir: Path | None = None,
    default_namespace: str = "default",
    limits: DocumentLimits | None = None,
) -> list[LoadedResource]:
    """Load the YAML documents of ``text``; ``source`` names it in messages.

    Relative program paths (``./tool.py``) are resolved against ``base_dir``
    when given, else against the directory of ``source`` when it is a file.
    Text over one of ``limits`` raises ``DocumentTooComplexError``.
    """
    limits = limits or DocumentLimits()
    limits.check_size(len(text.encode("utf-8", "surrogatepass")), source)
    if base_dir is None and source is not None and Path(source).is_file():
        base_dir = Path(source).parent
    loaded: list[LoadedResource] = []
    problems: list[Problem] = []
    _load_into(text, source, base_dir, default_namespace, limits, loaded, problems)
    problems.extend(_duplicates(loaded))
    if problems:
        raise ResourceError(problems)
    return loaded


# --------------------------------------------------------------------------- files


def _yaml_files(path: Path, problems: list[Problem]) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in YAML_SUFFIXES and p.is_file())
        if not files:
            problems.append((Location(str(path)), "no *.yaml or *.yml files in this directory"))
        return files
    if not path.exists():
        problems.append((Location(str(path)), "no such file or directory"))
        return []
    return [path]


# --------------------------------------------------------------------------- documents


def _load_into(
    text: str,
    source: str | None,
    base_dir: Path | None,
    default_namespace: str,
    limits: DocumentLimits,
    loaded: list[LoadedResource],
    problems: list[Problem],
) -> None:
    try:
        # the reader refuses some characters (NUL, other C0 controls) as it is built
        loader = _BoundedLoader(text, limits, source)
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        reason = f"invalid YAML: the character #x{exc.character:04x} is not allowed"
        problems.append((Location(source, line), reason))
        return
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            data = loader.construct_document(node)
            if data is None:
                continue  # an empty document, as between two '---'
            doc_problems: list[Problem] = []
            resource = _validate(node, data, source, default_namespace, doc_problems)
            problems.extend(doc_problems)
            if resource is not None and isinstance(node, yaml.MappingNode):
                resource = _rewrite_paths(resource, base_dir)
                loaded.append(LoadedResource(resource, source, node.start_mark.line + 1, node))
    except yaml.MarkedYAMLError as exc:
        problems.append(_syntax_problem(exc, source))
    except yaml.YAMLError as exc:
        problems.append((Location(source), f"invalid YAML: {exc}"))
    finally:
        loader.dispose()


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with a composer that counts as it builds the node tree.

    An alias is the node it names (PyYAML shares it, so the tree stays small), but
    everything after composing walks it as a tree: validation, storage, the API's
    answers. So an alias counts as the whole subtree it names, in nodes and in
    depth, and the count stops at the limit long before any expansion happens.
    """

    def __init__(self, text: str, limits: DocumentLimits, source: str | None) -> None:
        super().__init__(text)
        self.limits = limits
        self.source = source
        self.nodes = 0
        self.aliases = 0
        self.depth = 0
        self.reach = 0  # the deepest level reached in the branch being composed
        # (nodes, height) of each anchored node of the current document, by id
        self.anchored: dict[int, tuple[int, int]] = {}

    def compose_document(self) -> yaml.Node | None:
        self.anchored = {}  # anchors do not cross documents
        node: yaml.Node | None = super().compose_document()
        return node

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            node: yaml.Node | None = super().compose_node(parent, index)
            self.aliases += 1
            if self.aliases > self.limits.max_aliases:
                self._refuse("max_aliases", f"more than {self.limits.max_aliases} aliases", event)
            if id(node) not in self.anchored:  # its anchor's node is still being composed
                raise yaml.composer.ComposerError(
                    problem="an alias cannot refer to a node that contains it",
                    problem_mark=cast(yaml.error.Mark, event.start_mark),
                )
            nodes, height = self.anchored[id(node)]
            self._count(nodes, self.depth + 1 + height, event)
            return node
        self.depth += 1
        before, reach_before, self.reach = self.nodes, self.reach, self.depth
        self._count(1, self.depth, event)
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        if getattr(event, "anchor", None) is not None and node is not None:
            self.anchored[id(node)] = (self.nodes - before, self.reach - self.depth - 1)
        self.reach = max(self.reach, reach_before)
        return node

    def _count(self, nodes: int, depth: int, event: yaml.Event) -> None:
        self.nodes += nodes
        self.reach = max(self.reach, depth)
        limits = self.limits
        if depth > limits.max_depth:
            self._refuse("max_depth", f"nested deeper than {limits.max_depth} levels", event)
        if self.nodes > limits.max_nodes:
            self._refuse(
                "max_nodes", f"more than {limits.max_nodes} values (aliases expanded)", event
            )

    def _refuse(self, limit: str, reason: str, event: yaml.Event) -> None:
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        raise self.limits.refuse(limit, reason, Location(self.source, line))


def _syntax_problem(exc: yaml.MarkedYAMLError, source: str | None) -> Problem:
    mark = exc.problem_mark or exc.context_mark
    line = mark.line + 1 if mark is not None else None
    reason = exc.problem or "invalid YAML"
    if exc.context:
        started = exc.context_mark.line + 1 if exc.context_mark is not None else None
        where = f" started on line {started}" if started is not None and started != line else ""
        reason = f"{reason} ({exc.context}{where})"
    return Location(source, line), f"invalid YAML: {reason}"


def _validate(
    node: yaml.Node,
    data: Any,
    source: str | None,
    default_namespace: str,
    problems: list[Problem],
) -> Resource | None:
    doc_line = node.start_mark.line + 1

    def at(path: FieldPath, reason: str) -> None:
        line, _ = _walk(node, path)
        problems.append((Location(source, line, format_path(path) or None), reason))

    if not isinstance(node, yaml.MappingNode) or not isinstance(data, dict):
        problems.append(
            (
                Location(source, doc_line),
                "a resource document must be a mapping (apiVersion, kind, metadata, spec)",
            )
        )
        return None
    problems.extend(
        (Location(source, line, None), f"duplicate key {key!r}")
        for key, line in _duplicate_keys(node)
    )
    for key in data:
        if key not in _ENVELOPE_KEYS:
            at((str(key),), f"unknown field; a document has only {', '.join(_ENVELOPE_KEYS)}")

    api_version = data.get("apiVersion")
    if api_version is None:
        at(("apiVersion",), f"missing apiVersion (expected {API_VERSION!r})")
    elif api_version != API_VERSION:
        at(("apiVersion",), f"unsupported apiVersion {api_version!r} (expected {API_VERSION!r})")

    kind = data.get("kind")
    if kind is None:
        at(("kind",), f"missing kind; kinds are {', '.join(KINDS)}")
    elif not isinstance(kind, str) or kind not in SPEC_TYPES:  # a mapping is unhashable
        hint = next((k for k in KINDS if isinstance(kind, str) and k.lower() == kind.lower()), None)
        suffix = f" (did you mean {hint!r}?)" if hint else ""
        at(("kind",), f"unknown kind {kind!r}{suffix}; kinds are {', '.join(KINDS)}")

    metadata = data.get("metadata")
    meta: Metadata | None = None
    if metadata is None:
        at(("metadata",), "missing metadata (at least metadata.name)")
    else:
        if isinstance(metadata, dict) and "namespace" not in metadata:
            metadata = {**metadata, "namespace": default_namespace}
        meta = _model(Metadata, metadata, ("metadata",), node, source, problems)

    spec_data = data.get("spec")
    spec = None
    if spec_data is None and isinstance(kind, str) and kind in SPEC_TYPES:
        at(("spec",), "missing spec")
    elif isinstance(kind, str) and kind in SPEC_TYPES:
        spec = _model(SPEC_TYPES[kind], spec_data, ("spec",), node, source, problems)

    if spec is not None:
        for path, reason in _unstorable_numbers(spec.model_dump(), ("spec",)):
            at(path, reason)
    if problems or meta is None or spec is None or not isinstance(kind, str):
        return None
    return Resource(apiVersion=API_VERSION, kind=kind, metadata=meta, spec=spec)


#: the largest integer every store keeps exactly (SQLite's and JSON readers' 64-bit integers)
_MAX_STORED_INT = 2**63 - 1


def _unstorable_numbers(value: Any, path: FieldPath) -> Iterable[tuple[FieldPath, str]]:
    """Numbers no JSON store keeps: infinities and NaN (``.inf``, JSON's ``Infinity``, which
    SQLite's JSON functions call malformed, so one stored Agent stopped every worker's claims)
    and integers past 64 bits."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _unstorable_numbers(item, (*path, str(key)))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _unstorable_numbers(item, (*path, index))
    elif isinstance(value, float) and not math.isfinite(value):
        yield path, "Input should be a finite number"
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > _MAX_STORED_INT:
        yield path, f"Input should be between -{_MAX_STORED_INT} and {_MAX_STORED_INT}"


def _model(
    model: type[M],
    data: Any,
    prefix: FieldPath,
    node: yaml.Node,
    source: str | None,
    problems: list[Problem],
) -> M | None:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems.extend(_translate(exc, prefix, node, source))
        return None


def _translate(
    exc: ValidationError, prefix: FieldPath, node: yaml.Node, source: str | None
) -> list[Problem]:
    """Map pydantic errors to (file, line, field); errors of one union member are merged."""
    merged: dict[tuple[int, str], list[str]] = {}
    for error in exc.errors(include_url=False):
        line, path = _walk(node, prefix + tuple(error["loc"]))
        reason = _reason(error["type"], error["msg"])
        reasons = merged.setdefault((line, format_path(path)), [])
        if reason not in reasons:
            reasons.append(reason)
    return [
        (Location(source, line, field or None), "; or ".join(reasons))
        for (line, field), reasons in merged.items()
    ]


def _reason(kind: str, message: str) -> str:
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "string_pattern_mismatch" and NAME_PATTERN in message:
        return "a name is 1-63 lower case letters, digits, '.', '_' or '-', starting and ending with a letter or digit"
    return message.removeprefix("Value error, ")


# --------------------------------------------------------------------------- node tree


def _walk(node: yaml.Node, path: FieldPath) -> tuple[int, FieldPath]:
    """Follow ``path`` through the node tree.

    Returns the line of the deepest node that exists (for a mapping entry,
    the line of its key) and the path as the user would name it: union tags
    dropped, names that do not exist (a missing field) kept.
    """
    line = node.start_mark.line + 1
    current: yaml.Node | None = node
    shown: list[str | int] = []
    for part in path:
        child = _child(current, part) if current is not None else None
        if child is not None:
            line, current = child
            shown.append(part)
        elif isinstance(part, str) and _UNION_TAG.match(part):
            continue
        else:
            current = None
            shown.append(part)
    return line, tuple(shown)


def _child(node: yaml.Node, part: str | int) -> tuple[int, yaml.Node] | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                return key.start_mark.line + 1, value
    elif (
        isinstance(node, yaml.SequenceNode)
        and isinstance(part, int)
        and 0 <= part < len(node.value)
    ):
        item: yaml.Node = node.value[part]
        return item.start_mark.line + 1, item
    return None


def _duplicate_keys(node: yaml.Node) -> Iterable[tuple[str, int]]:
    """Keys given twice in one mapping: YAML loaders silently keep the last one."""
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                if key.value in seen:
                    yield key.value, key.start_mark.line + 1
                seen.add(key.value)
            yield from _duplicate_keys(value)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield from _duplicate_keys(item)


# --------------------------------------------------------------------------- batch checks


def _duplicates(loaded: Sequence[LoadedResource]) -> list[Problem]:
    first: dict[tuple[str, str, str], LoadedResource] = {}
    problems: list[Problem] = []
    for item in loaded:
        key = item.resource.key
        earlier = first.setdefault(key, item)
        if earlier is not item:
            where = f"{earlier.file}:{earlier.line}" if earlier.file else f"line {earlier.line}"
            problems.append(
                (
                    item.location(("metadata", "name")),
                    f"duplicate {key[1]} {key[2]!r} in namespace {key[0]!r} (first at {where})",
                )
            )
    return problems


# --------------------------------------------------------------------------- relative paths


def _absolute(entry: str, base_dir: Path | None) -> str:
    if base_dir is None or not entry.startswith(("./", "../")):
        return entry
    return os.path.normpath(base_dir.absolute() / entry)


def _rewrite_paths(resource: Resource, base_dir: Path | None) -> Resource:
    """Make ``./x`` and ``../x`` program paths absolute, relative to the YAML file."""
    if base_dir is None:
        return resource
    spec = resource.spec
    if isinstance(spec, ToolSpecModel):
        update: dict[str, Any] = {}
        if spec.python is not None and spec.python.path is not None:
            update["python"] = spec.python.model_copy(
                update={"path": _absolute(spec.python.path, base_dir)}
            )
        if spec.exec is not None:
            command = [_absolute(part, base_dir) for part in spec.exec.command]
            update["exec"] = spec.exec.model_copy(update={"command": command})
        spec = spec.model_copy(update=update)
    elif isinstance(spec, McpServerSpec):
        spec = spec.model_copy(update={"command": [_absolute(c, base_dir) for c in spec.command]})
    else:
        return resource
    return resource.model_copy(update={"spec": spec})


def unanchored_paths(loaded: Sequence[LoadedResource]) -> list[Problem]:
    """The relative program and module paths of documents that came without a file.

    Over the HTTP API there is no YAML file for ``./x`` to be relative to, and
    anything relative would resolve against the working directory of whichever
    worker runs the tool, failing only then. Refused: a command entry starting
    with ``./`` or ``../``, a program path that is relative (``bin/x``; a bare
    name is looked up on the PATH) and a relative ``python.path``.
    """
    problems: list[Problem] = []
    for item in loaded:
        for path, value in _program_paths(item.resource):
            reason = (
                f"{value!r} is a relative path and there is no file it could be relative "
                "to: give an absolute path (corral apply -f resolves ./ paths against the file)"
            )
            problems.append((item.location(path), reason))
    return problems


def _program_paths(resource: Resource) -> Iterable[tuple[FieldPath, str]]:
    """The fields of ``resource`` naming a relative program or module path, with their value."""
    spec = resource.spec
    command: FieldPath = ()
    entries: list[str] = []
    if isinstance(spec, ToolSpecModel):
        module_path = spec.python.path if spec.python is not None else None
        if module_path is not None and not os.path.isabs(module_path):
            yield ("spec", "python", "path"), module_path
        if spec.exec is not None:
            command, entries = ("spec", "exec", "command"), spec.exec.command
    elif isinstance(spec, McpServerSpec):
        command, entries = ("spec", "command"), spec.command
    for index, entry in enumerate(entries):
        program = index == 0 and "/" in entry
        if entry.startswith(("./", "../")) or (program and not os.path.isabs(entry)):
            yield (*command, index), entry
