"""JSON Schema validators that never fetch anything.

jsonschema's default registry retrieves a remote ``$ref`` (``http://...``) with
``urllib`` while validating, so a schema a caller sends (a task's
``output_schema``) or an MCP server offers (a tool's ``inputSchema``) could make
the worker GET any address, cloud metadata included, past the ``http`` tools'
SSRF guard. Here a reference outside the schema is simply unresolvable.
"""

from __future__ import annotations

from typing import Any, NoReturn

from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable

__all__ = ["Unresolvable", "local_validator", "unresolvable_reason"]


def _never_retrieve(uri: str) -> NoReturn:
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # an attrs class mypy misreads


_LOCAL_ONLY: Registry[Any] = Registry(retrieve=_never_retrieve)  # type: ignore[call-arg]


def local_validator(schema: dict[str, Any]) -> Draft202012Validator:
    """A 2020-12 validator of ``schema`` whose references resolve only inside it."""
    return Draft202012Validator(schema, registry=_LOCAL_ONLY)


def unresolvable_reason(exc: Unresolvable) -> str:
    """What to say about a reference that could not be resolved."""
    return (
        f"the schema's reference {exc.ref!r} cannot be resolved (remote references are not fetched)"
    )
