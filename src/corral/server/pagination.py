"""Opaque cursors for list endpoints.

A cursor is base64url JSON of where the previous page ended: the keyset (the
unique sort key) of the last item for the lists the store pages in SQL - tasks
and tokens ``(created_at, id)``, approvals ``(requested_at, id)``, sessions
``(updated_at, id)``, resources ``(kind, name)`` - an offset for session
messages, the last sequence number for events. Clients treat it as opaque; a
cursor that does not decode to such a position is a 422 naming ``query.cursor``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

from fastapi import Query

from corral.api import MAX_PAGE_ITEMS
from corral.server.problems import FieldProblem, ProblemError

T = TypeVar("T")

#: The largest integer in a cursor (sequence numbers are 32-bit columns).
MAX_INT = 2**31 - 1

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


class NotACursorError(ValueError):
    """A cursor that does not decode to a position of the expected shape: not one this
    server issued (:func:`decode` answers it as a 422, the A2A server as invalid params)."""


def decode(cursor: str, shape: Sequence[type]) -> list[Any]:
    """The position in ``cursor``, checked against ``shape`` (one type per element; a
    ``float`` element is returned as a finite float, a ``str`` one as text a database
    takes); a 422 naming ``query.cursor`` when it is not one."""
    try:
        return parse(cursor, shape)
    except NotACursorError:
        raise invalid_cursor() from None


def parse(cursor: str, shape: Sequence[type]) -> list[Any]:
    """:func:`decode` without HTTP: :class:`NotACursorError` for a cursor that is not one."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        value = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (binascii.Error, ValueError, UnicodeError):
        raise NotACursorError(cursor) from None
    if not isinstance(value, list) or len(value) != len(shape):
        raise NotACursorError(cursor)
    return [_checked(item, kind) for item, kind in zip(value, shape, strict=True)]


def _checked(item: Any, kind: type) -> Any:
    """``item`` as a ``kind``, or :class:`NotACursorError`: a forged cursor must not reach
    the store as a value it would fail on (a number out of range, text PostgreSQL
    refuses: NUL, lone surrogates). Integers (sequence numbers, offsets) are never
    negative."""
    if isinstance(item, bool):
        raise NotACursorError(item)
    if kind is float and isinstance(item, int | float):
        try:
            number = float(item)
        except OverflowError:
            raise NotACursorError(item) from None
        if not math.isfinite(number):
            raise NotACursorError(item)
        return number
    if not isinstance(item, kind) or (isinstance(item, int) and not 0 <= item <= MAX_INT):
        raise NotACursorError(item)
    if isinstance(item, str) and ("\x00" in item or _unencodable(item)):
        raise NotACursorError(item)
    return item


def _unencodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def invalid_cursor() -> ProblemError:
    return ProblemError(
        422,
        "the cursor is not one this server issued",
        code="invalid_request",
        errors=[FieldProblem(field="query.cursor", reason="invalid cursor")],
    )


def position(cursor: str | None, shape: Sequence[type]) -> tuple[Any, ...] | None:
    """The keyset position in ``cursor`` (``None`` without one: the first page)."""
    return tuple(decode(cursor, shape)) if cursor is not None else None


def keyset_page(
    items: Sequence[T], limit: int, key: Callable[[T], Sequence[Any]]
) -> tuple[list[T], str | None]:
    """The page of ``items`` - up to ``limit + 1`` the store listed after the cursor's
    position - and the next cursor (the key of its last item) when there is more."""
    page = list(items[:limit])
    more = len(items) > limit
    return page, encode(key(page[-1])) if more and page else None
