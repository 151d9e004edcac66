"""The base of every resource spec (its own module so spec parts can live beside ``kinds``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Spec(BaseModel):
    """Base of every spec: strict about unknown fields."""

    # One JSON Schema per spec, the one input must match: the API publishes the same
    # schema for what it takes (apply) and what it answers (get, list).
    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, json_schema_mode_override="validation"
    )
