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


def render_output(output: Any) -> str:
    return output if isinstance(output, str) else json.dumps(output, indent=2, ensure_ascii=False)


def body_json(body: BaseModel | Sequence[BaseModel], *, indent: int | None = 2) -> str:
    """An API body, or a list of them, as JSON (``-o json``): what the API answers."""
    if isinstance(body, BaseModel):
        data: Any = body.model_dump(mode="json")
    else:
        data = [item.model_dump(mode="json") for item in body]
    return json.dumps(data, indent=indent, ensure_ascii=False)


def resource_document(resource: ResourceOut) -> dict[str, Any]:
    """A stored resource as the document ``apply`` takes (secret values stay redacted)."""
    data = resource.model_dump(mode="json", exclude_none=True)
    return {key: data[key] for key in ("apiVersion", "kind", "metadata", "spec")}


def age(seconds: float) -> str:
    """A duration as kubectl shows ages: ``45s``, ``12m``, ``5h``, ``3d``."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "m" else 1):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
