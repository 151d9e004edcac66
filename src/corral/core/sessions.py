"""Sessions: a conversation that carries across runs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from corral.core.messages import Message


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
