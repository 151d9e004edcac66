"""What a store keeps in process per Memory scope for search, bounded by bytes.

A scope's vectors (:class:`~corral.store.sql.vector_cache.Matrix`) and its words
(:class:`~corral.store.sql.fulltext_index.TextIndex`) are each kept by key, with the
scope generation they are as of (see :mod:`corral.store.sql.memory_scopes`); the least
recently used are dropped first beyond the byte budget. A value larger than the whole
budget is not kept: its key is remembered with its generation (``too_large``), so a
caller can decline to read such a scope whole search after search.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

__all__ = ["ScopeCache", "Sized"]


class Sized(Protocol):
    """A value kept per scope: the generation it is as of, and its size in bytes."""

    @property
    def generation(self) -> int: ...

    @property
    def nbytes(self) -> int: ...


K = TypeVar("K", bound=Hashable)
V = TypeVar("V", bound=Sized)


class ScopeCache(Generic[K, V]):
    """Values by key, least recently used dropped first beyond ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self._values: OrderedDict[K, V] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        #: keys whose value was larger than the whole budget, with its generation
        self.too_large: dict[K, int] = {}
        self.loads = 0  # values built from a scope read whole (misses), for tests and bench
        self.updates = 0  # values brought up to date from their scope's changes

    @property
    def nbytes(self) -> int:
        return self._bytes

    def keys(self) -> list[K]:
        with self._lock:
            return list(self._values)

    def latest(self, key: K) -> V | None:
        """The value of ``key`` whatever its generation (to bring it up to date)."""
        with self._lock:
            value = self._values.get(key)
            if value is not None:
                self._values.move_to_end(key)
            return value

    def get(self, key: K, generation: int) -> V | None:
        """The value of ``key`` if it is of ``generation`` (else it is dropped)."""
        with self._lock:
            value = self._values.get(key)
            if value is None:
                return None
            if value.generation != generation:
                self._drop(key)
                return None
            self._values.move_to_end(key)
            return value

    def put(self, key: K, value: V, *, updated: bool = False) -> bool:
        """Keep ``value`` (built whole, or ``updated`` from an older one) unless it is
        larger than the whole budget (then ``False``, and its key is noted in
        ``too_large``); evict to fit."""
        with self._lock:
            if updated:
                self.updates += 1
            else:
                self.loads += 1
            if key in self._values:
                self._drop(key)
            if value.nbytes > self.max_bytes:
                self.too_large[key] = value.generation
                return False
            self.too_large.pop(key, None)
            while self._values and self._bytes + value.nbytes > self.max_bytes:
                self._drop(next(iter(self._values)))
            self._values[key] = value
            self._bytes += value.nbytes
            return True

    def _drop(self, key: K) -> None:
        self._bytes -= self._values.pop(key).nbytes
