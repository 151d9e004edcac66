"""The trivial tool both sides of ``durable_overhead.py`` call (imported by path, like a user's)."""

from __future__ import annotations


def lookup(query: str) -> str:
    """Return a canned answer for ``query``."""
    return f"result for {query}"
