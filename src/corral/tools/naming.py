"""Model-facing tool names.

Agents and permissions name tools by their *ref* (``add``, ``web.search``,
``mcp:files/read``); model APIs accept far fewer characters (OpenAI requires
``^[a-zA-Z0-9_-]{1,64}$``). :func:`model_tool_name` maps a ref to a readable,
deterministic model name; :func:`model_tool_names` does the same for the tool
set of one agent and guarantees the names are unique within it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from corral.core.messages import ToolSpec
from corral.resources.kinds import ToolSpecModel

__all__ = ["MAX_NAME_LENGTH", "declared_spec", "model_tool_name", "model_tool_names"]

MAX_NAME_LENGTH = 64
_VALID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_INVALID_CHAR = re.compile(r"[^a-zA-Z0-9_-]")
_HASH_LENGTH = 8


def _short_hash(ref: str) -> str:
    return hashlib.sha256(ref.encode("utf-8")).hexdigest()[:_HASH_LENGTH]


def _with_hash(base: str, ref: str) -> str:
    """``base`` shortened so that ``base_<hash of ref>`` fits in the length limit."""
    keep = MAX_NAME_LENGTH - _HASH_LENGTH - 1
    return f"{base[:keep].rstrip('_-') or 'tool'}_{_short_hash(ref)}"


def model_tool_name(ref: str) -> str:
    """The name a model sees for the tool ``ref``.

    A ref that is already a valid name is returned unchanged. Otherwise the
    ``mcp:`` prefix is dropped, ``/`` becomes ``__`` and every other character
    outside ``[a-zA-Z0-9_-]`` becomes ``_`` (``mcp:files/read`` ->
    ``files__read``). A result longer than 64 characters is cut and suffixed
    with a short hash of the full ref, so long refs that share a prefix stay
    distinct.
    """
    if _VALID.match(ref):
        return ref
    body = ref.removeprefix("mcp:").replace("/", "__")
    name = _INVALID_CHAR.sub("_", body)
    if not name.strip("_-"):
        return _with_hash("tool", ref)
    if len(name) > MAX_NAME_LENGTH:
        return _with_hash(name, ref)
    return name


def model_tool_names(refs: Iterable[str]) -> dict[str, str]:
    """Model names for the tools of one agent, unique among themselves.

    Each ref gets :func:`model_tool_name`; when two refs map to the same name
    (``a.b`` and ``a_b``), every ref involved gets a hash-suffixed name instead,
    so the result does not depend on the order of ``refs``.
    """
    unique = sorted(set(refs))
    plain = {ref: model_tool_name(ref) for ref in unique}
    seen: dict[str, int] = {}
    for name in plain.values():
        seen[name] = seen.get(name, 0) + 1
    return {
        ref: (name if seen[name] == 1 else _with_hash(name, ref)) for ref, name in plain.items()
    }


def declared_spec(name: str, spec: ToolSpecModel) -> ToolSpec:
    """What the model is told about a Tool resource that declares its own ``parameters``."""
    parameters = spec.parameters or {"type": "object", "properties": {}}
    return ToolSpec(model_tool_name(name), spec.description, parameters)
