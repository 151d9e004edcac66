"""The ``python`` tool kind: a function imported from ``package.module:function``.

Unless the Tool gives ``parameters``, the JSON Schema is derived from the
function's signature with pydantic (annotations, defaults, and the argument
descriptions of a Google-style ``Args:`` docstring section); the docstring also
supplies the description when the Tool has none. A parameter annotated
:class:`~corral.tools.base.ToolContext` receives the call's context and is not
part of the schema.

Synchronous functions run in a worker thread, coroutine functions are awaited.
A cancelled call returns at once; a synchronous function cannot be interrupted,
so its thread is abandoned and finishes on its own. With ``inline: true`` a
synchronous function is called on the event loop instead: no thread hop (two
thread wake-ups, ~0.1-0.3 ms a call on a small VM), for functions that return in
microseconds and never block; nothing else in the process runs meanwhile, and
neither a timeout nor a cancellation can stop it. With ``isolation: process`` the
function runs in a worker subprocess that a timeout or cancellation kills
(:mod:`corral.tools.python_process`); it is imported here too, for its schema.
"""

from __future__ import annotations

import functools
import inspect
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any

import anyio.to_thread
import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic.json_schema import GenerateJsonSchema

from corral.core.errors import ConfigurationError, ToolError, ToolErrorCode
from corral.core.messages import ToolSpec
from corral.resources.kinds import ToolSpecModel
from corral.tools.base import Tool, ToolContext
from corral.tools.naming import model_tool_name
from corral.tools.python_import import load_function

__all__ = ["PythonTool", "create", "load_function", "signature_schema"]

_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):\s*$")
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


class _NoFieldTitles(GenerateJsonSchema):
    """Schemas without pydantic's generated ``title`` on every property: noise to a model."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def _split_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The description part of a docstring and the per-argument descriptions of its ``Args:``."""
    description: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for line in doc.splitlines():
        header = _SECTION.match(line.strip())
        if header and not line.startswith((" ", "\t")):
            section, current = header.group(1), None
            continue
        if section is None:
            description.append(line)
        elif section in ("Args", "Arguments", "Parameters") and line.strip():
            match = _ARG_LINE.match(line.strip())
            indent = len(line) - len(line.lstrip())
            if match and (current is None or indent <= 4):
                current = match.group(1).lstrip("*")
                args[current] = match.group(2).strip()
            elif current is not None:
                args[current] = f"{args[current]} {line.strip()}".strip()
    return "\n".join(description).strip(), args


def _is_context(annotation: Any) -> bool:
    if annotation is ToolContext:
        return True
    arguments = typing.get_args(annotation)
    return type(None) in arguments and ToolContext in arguments and len(arguments) == 2


def signature_schema(
    fn: Callable[..., Any], *, name: str
) -> tuple[type[BaseModel], str | None, dict[str, Any]]:
    """Derive the arguments model, the context parameter name and the JSON Schema of ``fn``."""
    try:
        signature = inspect.signature(fn)
        hints = typing.get_type_hints(fn, include_extras=True)
    except (TypeError, ValueError, NameError) as exc:
        raise ConfigurationError(f"Tool {name!r}: cannot read the signature: {exc}") from exc
    _, arg_docs = _split_docstring(inspect.getdoc(fn) or "")
    fields: dict[str, Any] = {}
    context_param: str | None = None
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ConfigurationError(
                f"Tool {name!r}: parameter {param.name!r} must be a named (keyword) parameter; "
                "give 'parameters' explicitly to use *args, **kwargs or positional-only ones"
            )
        annotation = hints.get(param.name, Any)
        if _is_context(annotation):
            context_param = param.name
            continue
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, Field(default, description=arg_docs.get(param.name)))
    try:
        model: type[BaseModel] = create_model(
            f"{model_tool_name(name)}_arguments",
            __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False),
            **fields,
        )
        schema = model.model_json_schema(schema_generator=_NoFieldTitles)
    except (TypeError, ValueError, NameError, pydantic_core.SchemaError) as exc:
        raise ConfigurationError(f"Tool {name!r}: cannot derive a JSON Schema: {exc}") from exc
    schema.pop("title", None)
    schema.setdefault("properties", {})
    return model, context_param, schema


