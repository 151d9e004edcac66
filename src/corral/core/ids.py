"""Identifiers: sortable, URL-safe, prefixed by what they name."""

from __future__ import annotations

import os
import threading
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case
#: every pair of base32 digits, indexed by the 10 bits they encode (half as many steps per id)
_PAIRS = tuple(high + low for high in _ALPHABET for low in _ALPHABET)
_MILLIS_BITS = 50  # 10 digits
_RANDOM_BITS = 80  # 16 digits
_RANDOM_BYTES = _RANDOM_BITS // 8
#: how many ids' random bytes one read of the OS's generator takes
_POOLED_IDS = 256


class _RandomPool:
    """The OS's random bytes, read a few hundred ids' worth at a time.

    ``os.urandom`` lets go of the GIL for its system call: called for every id, it
    hands the interpreter to another thread (the store's writer) in the middle of
    whatever the event loop was doing, such as submitting several child runs that
    would otherwise share one commit. Thread-safe; a forked process reads its own.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = b""
        self._at = 0
        os.register_at_fork(after_in_child=self._forget)

    def take(self) -> int:
        with self._lock:
            at = self._at
            if at + _RANDOM_BYTES > len(self._bytes):
                self._bytes, at = os.urandom(_RANDOM_BYTES * _POOLED_IDS), 0
            self._at = at + _RANDOM_BYTES
            return int.from_bytes(self._bytes[at : at + _RANDOM_BYTES], "big")

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._bytes, self._at = b"", 0


_random = _RandomPool()


def new_id(prefix: str) -> str:
    """A new id like ``run_01hx...``: 48 bits of milliseconds then 80 random bits.

    Ids made later sort later (to the millisecond), which keeps store indexes
    append-mostly and listings naturally ordered.
    """
    millis = time.time_ns() // 1_000_000 & (1 << _MILLIS_BITS) - 1
    value = millis << _RANDOM_BITS | _random.take()
    # 26 digits, most significant first: 10 of milliseconds, then 16 random ones
    top = _MILLIS_BITS + _RANDOM_BITS - 10
    return f"{prefix}_{''.join([_PAIRS[value >> shift & 1023] for shift in range(top, -1, -10)])}"
