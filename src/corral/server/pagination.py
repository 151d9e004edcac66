"""Opaque cursors for list endpoints.

A cursor is base64url JSON of where the previous page ended: a keyset
(``created_at``, ``id``) for tasks, the last sort key for the lists the store
returns whole (resources, sessions, approvals, tokens, session messages), the
last sequence number for events. Clients treat it as opaque; a cursor that
does not decode is a 422 naming ``query.cursor``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

from fastapi import Query

from corral.api import MAX_PAGE_ITEMS
from corral.server.problems import FieldProblem, ProblemError

T = TypeVar("T")

Limit = Annotated[int, Query(ge=1, le=MAX_PAGE_ITEMS, description="Items per page.")]
Cursor = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=512,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="`next_cursor` of the previous page.",
    ),
]


def encode(position: Sequence[Any]) -> str:
    """A cursor for ``position`` (a JSON-able sequence)."""
    text = json.dumps(list(position), separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode(cursor: str, shape: Sequence[type]) -> list[Any]:
    """The position in ``cursor``, checked against ``shape`` (one type per element)."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        value = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise invalid_cursor() from None
    if not isinstance(value, list) or len(value) != len(shape):
        raise invalid_cursor()
    for item, kind in zip(value, shape, strict=True):
        if kind is float and isinstance(item, int) and not isinstance(item, bool):
            continue
        if not isinstance(item, kind) or isinstance(item, bool):
            raise invalid_cursor()
    return value


def invalid_cursor() -> ProblemError:
    return ProblemError(
        422,
        "the cursor is not one this server issued",
        code="invalid_request",
        errors=[FieldProblem(field="query.cursor", reason="invalid cursor")],
    )


def page_after(
    items: Sequence[T],
    key: Callable[[T], Sequence[Any]],
    cursor: str | None,
    limit: int,
    shape: Sequence[type],
    *,
    descending: bool = False,
) -> tuple[list[T], str | None]:
    """One page of ``items`` (sorted by ``key``) after ``cursor``, and the next cursor.

    For lists the store returns whole: the page starts after the item whose key
    the cursor holds, or where that item would be had it been deleted meanwhile.
    """
    start = 0
    if cursor is not None:
        position = [
            float(v) if kind is float else v
            for v, kind in zip(decode(cursor, shape), shape, strict=True)
        ]
        keys = [list(key(item)) for item in items]
        start = next(
            (i for i, k in enumerate(keys) if (k < position if descending else k > position)),
            len(keys),
        )
    page = list(items[start : start + limit])
    more = start + limit < len(items)
    return page, encode(key(page[-1])) if more and page else None
