"""What the bodies of every area share: field types, the request and response bases, messages.

Requests forbid unknown fields (:class:`Request`). Responses built from a library
record derive from :class:`FromRecord`: pydantic reads the record's attributes
(``from_attributes``), so a field is defined once, in the record, and the body
only says how it is published.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from corral.core.sessions import (
    SESSION_ID_PATTERN,
    SESSION_ID_RULE,
    InvalidSessionIdError,
    check_session_id,
)
from corral.resources.kinds import NAME_PATTERN

#: items per page of a list


def surrogate_path(value: Any, path: str = "") -> str | None:
    """Where in ``value`` (JSON data) a string holds a lone surrogate, or ``None``.

    ``json.loads`` accepts ``"\\ud800"``, but such a string is not Unicode text: it
    cannot be encoded to UTF-8, so it could be neither stored nor sent back.
    """
    if isinstance(value, str):
        return path if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            where = surrogate_path(key, path) or surrogate_path(item, f"{path}.{key}".lstrip("."))
            if where is not None:
                return where
    elif isinstance(value, list):
        for index, item in enumerate(value):
            where = surrogate_path(item, f"{path}[{index}]")
            if where is not None:
                return where
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _unicode_only(value: dict[str, Any]) -> dict[str, Any]:
    where = surrogate_path(value)
    if where is not None:
        raise ValueError(f"text at {where or 'the top'!r} is not valid Unicode (a lone surrogate)")
    return value


Name = Annotated[str, Field(pattern=NAME_PATTERN, description="A resource name.")]
#: A JSON object from a client (a JSON Schema): any content, but only valid Unicode text.
JsonObject = Annotated[dict[str, Any], AfterValidator(_unicode_only)]
#: Free text: any characters but NUL, which PostgreSQL cannot store.
Text = Annotated[str, Field(pattern=r"^[^\x00]*$")]
ID_PATTERN = r"^[A-Za-z0-9._:-]+$"
Id = Annotated[str, Field(min_length=1, max_length=64, pattern=ID_PATTERN)]
Timestamp = Annotated[float, Field(description="Seconds since the epoch (UTC).")]


def _session_id(value: str) -> str:
    try:
        return check_session_id(value)
    except InvalidSessionIdError:
        raise ValueError(SESSION_ID_RULE) from None


#: A session id, checked by the rule the CLI applies too (core/sessions.py): the schema
#: publishes it, the validator alone enforces it, so both refuse with the same reason.
SessionId = Annotated[
    str,
    AfterValidator(_session_id),
    WithJsonSchema({"type": "string", "pattern": SESSION_ID_PATTERN, "maxLength": 64}),
]


class Request(BaseModel):
    """Base of request bodies: unknown fields are errors."""

    model_config = ConfigDict(extra="forbid")


class FromRecord(BaseModel):
    """Base of response bodies built from a library record: ``Model.model_validate(record)``.

    Fields are read from the record's attributes (nested records too), so the body
    lists only what it publishes; a record's attribute the body leaves out is not sent.
    """

    model_config = ConfigDict(from_attributes=True)


class ToolCallOut(FromRecord):
    id: str
    name: str
    arguments: str = Field(description="The model's arguments, as JSON text.")


class MessageOut(FromRecord):
    """One message of a conversation."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: list[ToolCallOut] = Field(default_factory=list[ToolCallOut])
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False
