"""The ``python`` tool kind: import, schema derivation, context injection, threads, errors.

What every kind does (invalid input, timeouts, cancellation, the output cap, failures, the
idempotency key) is in ``tests/conformance/test_tool_kinds.py``.
"""

from __future__ import annotations

import importlib
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.core.errors import ConfigurationError, ResourceError, ToolError
from corral.resources.kinds import PythonToolSpec, ToolSpecModel
from corral.resources.loader import load_text
from corral.tools import python as python_tool
from corral.tools.base import Tool, ToolContext

PROGRAMS = Path(__file__).parent / "tool_programs"


def make(function: str, **fields: Any) -> Tool:
    spec = ToolSpecModel(
        type="python",
        python=PythonToolSpec(function=f"corral_sample_tools:{function}", path=str(PROGRAMS)),
        **fields,
    )
    return python_tool.create(function, spec, {})


def context(tmp_path: Path) -> ToolContext:
    return ToolContext(
        run_id="run-1",
        agent="helper",
        namespace="default",
        call_id="call-1",
        idempotency_key="run-1:1:call-1",
        workspace=tmp_path,
    )


def test_schema_is_derived_from_signature_and_docstring() -> None:
    tool = make("add")
    assert tool.ref == "add"
    assert tool.spec.name == "add"
    assert tool.spec.description == "Add two integers."
    assert tool.spec.parameters == {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "description": "the first number"},
            "b": {
                "type": "integer",
                "default": 2,
                "description": "the second number, defaulting to two",
            },
        },
        "required": ["a"],
        "additionalProperties": False,
    }


def test_context_parameter_is_not_in_the_schema() -> None:
    tool = make("greet")
    assert set(tool.spec.parameters["properties"]) == {"name"}
    assert tool.spec.parameters["required"] == ["name"]


def test_spec_description_and_parameters_win_over_the_function() -> None:
    explicit = {"type": "object", "properties": {"q": {"type": "string"}}}
    tool = make("loose", description="Anything goes.", parameters=explicit, idempotent=True)
    assert tool.spec.description == "Anything goes."
    assert tool.spec.parameters == explicit
    assert tool.idempotent is True


async def test_sync_function_runs_in_a_worker_thread(tmp_path: Path) -> None:
    assert await make("add").call({"a": 40}, context(tmp_path)) == 42
    thread_name = await make("where_am_i").call({}, context(tmp_path))
    assert thread_name != threading.current_thread().name


async def test_an_inline_sync_function_runs_on_the_event_loop_and_fails_like_any(
    tmp_path: Path,
) -> None:
    def inline(function: str) -> Tool:
        block = PythonToolSpec(
            function=f"corral_sample_tools:{function}", path=str(PROGRAMS), inline=True
        )
        return python_tool.create(function, ToolSpecModel(type="python", python=block), {})

    assert await inline("where_am_i").call({}, context(tmp_path)) == (
        threading.current_thread().name
    )
    assert await inline("add").call({"a": 40}, context(tmp_path)) == 42
    with pytest.raises(ToolError) as caught:
        await inline("add").call({"a": "forty"}, context(tmp_path))
    assert caught.value.code == "invalid_input"


def test_inline_is_read_from_a_tool_resource() -> None:
    text = """
apiVersion: corral/v1
kind: Tool
metadata: {name: add}
spec:
  type: python
  python: {function: "corral_sample_tools:add", inline: true}
"""
    (loaded,) = load_text(text, "tools.yaml")
    spec = loaded.resource.spec
    assert isinstance(spec, ToolSpecModel) and spec.python is not None
    assert spec.python.inline is True
    with pytest.raises(ResourceError, match="inline"):
        load_text(text.replace("inline: true", "inline: sometimes"), "tools.yaml")


async def test_async_function_receives_the_context(tmp_path: Path) -> None:
    result = await make("greet").call({"name": "Ada"}, context(tmp_path))
    assert result == {"greeting": "hello Ada", "run": "run-1", "agent": "helper"}


async def test_nested_models_arrive_as_their_declared_type(tmp_path: Path) -> None:
    result = await make("norm").call({"point": {"x": -1, "y": 2.5}}, context(tmp_path))
    assert result == {"type": "Point", "norm": 3.5}


async def test_explicit_parameters_pass_arguments_through(tmp_path: Path) -> None:
    explicit = {"type": "object", "properties": {}, "additionalProperties": True}
    tool = make("loose", parameters=explicit)
    assert await tool.call({"k": [1, 2]}, context(tmp_path)) == {"k": [1, 2]}


async def test_arguments_that_do_not_fit_the_signature_are_invalid_input(tmp_path: Path) -> None:
    with pytest.raises(ToolError) as caught:
        await make("add").call({"a": "not a number"}, context(tmp_path))
    assert caught.value.code == "invalid_input"


async def test_a_cancelled_call_returns_while_its_blocking_function_still_runs(
    tmp_path: Path,
) -> None:
    tool = make("slow")
    sample = importlib.import_module("corral_sample_tools")  # imported by make
    sample.released.clear()
    sample.finished.clear()
    with anyio.move_on_after(0.2) as scope:
        await tool.call({"seconds": 60}, context(tmp_path))
    assert scope.cancelled_caught
    assert not sample.finished.is_set()  # returned; the thread is abandoned, still blocked
    sample.released.set()
    assert await anyio.to_thread.run_sync(sample.finished.wait, 10)  # and ends on its own


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("corral_no_such_module:f", "cannot import module 'corral_no_such_module'"),
        ("corral_broken_tools:f", "RuntimeError: this module is broken on purpose"),
        ("corral_sample_tools:missing", "has no attribute 'missing'"),
        ("corral_sample_tools:NOT_CALLABLE", "is not callable"),
    ],
)
def test_import_problems_are_configuration_errors(function: str, message: str) -> None:
    spec = ToolSpecModel(
        type="python", python=PythonToolSpec(function=function, path=str(PROGRAMS))
    )
    with pytest.raises(ConfigurationError, match=message):
        python_tool.create("t", spec, {})


def test_var_keyword_functions_need_explicit_parameters() -> None:
    with pytest.raises(ConfigurationError, match="explicitly"):
        make("loose")
