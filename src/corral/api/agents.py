"""Prompts: ask an agent and wait for its answer (``/v1/agents/{name}/prompt``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from corral.api.common import JsonObject, Request, SessionId, Text


class Prompt(Request):
    """Ask an agent and wait for the answer."""

    input: Annotated[Text, Field(description="The prompt.")]
    session: SessionId | None = Field(None, description="Carry the conversation of this session.")
    timeout_seconds: float = Field(
        60.0,
        gt=0,
        le=600,
        description="How long to wait; past it the answer is 202 with the task still going.",
    )


class PromptObject(Prompt):
    """Ask an agent for JSON that validates against a schema."""

    schema_: JsonObject | None = Field(
        None,
        alias="schema",
        description="The JSON Schema of the answer; defaults to the agent's output_schema.",
    )
