"""Functions of ``python`` tools for the tests of ``isolation: sandbox``: what a tool's
function reaches, and what it does to the answer's framing.

Importing this module records that it was imported in ``sys.modules``' own marker, so a
test can tell whether the server imported it.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from corral.tools.base import ToolContext

IMPORTED_MARKER = "corral_tests_reach_was_imported"
setattr(sys.modules[__name__], IMPORTED_MARKER, True)
print('{"ok": "forged at import"}')  # stdout at import: must not become the answer


def read(paths: list[str]) -> dict[str, str]:
    """Per path, ``read`` or the error's name."""
    found: dict[str, str] = {}
    for path in paths:
        try:
            with open(path, "rb") as f:
                f.read(16)
            found[path] = "read"
        except OSError as exc:
            found[path] = type(exc).__name__
    return found


def environment(names: list[str]) -> dict[str, str | None]:
    """The values of those environment variables (null: unset)."""
    return {name: os.environ.get(name) for name in names}


def where(ctx: ToolContext) -> dict[str, Any]:
    """What the call's context says, and who and where the function runs."""
    return {"run_id": ctx.run_id, "workspace": str(ctx.workspace), "pid": os.getpid()}


def forge(text: str) -> str:
    """Print a forged answer on stdout, then answer ``text``."""
    print('{"ok": "forged"}')
    sys.stdout.flush()
    return text


def spin(seconds: float = 3600.0) -> str:
    """Run (synchronously, ignoring any timeout) for ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass
    return "done"


def fail(reason: str) -> str:
    """Raise ValueError(reason)."""
    raise ValueError(reason)


def vanish() -> str:
    """End the process at once, answering nothing."""
    os._exit(3)


def odd_code() -> str:
    """Raise a ToolError whose code Corral does not know."""
    from corral.core.errors import ToolError

    raise ToolError("made_up_code", "a code of its own", details={"x": 1})
