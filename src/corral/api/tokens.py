"""API tokens: listed and shown without their secret, which a new token shows once."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Self

from pydantic import BaseModel, Field

from corral.api.common import FromRecord, Request, Text, Timestamp
from corral.core.tokens import ApiToken, Role


class TokenOut(FromRecord):
    """An API token, without its secret."""

    id: str
    namespace: str
    role: Role
    name: str
    description: str
    created_at: Timestamp
    last_used_at: Timestamp | None = None
    revoked_at: Timestamp | None = None

    @classmethod
    def from_token(cls, token: ApiToken) -> Self:
        return cls.model_validate(token)


class TokenCreated(TokenOut):
    token: str = Field(description="The token itself: shown this once, never again.")

    @classmethod
    def from_created(cls, token: ApiToken, plain: str) -> Self:
        # the record's fields and the one the record never holds (secret_hash is dropped)
        return cls.model_validate({**asdict(token), "token": plain})


class TokenPage(BaseModel):
    items: list[TokenOut]
    next_cursor: str | None


class CreateToken(Request):
    """A new token of the caller's namespace."""

    role: Role
    name: Annotated[Text, Field(max_length=255)] = ""
    description: Annotated[Text, Field(max_length=4000)] = ""
