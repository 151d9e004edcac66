"""``python: {isolation: sandbox}``: a tool's function run in a subprocess inside the sandbox.

An in-process python tool is the server: it reads what the server reads (``CORRAL_HOME``
with its secret key and tokens, the server's environment) and a timed-out synchronous
call keeps running. Here nothing of the function runs in the server, not even its
import: each call starts :mod:`corral.tools.python_runner` with the server's Python in
a bubblewrap sandbox (as an ``exec`` tool's program runs, with its limits, workspace
and process-tree clean-up), which imports the function, validates the arguments, calls
it and answers in JSON; a timeout or cancellation kills its whole process tree. The
sandbox shows, read-only, the server's interpreter and the packages it runs on
(``sys.prefix``, the base interpreter, the directory ``corral`` is imported from) and
the directory the function's module is imported from (the Tool's ``path``, else where
the server's ``sys.path`` finds its top-level package); never ``CORRAL_HOME``.

Without ``parameters`` the JSON Schema comes from a first run in the sandbox at
build (``describe``), kept per process by the Tool's spec. Where bubblewrap does not
work every call fails closed with ``isolation_unavailable``.
"""

from __future__ import annotations

import importlib.machinery
import json
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from corral.core.errors import ConfigurationError, ToolError, ToolErrorCode
from corral.core.messages import ToolSpec
from corral.resources.isolation import IsolationSpec, bind_problem
from corral.resources.kinds import ExecToolSpec, ToolSpecModel
from corral.tools.base import Tool, ToolContext
from corral.tools.exec import ExecTool
from corral.tools.naming import model_tool_name
from corral.tools.sandbox.bwrap import SYSTEM_DIRS
from corral.tools.sandbox.host import SandboxHost
from corral.tools.sandbox.policy import Isolation, Sandboxed, Unavailable

__all__ = ["RUNNER", "SandboxedPythonTool", "create", "shown_directories"]

#: the module the sandbox runs
RUNNER = "corral.tools.python_runner"
#: how it is started: ``corral`` imported from where the server imports it (shown read-only),
#: whatever the interpreter's own ``sys.path`` says (``-I``: no environment, no user site)
_BOOT = f"import sys; sys.path.insert(0, sys.argv.pop(1)); import {RUNNER} as r; sys.exit(r.main())"
_described: dict[str, dict[str, Any]] = {}
_described_lock = threading.Lock()


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def module_root(function: str, path: str | None) -> Path | None:
    """The directory the function's module is imported from, found without importing it."""
    if path is not None:
        return Path(path).resolve()
    top = function.partition(":")[0].split(".")[0]
    found = importlib.machinery.PathFinder.find_spec(top, sys.path)
    if found is None:
        return None  # built in, or absent: the sandbox's import says so
    if found.submodule_search_locations:
        return Path(next(iter(found.submodule_search_locations))).resolve().parent
    return Path(found.origin).resolve().parent if found.origin else None


def _corral_root() -> Path:
    """The directory ``corral`` is imported from."""
    import corral

    return Path(corral.__file__).resolve().parent.parent


def shown_directories(function: str, path: str | None) -> list[Path]:
    """What the sandbox shows read-only beyond the system's directories (see the module)."""
    candidates = [
        Path(sys.prefix),
        Path(sys.base_prefix),
        _corral_root(),
        module_root(function, path),
    ]
    shown: list[Path] = []
    for candidate in candidates:
        if candidate is None:
            continue
        resolved = candidate.resolve()
        roots = [*map(Path, SYSTEM_DIRS), *shown]
        if not any(_within(resolved, root) for root in roots):
            shown.append(resolved)
    return shown


class SandboxedPythonTool(Tool):
    """A python Tool whose calls run in a sandboxed subprocess; see the module docstring."""

    def __init__(
        self, name: str, spec: ToolSpecModel, inner: dict[str, Any], runner: ExecTool
    ) -> None:
        self.ref = name
        self.spec = runner.spec
        self.idempotent = spec.idempotent
        self.isolation = runner.isolation
        self._inner = inner
        self._runner = runner

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        view = self.isolation.view(ctx.workspace.resolve())
        context = {
            "run_id": ctx.run_id,
            "agent": ctx.agent,
            "namespace": ctx.namespace,
            "call_id": ctx.call_id,
            "idempotency_key": ctx.idempotency_key,
            "workspace": view.workspace,
        }
        request = {"name": self.ref, "spec": self._inner, "arguments": arguments}
        return await _request(self._runner, {**request, "context": context}, ctx)


