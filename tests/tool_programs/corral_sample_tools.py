"""Functions used as ``python`` tools by the tests (imported through ``spec.python.path``)."""

from __future__ import annotations

import threading

import anyio
from pydantic import BaseModel

from corral.tools.base import ToolContext


class Point(BaseModel):
    x: float
    y: float


def add(a: int, b: int = 2) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number,
            defaulting to two
    """
    return a + b


async def greet(name: str, ctx: ToolContext) -> dict[str, str]:
    """Greet someone from a run."""
    await anyio.sleep(0)
    return {"greeting": f"hello {name}", "run": ctx.run_id, "agent": ctx.agent}


def where_am_i() -> str:
    """The name of the thread the function runs in."""
    return threading.current_thread().name


def norm(point: Point) -> dict[str, object]:
    """The L1 norm of a point (receives a real ``Point``)."""
    return {"type": type(point).__name__, "norm": abs(point.x) + abs(point.y)}


def explode(reason: str) -> None:
    """Always fails."""
    raise ValueError(reason)


#: set by a test to let every blocked :func:`slow` call end at once
released = threading.Event()
#: set by :func:`slow` when a call ends
finished = threading.Event()


def slow(seconds: float) -> str:
    """Block the calling thread for ``seconds``, or until a test sets :data:`released`."""
    released.wait(seconds)
    finished.set()
    return "finished"


def echo(text: str, ctx: ToolContext) -> dict[str, str]:
    """The text, and the idempotency key of the call."""
    return {"text": text, "idempotency_key": ctx.idempotency_key}


def flood(size: int) -> str:
    """``size`` bytes of output."""
    return "x" * size


def loose(**kwargs: object) -> dict[str, object]:
    """Takes anything; needs explicit parameters."""
    return dict(kwargs)


NOT_CALLABLE = 42
