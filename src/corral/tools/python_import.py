"""Importing a ``python`` tool's function from ``package.module:attribute``: the one loader
of the in-process tool (:mod:`corral.tools.python`) and of its worker subprocesses
(:mod:`corral.tools.python_process`)."""

from __future__ import annotations

import functools
import importlib
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corral.core.errors import ConfigurationError

__all__ = ["load_function"]


def load_function(function: str, path: str | None, *, name: str) -> Callable[..., Any]:
    """Import ``package.module:attribute`` (after putting ``path`` on ``sys.path``)."""
    module_name, _, attribute = function.partition(":")
    if path is not None:
        directory = str(Path(path).resolve())
        if directory not in sys.path:
            sys.path.insert(0, directory)
            importlib.invalidate_caches()
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # module code may raise anything
        raise ConfigurationError(
            f"Tool {name!r}: cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        target: Any = functools.reduce(getattr, attribute.split("."), module)
    except AttributeError as exc:
        raise ConfigurationError(
            f"Tool {name!r}: module {module_name!r} has no attribute {attribute!r}"
        ) from exc
    if not callable(target):
        raise ConfigurationError(f"Tool {name!r}: {function!r} is not callable")
    return typing.cast(Callable[..., Any], target)
