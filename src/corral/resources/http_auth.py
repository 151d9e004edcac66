"""The auth profile of an outbound HTTP call (an ``http`` Tool, an MCP server, a
Memory's remote backend): a header made from a Secret, never the value inline."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from corral.resources.spec import Spec

_NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"


class HttpAuth(Spec):
    type: Literal["bearer", "api-key", "basic"]
    secret: str = Field(
        pattern=_NAME_PATTERN, description="for basic: a secret holding 'user:password'"
    )
    header: str = Field(default="X-API-Key", description="header name for api-key auth")


__all__ = ["HttpAuth"]
