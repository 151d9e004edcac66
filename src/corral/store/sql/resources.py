"""Resources in the SQL store: apply a batch, read, list, fingerprint and delete them.

Applying checks every reference and every Agent's execution policy against the
batch and the stored resources in the same write transaction, and seals Secret values with the store's cipher
before they are stored.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.errors import ConflictError, NotFoundError, ResourceError
from corral.core.selectors import Selector
from corral.resources.execution_check import check_execution_policies
from corral.resources.kinds import SPEC_TYPES, Resource, SecretSpec, Spec
from corral.resources.loader import LoadedResource, format_path
from corral.resources.references import check_references, locate, referrers, resource_of
from corral.resources.secrets import seal
from corral.resources.systems import check_systems
from corral.store.base import ApplyAction, ApplyOutcome, StoredResource
from corral.store.schema import resources
from corral.store.sql import keyset
from corral.store.sql.engine import SqlEngine, fetch_all, fetch_first
from corral.store.sql.labels import selector_clause
from corral.store.sql.memory import changes_of_memory, entries_of_memory, memory_changed
from corral.store.sql.rows import row_to_stored, spec_json
from corral.store.sql.statements import resource, resources_fingerprint


class SqlResources(SqlEngine):
    """The resource operations of :class:`~corral.store.sql.SqlStore`."""

    async def apply(
        self, batch: Sequence[Resource | LoadedResource], *, dry_run: bool = False
    ) -> list[ApplyOutcome]:
        items = list(batch)
        _check_kinds(items)
        now = time.time()

        async def write(conn: AsyncConnection) -> list[ApplyOutcome]:
            async def exists(namespace: str, kind: str, name: str) -> bool:
                return await _fetch_resource(conn, namespace, kind, name) is not None

            async def stored_spec(namespace: str, kind: str, name: str) -> Spec | None:
                row = await _fetch_resource(conn, namespace, kind, name)
                return row_to_stored(row).resource.spec if row is not None else None

            await check_references(items, exists)
            await check_systems(items, stored_spec, locate, resource_of)
            await check_execution_policies(items, stored_spec)
            return [await self._apply_one(conn, item, now, dry_run) for item in items]

        if dry_run:  # the same checks and comparisons, in a read: nothing is written
            return await self._read("plan an apply", write)
        return await self._write("apply resources", write)

    async def _apply_one(
        self, conn: AsyncConnection, item: Resource | LoadedResource, now: float, dry_run: bool
    ) -> ApplyOutcome:
        resource = resource_of(item)
        namespace, kind, name = resource.key
        row = await _fetch_resource(conn, namespace, kind, name)
        old = row_to_stored(row) if row is not None else None
        spec = resource.spec
        if isinstance(spec, SecretSpec):
            previous = old.resource.spec if old is not None else None
            try:
                spec = seal(
                    spec, previous if isinstance(previous, SecretSpec) else None, self._cipher
                )
            except ResourceError as exc:
                where = locate(item, ("spec", "encrypted_value"))
                raise ResourceError([(where, reason) for _, reason in exc.problems]) from None
        values = {"spec": spec_json(spec), "labels": dict(resource.metadata.labels)}
        if old is None and dry_run:
            return ApplyOutcome(namespace, kind, name, ApplyAction.CREATED, 1)
        if old is None:
            await conn.execute(
                resources.insert().values(
                    namespace=namespace,
                    kind=kind,
                    name=name,
                    generation=1,
                    created_at=now,
                    updated_at=now,
                    **values,
                )
            )
            return ApplyOutcome(namespace, kind, name, ApplyAction.CREATED, 1)
        current = {"spec": spec_json(old.resource.spec), "labels": old.resource.metadata.labels}
        if current == values:
            return ApplyOutcome(namespace, kind, name, ApplyAction.UNCHANGED, old.generation)
        generation = old.generation + 1
        if dry_run:
            return ApplyOutcome(namespace, kind, name, ApplyAction.CONFIGURED, generation)
        await conn.execute(
            resources.update()
            .where(_resource_key(namespace, kind, name))
            .values(generation=generation, updated_at=now, **values)
        )
        return ApplyOutcome(namespace, kind, name, ApplyAction.CONFIGURED, generation)

    async def get_resource(self, namespace: str, kind: str, name: str) -> StoredResource | None:
        row = await self._read("read a resource", fetch_first(resource(namespace, kind, name)))
        return row_to_stored(row) if row is not None else None

    async def list_resources(
        self,
        namespace: str | None,
        kind: str | None = None,
        *,
        selector: Selector | None = None,
        limit: int | None = None,
        after: tuple[str, ...] | None = None,
    ) -> list[StoredResource]:
        query = sa.select(resources)
        order: tuple[sa.ColumnElement[Any], ...] = (resources.c.kind, resources.c.name)
        if namespace is not None:
            query = query.where(resources.c.namespace == namespace)
        else:
            order = (resources.c.namespace, *order)
        if kind is not None:
            query = query.where(resources.c.kind == kind)
        if selector is not None:
            query = query.where(selector_clause(self._dialect, resources.c.labels, selector))
        query = keyset.page(query, order, limit=limit, position=after)
        rows = await self._read("list resources", fetch_all(query))
        return [row_to_stored(row) for row in rows]

    async def resources_fingerprint(self, namespace: str) -> tuple[int, int, float]:
        """See :meth:`Store.resources_fingerprint`: one aggregate query."""
        query = resources_fingerprint(namespace)
        row = await self._read("read the resources' fingerprint", fetch_first(query))
        assert row is not None  # an aggregate without GROUP BY has one row
        count, generations, latest = tuple[Any, ...](row)
        return int(count), int(generations), float(latest)

    async def delete_resources(self, namespace: str, keys: Sequence[tuple[str, str]]) -> None:
        doomed = list(dict.fromkeys(keys))

        async def write(conn: AsyncConnection) -> None:
            for kind, name in doomed:
                if await _fetch_resource(conn, namespace, kind, name) is None:
                    raise NotFoundError(f"{kind} {name!r} not found in namespace {namespace!r}")
            rows = (
                await conn.execute(sa.select(resources).where(resources.c.namespace == namespace))
            ).all()
            gone = {(namespace, kind, name) for kind, name in doomed}
            others = [
                stored.resource
                for stored in map(row_to_stored, rows)
                if stored.resource.key not in gone
            ]
            for kind, name in doomed:
                found = referrers((kind, name), others)
                if found:
                    names = ", ".join(
                        f"{r.kind} {r.name!r} ({format_path(field)})" for r, field in found
                    )
                    raise ConflictError(
                        f"cannot delete {kind} {name!r} in namespace {namespace!r}: "
                        f"it is referenced by {names}"
                    )
            for kind, name in doomed:
                await conn.execute(resources.delete().where(_resource_key(namespace, kind, name)))
                if kind == "Memory":  # its entries go with it, in the same transaction
                    await conn.execute(entries_of_memory(namespace, name))
                    await conn.execute(memory_changed(namespace, name))
                    await conn.execute(changes_of_memory(namespace, name))

        what = "delete a resource" if len(doomed) == 1 else f"delete {len(doomed)} resources"
        await self._write(what, write)


def _check_kinds(items: Sequence[Resource | LoadedResource]) -> None:
    problems = []
    for item in items:
        resource = resource_of(item)
        expected = SPEC_TYPES.get(resource.kind)
        if expected is None or not isinstance(resource.spec, expected):
            problems.append(
                (
                    locate(item, ("spec",)),
                    f"{resource.kind} {resource.name!r}: spec does not fit the kind",
                )
            )
    if problems:
        raise ResourceError(problems)


def _resource_key(namespace: str, kind: str, name: str) -> sa.ColumnElement[bool]:
    return sa.and_(
        resources.c.namespace == namespace, resources.c.kind == kind, resources.c.name == name
    )


async def _fetch_resource(
    conn: AsyncConnection, namespace: str, kind: str, name: str
) -> sa.Row[Any] | None:
    query = sa.select(resources).where(_resource_key(namespace, kind, name))
    return (await conn.execute(query)).first()
