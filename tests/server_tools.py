"""The python tool of the server tests (imported by path, like a user's tool)."""

from __future__ import annotations

import time


def slow_echo(text: str, seconds: float = 0.0) -> str:
    """Answer ``text`` after ``seconds``: a tool call that is in flight for a while.

    Args:
        text: What to answer.
        seconds: How long to take.
    """
    time.sleep(seconds)
    return text
