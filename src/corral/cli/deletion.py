"""``corral delete``'s work: several resources, named or declared in files, each reported.

Resources are deleted one at a time through the backend (embedded or remote alike).
One that another resource still references is refused by the store; when the
referrer is among those being deleted (an agent and its tool, in any order), the
refused ones are tried again after the others, until a round makes no progress. Those
still refused then are tried together, one request per namespace (all or none), then,
if that is refused, every group of one fewer: what only references among themselves
hold back (two agents that link each other) goes then, and whatever a resource not
being deleted references stays, with its reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from corral.core.errors import ConflictError, UserError

if TYPE_CHECKING:
    from corral.cli.backend import Backend


@dataclass(frozen=True)
class Target:
    """A resource to delete."""

    namespace: str
    kind: str
    name: str


async def delete_all(
    namespace: str,
    files: Sequence[Path],
    stdin: str | None,
    kind: str | None,
    names: Sequence[str],
) -> list[tuple[Target, str | None]]:
    """Delete the resources ``files`` declare, or those of ``kind`` named ``names``;
    each target with ``None`` (deleted) or why it was not, in the order asked."""
    from corral.cli.connect import open_backend

    async with open_backend() as backend:
        namespace = await backend.default_namespace(namespace)
        if files:
            loaded = await backend.load(files, namespace, stdin=stdin)
            targets = [Target(*item.resource.key) for item in loaded]
        else:
            assert kind is not None
            targets = [Target(namespace, kind, name) for name in names]
        outcome: dict[Target, str | None] = {}
        pending = list(dict.fromkeys(targets))  # a name given twice is deleted once
        while pending:
            refused: list[Target] = []
            for target in pending:
                try:
                    await backend.delete_resource(target.namespace, target.kind, target.name)
                    outcome[target] = None
                except ConflictError as exc:  # maybe referenced by one still to go
                    outcome[target] = exc.message
                    refused.append(target)
                except UserError as exc:
                    outcome[target] = exc.message
            if len(refused) == len(pending):
                # tried again alone afterwards: what else went may free them, and their
                # refusals then name the referrers left
                if not await _together(backend, refused, outcome):
                    break
                refused = [t for t in refused if outcome[t] is not None]
            pending = refused
    return [(target, outcome[target]) for target in dict.fromkeys(targets)]


async def _together(
    backend: Backend, refused: list[Target], outcome: dict[Target, str | None]
) -> bool:
    """Delete the resources each refused alone together, per namespace (all or none); when
    the group is refused (one of them is referenced from outside it), each group of one
    fewer is tried. Whether any went."""
    by_namespace: dict[str, list[Target]] = {}
    for target in refused:
        by_namespace.setdefault(target.namespace, []).append(target)
    went = False
    for namespace, group in by_namespace.items():
        tries = [group] + [group[:i] + group[i + 1 :] for i in range(len(group))]
        for members in tries:
            if len(members) < 2 or (members is not group and len(group) == 2):
                continue
            try:
                await backend.delete_resources(namespace, [(t.kind, t.name) for t in members])
            except UserError:  # a referrer outside the group (or one gone meanwhile)
                continue
            for target in members:
                outcome[target] = None
            went = True
            break
    return went
