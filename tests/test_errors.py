"""The exception tree: its drawing in ``core/errors.py`` is the classes' own, and a tool
error says one code however it is read."""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterator

import pytest

import corral
from corral.core import errors
from corral.core.errors import CorralError, ToolError, ToolErrorCode

#: a line of the drawing: the branch (its indent says the depth) and the class name
_BRANCH = re.compile(r"^(?P<indent>[│ ]*)[├└]── (?P<name>\w+)")


def drawn_edges() -> set[tuple[str, str]]:
    """(parent, child) for every branch the module docstring draws."""
    lines = (errors.__doc__ or "").splitlines()
    root = next(i for i, line in enumerate(lines) if line.strip() == "CorralError")
    margin = lines[root].index("CorralError")
    parents = ["CorralError"]
    edges: set[tuple[str, str]] = set()
    for line in lines[root + 1 :]:
        match = _BRANCH.match(line[margin:])
        if match is None:
            break
        depth = len(match["indent"]) // 4
        del parents[depth + 1 :]
        edges.add((parents[depth], match["name"]))
        parents.append(match["name"])
    return edges


def subclasses(cls: type[CorralError]) -> Iterator[type[CorralError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from subclasses(sub)


def real_edges() -> set[tuple[str, str]]:
    """(base, class) for every ``CorralError`` subclass defined anywhere in ``corral``."""
    for module in pkgutil.walk_packages(corral.__path__, "corral."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    return {
        (cls.__base__.__name__, cls.__name__)
        for cls in subclasses(CorralError)
        if cls.__module__.startswith("corral.")  # not the tests' own
    }


def test_the_drawn_error_tree_is_the_class_tree() -> None:
    drawn = drawn_edges()
    assert len(drawn) > 10, "the drawing was not found or not parsed"
    assert drawn == real_edges()


@pytest.mark.parametrize("code", list(ToolErrorCode))
def test_a_tool_error_has_one_code(code: ToolErrorCode) -> None:
    error = ToolError(code, "why", retryable=True)

    assert error.code == error.to_dict()["code"] == error.info.code == code.value
