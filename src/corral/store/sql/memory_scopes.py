"""A Memory scope in SQL: its entries, its generation, and what changed between two.

Each scope of a Memory (namespace, memory, scope key) has a generation
(``memory_generations``) that every write, delete and prune raises in its transaction,
noting the ids of the entries it changed under the new generation (``memory_changes``;
``0`` for none). The caches kept in process for search - a scope's vectors
(:mod:`corral.store.sql.vector_cache`) and words (:mod:`corral.store.sql.fulltext_index`)
- read the generation before using what they keep, and the changes since to catch up.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.memory import MemoryPlace
from corral.store.schema import memory_changes, memory_entries, memory_generations

__all__ = ["at_place", "changed_entries", "generation_of"]


def at_place(place: MemoryPlace) -> sa.ColumnElement[bool]:
    """The entries of one scope of one Memory."""
    _t = memory_entries
    return sa.and_(
        _t.c.namespace == place.namespace,
        _t.c.memory == place.memory,
        _t.c.scope_key == place.scope_key,
    )


def generation_of(place: MemoryPlace) -> sa.Select[Any]:
    """The scope's generation (no row: 0, never written)."""
    _g = memory_generations
    return sa.select(_g.c.generation).where(
        _g.c.namespace == place.namespace,
        _g.c.memory == place.memory,
        _g.c.scope_key == place.scope_key,
    )


async def changed_entries(
    conn: AsyncConnection, place: MemoryPlace, since: int, generation: int
) -> list[int] | None:
    """The entries the scope's writes, deletes and prunes after ``since`` up to
    ``generation`` changed, in id order; ``None`` when some generation's notes are no
    longer kept."""
    _c = memory_changes
    notes = (
        await conn.execute(
            sa.select(_c.c.generation, _c.c.entry_id).where(
                _c.c.namespace == place.namespace,
                _c.c.memory == place.memory,
                _c.c.scope_key == place.scope_key,
                _c.c.generation > since,
                _c.c.generation <= generation,
            )
        )
    ).all()
    if len({row[0] for row in notes}) != generation - since:
        return None
    return sorted({int(row[1]) for row in notes} - {0})
