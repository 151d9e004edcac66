"""``corral delete``'s work: several resources, named or declared in files, each reported.

Resources are deleted one at a time through the backend (embedded or remote alike).
One that another resource still references is refused by the store; when the
referrer is among those being deleted (an agent and its tool, in any order), the
refused ones are tried again after the others, until a round makes no progress.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.core.errors import ConflictError, UserError


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
                break
            pending = refused
    return [(target, outcome[target]) for target in dict.fromkeys(targets)]
