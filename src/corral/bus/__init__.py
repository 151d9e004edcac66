"""Messaging between the parts of Corral: wake-ups for workers and for event followers.

The store is the source of truth; the bus only says *look now*. A lost,
delayed or duplicated bus message costs latency, never a run: workers still
claim through the store (lease and fencing token decide), and followers still
read events from the store, falling back to polling when no signal comes.
"""

from __future__ import annotations

from corral.bus.base import Bus, EventWatch
from corral.bus.local import LocalBus

__all__ = ["Bus", "EventWatch", "LocalBus"]
