"""Label selectors (:mod:`corral.core.selectors`) as a ``WHERE`` clause on a JSON column.

The requirements are written once over :func:`label_value`, the text of one label or
``NULL`` when the resource has no such label; only that expression differs by dialect.
Labels are stored as a JSON object of strings, so ``NULL`` always means "absent".
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from corral.core.errors import ConfigurationError
from corral.core.selectors import Op, Selector


def label_value(dialect: str, column: sa.ColumnElement[Any], key: str) -> sa.ColumnElement[Any]:
    """The value of label ``key`` in ``column`` as text, ``NULL`` when absent.

    SQLite reads it through ``json_each`` rather than a JSON path: a path cannot name
    every key (quotes, dots), while ``json_each``'s ``key`` column compares as text.
    """
    if dialect == "sqlite":
        each = sa.func.json_each(column).table_valued("key", "value").alias("label")
        return (
            sa.select(each.c.value)
            .where(each.c.key == sa.bindparam(None, key, type_=sa.String))
            .scalar_subquery()
        )
    if dialect == "postgresql":
        return column.op("->>", return_type=sa.String)(sa.bindparam(None, key, type_=sa.String))
    raise ConfigurationError(f"the SQL store does not support the {dialect!r} dialect")


def selector_clause(
    dialect: str, column: sa.ColumnElement[Any], selector: Selector
) -> sa.ColumnElement[bool]:
    """Rows whose labels in ``column`` meet every requirement of ``selector``."""
    clauses: list[sa.ColumnElement[bool]] = []
    for requirement in selector.requirements:
        value = label_value(dialect, column, requirement.key)
        if requirement.op is Op.EQUALS:
            clauses.append(value == requirement.value)
        elif requirement.op is Op.NOT_EQUALS:
            clauses.append(sa.or_(value.is_(None), value != requirement.value))
        elif requirement.op is Op.EXISTS:
            clauses.append(value.is_not(None))
        else:
            clauses.append(value.is_(None))
    return sa.and_(sa.true(), *clauses)
