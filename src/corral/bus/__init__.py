"""Messaging between the parts of Corral: wake-ups for workers and for event followers,
dispatch of runnable runs, and delivery of agent messages.

The store is the source of truth; the bus only says *look now*. A lost,
delayed or duplicated bus message costs latency, never a run: workers still
claim through the store (lease and fencing token decide), and followers still
read events from the store, falling back to polling when no signal comes.
"""

from __future__ import annotations

from corral.bus.base import Bus, Delivery, EventWatch, MessageDelivery
from corral.bus.local import LocalBus
from corral.core.settings import Settings


async def open_bus(
    url: str | None = None,
    *,
    prefix: str = "corral",
    ack_wait_seconds: float = 30.0,
    max_deliver: int = 5,
    name: str | None = None,
) -> Bus:
    """The bus at ``url``: NATS JetStream for ``nats://...``, the in-process bus when ``None``.

    ``ack_wait_seconds`` and ``max_deliver`` apply to the deliveries of either bus.

    ``BusError`` when NATS cannot be reached or set up. The caller closes the bus
    (it is an async context manager).
    """
    if not url:
        return LocalBus(ack_wait_seconds=ack_wait_seconds, max_deliver=max_deliver)
    from corral.bus.nats import NatsBus  # nats-py is imported only by those who use it

    return await NatsBus.connect(
        url, prefix=prefix, ack_wait_seconds=ack_wait_seconds, max_deliver=max_deliver, name=name
    )


async def open_settings_bus(settings: Settings, *, name: str | None = None) -> Bus:
    """The bus these settings name (``CORRAL_NATS_URL`` and the other ``CORRAL_NATS_*``)."""
    return await open_bus(
        settings.nats_url,
        prefix=settings.nats_prefix,
        ack_wait_seconds=settings.nats_ack_wait_seconds,
        max_deliver=settings.nats_max_deliver,
        name=name,
    )


__all__ = [
    "Bus",
    "Delivery",
    "EventWatch",
    "LocalBus",
    "MessageDelivery",
    "open_bus",
    "open_settings_bus",
]
