"""The program a sandboxed ``python`` tool runs in its sandbox, once per call.

Started with ``python -I`` by :mod:`corral.tools.python_sandbox`, which puts the
directory the server imports ``corral`` from first on ``sys.path``. It reads one request as JSON on stdin: the
Tool's spec (its ``python`` block with ``isolation: none`` and the directory to
import from as ``path``) and either ``"describe": true`` (answer the description
and the JSON Schema the function's signature gives) or the call's ``arguments`` and
``context``. It writes one JSON answer on its stdout, ``{"ok": value}`` or
``{"error": {"code", "reason", "retryable", "details"}}``; what the function prints
goes to stderr, so it cannot forge the answer's framing.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    from corral.core.errors import CorralError, ToolError, ToolErrorCode
    from corral.resources.kinds import ToolSpecModel
    from corral.tools import python as python_tool
    from corral.tools.base import ToolContext

    name = str(request["name"])
    try:
        spec = ToolSpecModel.model_validate(request["spec"], context={"stored": True})
        tool = python_tool.create(name, spec, {})
    except CorralError as exc:
        return {"error": {"code": "configuration_error", "reason": str(exc)}}
    if request.get("describe"):
        return {"ok": {"description": tool.spec.description, "parameters": tool.spec.parameters}}
    context = dict(request["context"])
    ctx = ToolContext(**{**context, "workspace": Path(context["workspace"])})
    try:
        return {"ok": asyncio.run(tool.call(dict(request["arguments"]), ctx))}
    except ToolError as exc:
        info = exc.info
        error = {"code": info.code, "reason": info.reason, "retryable": info.retryable}
        return {"error": {**error, "details": info.details}}
    except Exception as exc:  # noqa: BLE001 - reported as the call's failure
        reason = f"{type(exc).__name__}: {exc}"
        return {"error": {"code": ToolErrorCode.EXECUTION_FAILED.value, "reason": reason}}


def main(stdin: TextIO = sys.stdin) -> int:
    """Answer one request; see the module docstring."""
    answer_fd = os.dup(1)
    os.dup2(2, 1)  # the function's prints, and its children's, go to stderr
    sys.stdout = sys.stderr
    request = json.load(stdin)
    answer = _answer(request)
    with os.fdopen(answer_fd, "w", encoding="utf-8") as out:
        out.write(json.dumps(answer, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
