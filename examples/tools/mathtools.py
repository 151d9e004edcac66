"""Arithmetic tools for the demo agent (``Tool`` ``add``, type ``python``)."""

from __future__ import annotations


def add(a: int, b: int) -> int:
    """Add two integers and return their sum."""
    return a + b
