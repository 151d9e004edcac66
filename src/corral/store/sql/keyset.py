"""Keyset pages: the rows of a listing that come after a position in its order.

A listing ordered by a unique key (``(created_at, id)``, ``(kind, name)``) pages
by the last key of the previous page rather than by an offset: no row is seen
twice or skipped when rows are added meanwhile, and each page is one index range.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa


def after(
    columns: Sequence[sa.ColumnElement[Any]],
    position: Sequence[Any],
    *,
    descending: bool = False,
) -> sa.ColumnElement[bool]:
    """Rows that sort after ``position`` when ordered by ``columns`` (all ascending, or all
    descending). Written as ``a > x OR (a = x AND b > y) ...`` rather than a row-value
    comparison, which not every dialect plans as an index range."""
    clauses = []
    for i, (column, value) in enumerate(zip(columns, position, strict=True)):
        beyond = column < value if descending else column > value
        ties = [c == v for c, v in zip(columns[:i], position[:i], strict=True)]
        clauses.append(sa.and_(*ties, beyond))
    return sa.or_(*clauses)


def page(
    query: sa.Select[Any],
    columns: Sequence[sa.ColumnElement[Any]],
    *,
    limit: int | None,
    position: Sequence[Any] | None,
    descending: bool = False,
) -> sa.Select[Any]:
    """``query`` ordered by ``columns``, from after ``position`` (when given), at most
    ``limit`` rows (when given)."""
    if position is not None:
        query = query.where(after(columns, position, descending=descending))
    order = [c.desc() for c in columns] if descending else list(columns)
    return query.order_by(*order).limit(limit)
