"""The one tool every framework calls: a trivial Python function, imported by path like a user's.

Each framework is handed this same function (Corral through a ``python`` Tool
resource, the peers through their own tool decorators), so the tool's own cost
is identical and what differs is what each framework does around it. It counts
its calls, so a child can check that a framework really made every tool call.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_calls = 0


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    global _calls
    with _lock:  # some frameworks run sync tools in worker threads
        _calls += 1
    return a + b


def take_calls() -> int:
    """How many times :func:`add` ran since the last call to this function."""
    global _calls
    with _lock:
        count, _calls = _calls, 0
    return count
