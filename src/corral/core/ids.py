"""Identifiers: sortable, URL-safe, prefixed by what they name."""

from __future__ import annotations

import os
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case
#: every pair of base32 digits, indexed by the 10 bits they encode (half as many steps per id)
_PAIRS = tuple(high + low for high in _ALPHABET for low in _ALPHABET)
_MILLIS_BITS = 50  # 10 digits
_RANDOM_BITS = 80  # 16 digits


def new_id(prefix: str) -> str:
    """A new id like ``run_01hx...``: 48 bits of milliseconds then 80 random bits.

    Ids made later sort later (to the millisecond), which keeps store indexes
    append-mostly and listings naturally ordered.
    """
    millis = time.time_ns() // 1_000_000 & (1 << _MILLIS_BITS) - 1
    value = millis << _RANDOM_BITS | int.from_bytes(os.urandom(_RANDOM_BITS // 8), "big")
    # 26 digits, most significant first: 10 of milliseconds, then 16 random ones
    top = _MILLIS_BITS + _RANDOM_BITS - 10
    return f"{prefix}_{''.join([_PAIRS[value >> shift & 1023] for shift in range(top, -1, -10)])}"
