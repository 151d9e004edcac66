"""Rendering of the API's bodies for the terminal: tasks, resources, ages.

The CLI renders what the API answers (:mod:`corral.api`) in both modes, and
``-o json`` prints the body itself. A run's events are rendered by
:mod:`corral.cli.events_view`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from corral.api import ResourceOut
from corral.cli.output import age, document


def render_output(output: Any) -> str:
    return output if isinstance(output, str) else json.dumps(output, indent=2, ensure_ascii=False)


def body_json(body: BaseModel | Sequence[BaseModel], *, indent: int | None = 2) -> str:
    """An API body, or a list of them, as JSON (``-o json``): what the API answers, with
    its timestamps as RFC 3339 text (:func:`corral.cli.output.document`)."""
    if isinstance(body, BaseModel):
        data: Any = document(body)
    else:
        data = [document(item) for item in body]
    return json.dumps(data, indent=indent, ensure_ascii=False)


def resource_document(resource: ResourceOut) -> dict[str, Any]:
    """A stored resource as the document ``apply`` takes (secret values stay redacted)."""
    data = resource.model_dump(mode="json", exclude_none=True)
    return {key: data[key] for key in ("apiVersion", "kind", "metadata", "spec")}


__all__ = ["age", "body_json", "render_output", "resource_document"]
