"""Plain functions the test agents use as python tools (imported by path, like a user's)."""

from __future__ import annotations

import os
from pathlib import Path


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def record_side_effect(note: str) -> str:
    """Append a line to the file named by $CORRAL_TEST_SIDE_EFFECTS (proves a call really ran)."""
    target = Path(os.environ["CORRAL_TEST_SIDE_EFFECTS"])
    with target.open("a") as f:
        f.write(note + "\n")
    return "recorded"


def flaky(note: str) -> str:
    """Fail like an unreachable service on the first call, then work: each call appends a
    line to $CORRAL_TEST_FLAKY, and the call that finds the file empty fails."""
    target = Path(os.environ["CORRAL_TEST_FLAKY"])
    first = not target.exists() or not target.read_text()
    with target.open("a") as f:
        f.write(note + "\n")
    if first:
        raise ConnectionError("503 from http://service.test/notes")
    return f"noted {note}"


def nap(seconds: float) -> str:
    """Sleep (in the tool's thread), then say so."""
    import time

    time.sleep(seconds)
    return f"slept {seconds} s"
