"""Sessions: conversations carried across runs, and their stored messages."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, Field

from corral.api.common import FromRecord, MessageOut, Timestamp
from corral.core.sessions import Session, SessionMessage


class SessionOut(FromRecord):
    id: str
    namespace: str
    agent: str
    created_at: Timestamp
    updated_at: Timestamp

    @classmethod
    def from_session(cls, session: Session) -> Self:
        return cls.model_validate(session)


class SessionPage(BaseModel):
    items: list[SessionOut]
    next_cursor: str | None


class SessionMessageOut(FromRecord):
    seq: int
    message: MessageOut
    run_id: str | None = None
    hidden: bool = Field(description="Compacted away: kept for audit, no longer sent to the model.")
    summary: bool = Field(description="Written by compaction, summarizing older messages.")
    created_at: Timestamp

    @classmethod
    def from_stored(cls, message: SessionMessage) -> Self:
        return cls.model_validate(message)


class SessionMessagePage(BaseModel):
    items: list[SessionMessageOut]
    next_cursor: str | None
