"""Structured output: tell the model the schema, parse and validate its answer."""

from __future__ import annotations

import json
import re
from typing import Any

from corral.core.schemas import Unresolvable, local_validator, unresolvable_reason

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def schema_instruction(schema: dict[str, Any]) -> str:
    """The system-prompt paragraph that asks for JSON matching ``schema``."""
    return (
        "When you give your final answer, reply with only a JSON value (no prose, no code "
        "fence) that validates against this JSON Schema:\n" + json.dumps(schema, ensure_ascii=False)
    )


def parse_output(text: str, schema: dict[str, Any]) -> Any:
    """The JSON value in ``text``, validated; raises ``ValueError`` saying what is wrong."""
    candidate = _extract_json(text)
    try:
        value = json.loads(candidate)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the answer is not valid JSON ({exc.msg} at position {exc.pos})") from exc
    try:
        errors = sorted(local_validator(schema).iter_errors(value), key=lambda e: list(e.path))
    except Unresolvable as exc:
        raise ValueError(unresolvable_reason(exc)) from None
    if errors:
        raise ValueError(
            "the answer does not match the schema: "
            + "; ".join(f"{'/'.join(map(str, e.path)) or '(root)'}: {e.message}" for e in errors)
        )
    return value


def repair_prompt(problem: str) -> str:
    """The user message that asks the model to fix its answer."""
    return f"{problem}. Reply again with only the corrected JSON value."


def _extract_json(text: str) -> str:
    fenced = _FENCE.search(text)
    if fenced:
        return fenced.group(1).strip()
    stripped = text.strip()
    if stripped[:1] in "{[" or not stripped:
        return stripped
    # Tolerate prose around one JSON object: take the outermost braces.
    start, end = stripped.find("{"), stripped.rfind("}")
    return stripped[start : end + 1] if 0 <= start < end else stripped
