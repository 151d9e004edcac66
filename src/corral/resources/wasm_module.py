"""The checks a ``wasm`` tool's module passes when the Tool is applied.

The module is a file on the machine that runs the tool, named by an absolute path
(``corral apply -f`` makes ``./x`` absolute against the YAML file). At apply it must
be a regular file no larger than :data:`MAX_MODULE_BYTES`, outside ``CORRAL_HOME``
and the kernel's file systems, and valid WebAssembly (checked with wasmtime when it
is importable). The tool kind checks it again when it builds the tool.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from corral.resources.isolation import FORBIDDEN_ROOTS, corral_home_from_env

__all__ = ["MAX_MODULE_BYTES", "module_problem", "wasm_problem"]

#: a larger module is refused at apply (a tool, not an application)
MAX_MODULE_BYTES = 32 * 1024 * 1024


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def wasm_problem(wasm: bytes) -> str | None:
    """Why ``wasm`` is not a WebAssembly module wasmtime accepts, or ``None``.

    The reason never quotes the file (wasmtime's own message shows its first bytes).
    """
    if not wasm.startswith(b"\0asm"):
        return "not a valid WebAssembly module: it does not start with the '\\0asm' header"
    try:
        import wasmtime  # not at the top: `corral --help` never needs it
    except ImportError:  # pragma: no cover - a dependency; the tool kind says so when built
        return None
    try:
        wasmtime.Module.validate(wasmtime.Engine(), wasm)
    except wasmtime.WasmtimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid"
        return f"not a valid WebAssembly module: {first}"
    return None


def module_problem(
    path: str, corral_home: Path | None = None, *, validate: bool = True
) -> str | None:
    """Why ``path`` cannot be a ``wasm`` tool's module, or ``None`` when it can.

    ``validate=False`` skips the WebAssembly check (the tool kind compiles the module,
    which checks it anyway).
    """
    if "\0" in path or not PurePosixPath(path).is_absolute():
        return f"{path!r} must be an absolute path"
    try:
        return _file_problem(path, corral_home, validate)
    except (OSError, RuntimeError) as exc:  # too long, a symlink loop, unreadable
        return f"{path!r} cannot be read: {getattr(exc, 'strerror', None) or exc}"


def _file_problem(path: str, corral_home: Path | None, validate: bool) -> str | None:
    real = Path(path).resolve()  # a symlink is judged by what it points to
    for forbidden in FORBIDDEN_ROOTS:
        if _within(real, Path(forbidden)):
            return f"{path!r} is under {forbidden}, which is no module"
    home = (corral_home or corral_home_from_env()).resolve()
    if _within(real, home):
        return f"{path!r} is inside CORRAL_HOME (its keys, tokens and database)"
    if not real.is_file():
        return f"{path!r} is not a file"
    size = os.path.getsize(real)
    if size > MAX_MODULE_BYTES:
        return f"{path!r} is {size} bytes, more than a module may be ({MAX_MODULE_BYTES})"
    return wasm_problem(real.read_bytes()) if validate else None
