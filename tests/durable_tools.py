"""The tool of the durability tests, as a python tool and as an ``exec`` program.

``perform_once`` (python) runs inside the ``corral worker`` process and finds
its directory in ``$CORRAL_TEST_DURABLE_DIR``; run as a script (``exec``), this
module reads ``{"label", "seconds"}`` on stdin and its idempotency key from
``$CORRAL_IDEMPOTENCY_KEY``. Both do the same under that directory:

``invocations.log``  one line per invocation, ``<idempotency key> <label> <pid> <time>``,
                     written first, so a call killed halfway still shows
``effects/<key>``    the side effect, created only when absent (``O_EXCL``):
                     what an idempotent tool does with its idempotency key

The slow part comes after the effect and only when this invocation performed
it: a worker killed during it leaves the effect behind, and the re-run that
finds the effect answers at once (as a real service saying "already done").

``wait_at_gate`` (python, async) is for tests that run the executor in their
own process: a call waits at a :class:`Gate` of :data:`GATES` until the test
opens it, so the call is in flight exactly while the test moves time on.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from corral.tools.base import ToolContext

ENV_DIR = "CORRAL_TEST_DURABLE_DIR"


def effect_file(root: Path, key: str) -> Path:
    """Where the side effect of the call with idempotency key ``key`` is recorded."""
    return root / "effects" / key.replace(":", "_")


def perform(root: Path, key: str, label: str, seconds: float) -> str:
    """Log the invocation, perform the effect unless done, then take ``seconds`` to answer."""
    with (root / "invocations.log").open("a") as log:
        log.write(f"{key} {label} {os.getpid()} {time.time():.3f}\n")
    target = effect_file(root, key)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return f"{label}: already done"
    with os.fdopen(fd, "w") as effect:
        effect.write(label)
    time.sleep(seconds)
    return f"{label}: done"


def perform_once(label: str, seconds: float, ctx: ToolContext) -> str:
    """Perform a side effect once per idempotency key, then take ``seconds`` to answer.

    Args:
        label: What the effect is about (written to the logs).
        seconds: How long answering takes after performing the effect.
    """
    return perform(Path(os.environ[ENV_DIR]), ctx.idempotency_key, label, seconds)


@dataclass
class Gate:
    """Where calls of :func:`wait_at_gate` wait until the test opens it."""

    arrived: anyio.Event = field(default_factory=anyio.Event)  # a call is waiting
    opened: anyio.Event = field(default_factory=anyio.Event)
    calls: int = 0


#: the gates of the test running in this process, by name
GATES: dict[str, Gate] = {}


async def wait_at_gate(gate: str) -> str:
    """Wait until the test opens the gate (every call, once it is open, passes at once).

    Args:
        gate: The name of the gate.
    """
    waiting = GATES[gate]
    waiting.calls += 1
    waiting.arrived.set()
    await waiting.opened.wait()
    return f"through {gate}"


if __name__ == "__main__":
    arguments = json.load(sys.stdin)
    root, key = Path(os.environ[ENV_DIR]), os.environ["CORRAL_IDEMPOTENCY_KEY"]
    print(json.dumps(perform(root, key, arguments["label"], arguments.get("seconds", 0.0))))
