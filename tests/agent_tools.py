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