def _is_coroutine_function(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    )


class PythonTool(Tool):
    """A Tool backed by an imported Python callable; see the module docstring."""

    def __init__(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        description: str,
        parameters: dict[str, Any],
        arguments_model: type[BaseModel] | None,
        context_param: str | None,
        idempotent: bool,
        inline: bool = False,
        process: tuple[str, str | None] | None = None,
    ) -> None:
        self.ref = name
        self.spec = ToolSpec(model_tool_name(name), description, parameters)
        self.idempotent = idempotent
        self._fn = fn
        self._model = arguments_model
        self._context_param = context_param
        self._is_async = _is_coroutine_function(fn)
        self._inline = inline
        #: ``(function, path)`` to import in a worker subprocess (isolation: process)
        self._process = process

    def _kwargs(self, arguments: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        if self._model is None:
            kwargs = dict(arguments)
        else:
            try:
                validated = self._model.model_validate(arguments)
            except ValidationError as exc:
                raise ToolError(
                    ToolErrorCode.INVALID_INPUT, str(exc), details={"errors": exc.errors()}
                ) from exc
            # attributes, not model_dump(): nested models and dates arrive as the declared types
            kwargs = {field: getattr(validated, field) for field in type(validated).model_fields}
        if self._context_param is not None:
            kwargs[self._context_param] = ctx
        return kwargs

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        kwargs = self._kwargs(arguments, ctx)
        if self._process is not None:
            from corral.tools.python_process import call_in_process

            function, path = self._process
            return await call_in_process(function, path, self.ref, kwargs, self._is_async)
        try:
            if self._is_async:
                result = await self._fn(**kwargs)
            elif self._inline:
                result = self._fn(**kwargs)
            else:
                result = await anyio.to_thread.run_sync(
                    functools.partial(self._fn, **kwargs), abandon_on_cancel=True
                )
        except ToolError:
            raise
        except Exception as exc:  # the function's failure is the tool's error
            raise ToolError(
                ToolErrorCode.EXECUTION_FAILED,
                f"{type(exc).__name__}: {exc}",
                retryable=isinstance(exc, ConnectionError | TimeoutError),
            ) from exc
        return pydantic_core.to_jsonable_python(result, fallback=str)


def create(name: str, spec: ToolSpecModel, secrets: Mapping[str, str]) -> Tool:
    """Build a ``python`` Tool; import or signature problems raise ``ConfigurationError`` now.

    ``secrets`` is unused: a Python tool that needs credentials reads
    ``ToolContext.secrets``.
    """
    if spec.python is None:
        raise ConfigurationError(f"Tool {name!r}: type 'python' needs a 'python' block")
    if spec.python.isolation == "sandbox":  # never imported here: see corral.tools.python_sandbox
        raise ConfigurationError(
            f"Tool {name!r}: isolation 'sandbox' is built by corral.tools.python_sandbox"
        )
    fn = load_function(spec.python.function, spec.python.path, name=name)
    doc_description, _ = _split_docstring(inspect.getdoc(fn) or "")
    description = spec.description or doc_description
    model: type[BaseModel] | None
    if spec.parameters is not None:
        model, parameters = None, spec.parameters
        context_param = next(
            (
                param
                for param, annotation in _hints(fn, name=name).items()
                if _is_context(annotation)
            ),
            None,
        )
    else:
        model, context_param, parameters = signature_schema(fn, name=name)
    return PythonTool(
        name,
        fn,
        description=description,
        parameters=parameters,
        arguments_model=model,
        context_param=context_param,
        idempotent=spec.idempotent,
        inline=spec.python.inline,
        process=(
            (spec.python.function, spec.python.path) if spec.python.isolation == "process" else None
        ),
    )


def _hints(fn: Callable[..., Any], *, name: str) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except (TypeError, NameError) as exc:
        raise ConfigurationError(f"Tool {name!r}: cannot read the annotations: {exc}") from exc
