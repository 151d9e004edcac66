"""freeze_startup_heap (runtime/heap.py), in a child process: it changes the interpreter's
collector for good, which a test process must not have done to it."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import gc
import corral.runtime.worker  # a worker's start-up imports
from corral.runtime.heap import freeze_startup_heap

assert gc.get_freeze_count() == 0
freeze_startup_heap()
frozen = gc.get_freeze_count()
print(frozen, sum(gc.get_count()))
"""


def test_the_startup_heap_is_frozen_out_of_the_collections() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True
    )
    frozen, tracked = (int(n) for n in done.stdout.split())
    assert frozen > 10_000  # the imported modules' objects: out of every collection's way
    assert tracked < 100  # nothing left for the young generations to walk
