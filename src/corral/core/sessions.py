"""Sessions: a conversation that carries across runs."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from corral.core.errors import UserError
from corral.core.messages import Message

#: Session ids are chosen by clients; the API and the CLI hold them to this one rule.
SESSION_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,64}$"
SESSION_ID_RULE = "a session id is 1 to 64 characters: letters, digits, '.', '_', ':' or '-'"
_SESSION_ID = re.compile(SESSION_ID_PATTERN)


class InvalidSessionIdError(UserError):
    """A session id breaks :data:`SESSION_ID_RULE`."""

    code = "invalid_session_id"


class SessionNotAllowedError(UserError):
    """A child run named a session its run tree may not continue (another user's, say):
    see :func:`~corral.store.sql.rules.check_session_of_tree`."""

    code = "session_not_allowed"


def check_session_id(session_id: str) -> str:
    """``session_id`` when it follows the rule; ``InvalidSessionIdError`` otherwise."""
    if not _SESSION_ID.fullmatch(session_id):
        raise InvalidSessionIdError(f"invalid session id: {SESSION_ID_RULE}")
    return session_id


@dataclass
class Session:
    """A conversation with one agent; its messages are stored in order."""

    id: str
    namespace: str
    agent: str
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class SessionMessage:
    """One stored message of a session.

    ``hidden`` messages were compacted away: they are kept for audit but no
    longer sent to the model. ``summary`` marks a message the compaction wrote.
    """

    seq: int
    message: Message
    run_id: str | None = None
    hidden: bool = False
    summary: bool = False
    created_at: float = field(default_factory=time.time)
