"""Linked agents over HTTP, for tool programs holding an agent token (``/v1/links``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field

from corral.api.common import JsonObject, Request, SessionId, Text


class LinkOut(BaseModel):
    """One agent the calling agent may call."""

    agent: str
    description: str = ""


class LinkPage(BaseModel):
    """The calling agent's linked agents (all of them: there are few)."""

    items: list[LinkOut]
    next_cursor: str | None = None


class LinkInfo(LinkOut):
    """What the caller may know of a linked agent."""

    tools: list[str] = Field(default_factory=list[str])
    output_schema: JsonObject | None = None

    @staticmethod
    def of(agent: str, description: str, info: dict[str, Any]) -> LinkInfo:
        return LinkInfo(agent=agent, description=description, **info)


class LinkExec(Request):
    """Run a linked agent as a child run of the caller's run."""

    input: Annotated[Text, Field(description="All the child run sees (its first message).")]
    session: SessionId | None = Field(
        None,
        description="A session of the linked agent to open or continue: a new one, one a run "
        "of the caller's run tree opened, or the session of the calling run or an ancestor "
        "(any other: 403 `session_not_allowed`).",
    )
    wait: bool = Field(
        True,
        description="Wait for the child to settle (200); false answers 202 at once.",
    )
    timeout_seconds: float = Field(
        60.0,
        gt=0,
        le=600,
        description="How long to wait; past it the answer is 202 with the child still going.",
    )
