"""The python tool of the server tests (imported by path, like a user's tool)."""

from __future__ import annotations

import os
import time


def slow_echo(text: str, seconds: float = 0.0) -> str:
    """Answer ``text`` after ``seconds``: a tool call that is in flight for a while.

    Args:
        text: What to answer.
        seconds: How long to take.
    """
    time.sleep(seconds)
    return text


def fail_with_env(variable: str) -> str:
    """Fail with an exception whose text quotes an environment variable (a careless tool).

    Args:
        variable: The variable to quote.
    """
    raise KeyError(os.environ[variable])
