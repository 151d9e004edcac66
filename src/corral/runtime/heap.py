"""Long-running Corral processes keep the heap of their start-up out of the collector's way."""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Move every object alive now into the collector's permanent generation (``gc.freeze``).

    A worker or API server imports tens of thousands of objects (modules, classes,
    pydantic and SQLAlchemy schemas, the SDKs) that live as long as the process.
    Left tracked, every full collection walks them all: tens of milliseconds each,
    several times a second under load (a quarter of a busy worker's main thread,
    measured). Frozen, collections walk only what runs allocate. Call it once, when
    start-up is over; the garbage start-up left is collected first, so none of it
    is kept. A program that embeds Corral may do the same after its own start-up.
    """
    gc.collect()
    gc.freeze()