async def _request(runner: ExecTool, request: dict[str, Any], ctx: ToolContext) -> Any:
    stdout = await runner.run(json.dumps(request).encode("utf-8"), ctx)
    try:
        answer = json.loads(stdout)
    except ValueError:
        answer = None
    if isinstance(answer, dict) and "ok" in answer:
        return answer["ok"]
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("reason"), str):
        raise ToolError(
            ToolErrorCode.EXECUTION_FAILED,
            f"{runner.ref}: the sandboxed function gave no answer",
        )
    code = str(error.get("code"))
    if code == "configuration_error":
        raise ConfigurationError(error["reason"])
    known = code in ToolErrorCode.__members__.values()
    details = error.get("details")
    raise ToolError(
        code if known else ToolErrorCode.EXECUTION_FAILED,
        error["reason"],
        retryable=error.get("retryable") is True,
        details=details if isinstance(details, dict) else None,
    )


def _isolation(
    name: str, function: str, path: str | None, isolation: IsolationSpec, host: SandboxHost
) -> Isolation:
    probe = host.probe()
    if not probe.works or probe.path is None:
        return Unavailable(isolation.limits, host, probe.reason)
    shown = shown_directories(function, path)
    for directory in shown:
        problem = bind_problem(str(directory), host.corral_home, [directory])
        if problem is not None:
            raise ConfigurationError(
                f"Tool {name!r}: the sandbox cannot show {str(directory)!r}: {problem}; give "
                "the tool a 'path' of its own, outside CORRAL_HOME"
            )
    return Sandboxed(isolation, host, probe.path, read_only=shown)


async def create(
    name: str,
    spec: ToolSpecModel,
    *,
    isolation: IsolationSpec | None = None,
    sandbox_host: SandboxHost | None = None,
) -> Tool:
    """Build a sandboxed ``python`` Tool (the schema from the sandbox when not declared).

    ``isolation`` is the sandbox's (default: a sandbox with no network, the workspace
    read-write, the default limits).
    """
    if spec.python is None:
        raise ConfigurationError(f"Tool {name!r}: type 'python' needs a 'python' block")
    host = sandbox_host if sandbox_host is not None else SandboxHost.from_env()
    sandbox = (isolation or IsolationSpec()).model_copy(update={"mode": "sandbox"})
    root = module_root(spec.python.function, spec.python.path)
    python = spec.python.model_copy(
        update={"isolation": "none", "inline": False, "path": str(root) if root else None}
    )
    inner = spec.model_copy(update={"python": python}).model_dump(mode="json")
    command = [sys.executable, "-I", "-c", _BOOT, str(_corral_root())]
    runner_spec = ToolSpecModel(
        type="exec",
        description=spec.description,
        parameters=spec.parameters or {"type": "object"},
        idempotent=spec.idempotent,
        exec=ExecToolSpec(command=command, isolation=sandbox),
    )
    runner = ExecTool(
        name, runner_spec, sys.executable, {}, _isolation(name, *_where(spec), sandbox, host)
    )
    if spec.parameters is None and not isinstance(runner.isolation, Unavailable):
        described = await _describe(name, inner, runner)
        runner.spec = ToolSpec(
            model_tool_name(name), described["description"], described["parameters"]
        )
    return SandboxedPythonTool(name, spec, inner, runner)


def _where(spec: ToolSpecModel) -> tuple[str, str | None]:
    assert spec.python is not None
    return spec.python.function, spec.python.path


async def _describe(name: str, inner: dict[str, Any], runner: ExecTool) -> dict[str, Any]:
    """The description and parameters the sandbox derives (once per process and spec)."""
    key = json.dumps(inner, sort_keys=True)
    with _described_lock:
        known = _described.get(key)
    if known is not None:
        return known
    with tempfile.TemporaryDirectory(prefix="corral-describe-") as workspace:
        ctx = ToolContext("build", "build", "build", "describe", "describe", Path(workspace))
        try:
            described = await _request(runner, {"name": name, "spec": inner, "describe": True}, ctx)
        except ToolError as exc:
            raise ConfigurationError(
                f"Tool {name!r}: its schema could not be read in the sandbox: {exc.info.reason}"
            ) from exc
    if (
        not isinstance(described, dict)
        or not isinstance(described.get("parameters"), dict)
        or not isinstance(described.get("description"), str)
    ):
        raise ConfigurationError(f"Tool {name!r}: the sandbox described no parameters")
    with _described_lock:
        _described[key] = described
    return described
