"""``corral delete``'s work: several resources, named or declared in files, each reported.

Resources are deleted one at a time through the backend (embedded or remote alike).
One that another resource still references is refused by the store; when the
referrer is among those being deleted (an agent and its tool, in any order), the
refused ones are tried again after the others, until a round makes no progress. Those
still refused then are tried together, one request per namespace (all or none), then,
if that is refused, every group of one fewer: what only references among themselves
hold back (two agents that link each other) goes then, and whatever a resource not
being deleted references stays, with its reason.

A server deletes at most ``MAX_DELETED_TOGETHER`` (100) resources in one request: a
larger group is tried in slices of 100 (what references only its own slice goes, and
the rest is tried again), and when no slice could go, each of its resources says so and
what to do (break some of the references among them first). Nothing is deleted in part
behind the caller's back: each request goes whole or not, and each resource is reported.
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
    fewer is tried. A group larger than the backend deletes at once is tried in slices of
    that size instead (what references only its own slice goes). Whether any went."""
    by_namespace: dict[str, list[Target]] = {}
    for target in refused:
        by_namespace.setdefault(target.namespace, []).append(target)
    cap = backend.max_deleted_together
    went = False
    for namespace, group in by_namespace.items():
        if cap is not None and len(group) > cap:
            slices = [group[i : i + cap] for i in range(0, len(group), cap)]
            gone = [await _delete_group(backend, namespace, s, outcome) for s in slices]
            if any(gone):
                went = True  # the next round tries the rest again, alone then together
            else:
                _too_many_together(group, cap, outcome)
            continue
        tries = [group] + [group[:i] + group[i + 1 :] for i in range(len(group))]
        for members in tries:
            if len(members) < 2 or (members is not group and len(group) == 2):
                continue
            if await _delete_group(backend, namespace, members, outcome):
                went = True
                break
    return went


async def _delete_group(
    backend: Backend, namespace: str, members: list[Target], outcome: dict[Target, str | None]
) -> bool:
    """Delete ``members`` together, all or none; whether they went."""
    try:
        await backend.delete_resources(namespace, [(t.kind, t.name) for t in members])
    except UserError:  # a referrer outside the group (or one gone meanwhile)
        return False
    for target in members:
        outcome[target] = None
    return True


def _too_many_together(group: list[Target], cap: int, outcome: dict[Target, str | None]) -> None:
    """Each of ``group``'s reasons, with why they were not deleted together and what to do."""
    hint = (
        f" (it is one of {len(group)} resources refused alone, more than the {cap} the "
        "server deletes together in one request, and they reference each other across "
        f"every slice of {cap}: remove some of the references among them - apply those "
        "agents without the links - then delete again)"
    )
    for target in group:
        outcome[target] = f"{outcome[target]}{hint}"
