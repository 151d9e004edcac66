"""Functions for ``python`` tools with ``isolation: process`` (tests/test_tools_python_process.py)."""

from __future__ import annotations

import os
import time

from corral.core.errors import ToolError


def spin() -> None:
    """Loops forever, ignoring every timeout: only killing its process ends it."""
    while True:
        pass


def pid() -> int:
    """The process the function runs in."""
    return os.getpid()


def nap(seconds: float) -> str:
    """Sleeps, then says so."""
    time.sleep(seconds)
    return f"slept {seconds}"


def die(code: int) -> None:
    """Ends its process without answering."""
    os._exit(code)


def refuse(reason: str) -> None:
    """Fails with a tool error of its own."""
    raise ToolError("permission_denied", reason, retryable=True)


async def later(text: str) -> str:
    """A coroutine function."""
    return text.upper()
