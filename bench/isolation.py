"""Section 7, isolation: what running a tool isolated costs per call.

One tool call, timed around the tool kind's own ``call`` (no governance, no
engine: what differs between the rows is only where the tool runs):

- ``exec, isolation none``: ``cat`` (a trivial program: it echoes the arguments,
  which come back as the JSON result) started per call as the server's user;
- ``exec, isolation sandbox``: the same program in a bubblewrap sandbox (a row
  saying why not where bubblewrap does not work here);
- ``wasm``: the example word-count module (``examples/tools/word_count.wasm``),
  compiled once when the tool is built, so every call runs a cached module;
- ``python, in-process``: a trivial Python function in a worker thread;
- ``python, isolation: process``: the same function in a worker subprocess of
  the tool's pool (forkserver), the arguments and result over a pipe.

Each round is a child process (``isolation.py --child``) that builds the tools,
makes a few untimed calls of each, then ``calls`` timed calls of each kind,
interleaved. p50 and p95 per round; the page shows their median over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import REPO, RESULT_MARK, fmt, median, percentile, run_child, spread, table

BENCH = Path(__file__).resolve().parent
#: the issue's targets
TARGET_SANDBOX_ADDS_MS = 15.0
TARGET_WASM_MS = 2.0
EXAMPLE_WASM = REPO / "examples" / "tools" / "word_count.wasm"

ROWS = (
    "exec, isolation none",
    "exec, isolation sandbox",
    "wasm (cached module)",
    "python, in-process",
    "python, isolation: process",
)


@dataclass(frozen=True)
class Config:
    """How much to measure."""

    rounds: int = 3
    calls: int = 200
    warmup: int = 10
    timeout: float = 300.0


def _tools() -> tuple[dict[str, Any], dict[str, str]]:
    """The tools of the rows that can be measured here, and why the others cannot."""
    from corral.resources.isolation import IsolationSpec
    from corral.resources.kinds import (
        ExecToolSpec,
        PythonToolSpec,
        ToolSpecModel,
        WasmToolSpec,
    )
    from corral.tools import exec as exec_tool
    from corral.tools import python as python_tool
    from corral.tools import wasm as wasm_tool
    from corral.tools.sandbox.host import SandboxHost

    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    tools: dict[str, Any] = {}
    missing: dict[str, str] = {}
    host = SandboxHost.from_env()
    for row, mode in (("exec, isolation none", "none"), ("exec, isolation sandbox", "sandbox")):
        probe = host.probe()
        if mode == "sandbox" and not probe.works:
            missing[row] = f"bubblewrap unavailable: {probe.reason}"
            continue
        block = ExecToolSpec(command=["cat"], isolation=IsolationSpec(mode=mode))
        spec = ToolSpecModel(type="exec", parameters=schema, exec=block)
        tools[row] = exec_tool.create("cat", spec, {}, sandbox_host=host)
    wasm = WasmToolSpec(module=str(EXAMPLE_WASM))
    tools["wasm (cached module)"] = wasm_tool.create(
        "word-count", ToolSpecModel(type="wasm", parameters=schema, wasm=wasm), {}
    )
    python = PythonToolSpec(function="bench_tools:add", path=str(BENCH))
    tools["python, in-process"] = python_tool.create(
        "add", ToolSpecModel(type="python", python=python), {}
    )
    in_process = PythonToolSpec(function="bench_tools:add", path=str(BENCH), isolation="process")
    tools["python, isolation: process"] = python_tool.create(
        "add", ToolSpecModel(type="python", python=in_process), {}
    )
    return tools, missing


ARGUMENTS = {
    "exec, isolation none": {"text": "hello big world"},
    "exec, isolation sandbox": {"text": "hello big world"},
    "wasm (cached module)": {"text": "hello big world"},
    "python, in-process": {"a": 17, "b": 25},
    "python, isolation: process": {"a": 17, "b": 25},
}


async def _child(calls: int, warmup: int) -> dict[str, Any]:
    from corral.tools.base import ToolContext

    tools, missing = _tools()
    with tempfile.TemporaryDirectory(prefix="corral-bench-isolation-") as tmp:
        ctx = ToolContext("run-1", "bench", "default", "call-1", "run-1:1:0", Path(tmp))
        for name, tool in tools.items():
            for _ in range(warmup):
                await tool.call(ARGUMENTS[name], ctx)
        ms: dict[str, list[float]] = {name: [] for name in tools}
        for _ in range(calls):
            for name, tool in tools.items():
                started = time.perf_counter()
                await tool.call(ARGUMENTS[name], ctx)
                ms[name].append(1000 * (time.perf_counter() - started))
        for tool in tools.values():
            await tool.aclose()
    return {
        "rows": {
            name: {"p50_ms": percentile(got, 50), "p95_ms": percentile(got, 95)}
            for name, got in ms.items()
        },
        "missing": missing,
    }


def run(config: Config, log: Any = print) -> dict[str, Any]:
    """``rounds`` child processes, each measuring every row."""
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in ROWS}
    status: dict[str, str] = dict.fromkeys(ROWS, "ok")
    errors: list[str] = []
    for index in range(config.rounds):
        child = run_child(
            [
                str(BENCH / "isolation.py"),
                "--child",
                f"--calls={config.calls}",
                f"--warmup={config.warmup}",
            ],
            timeout=config.timeout,
            env={"PYTHONPATH": str(BENCH) + os.pathsep + os.environ.get("PYTHONPATH", "")},
        )
        if not child.ok:
            errors.append(f"round {index + 1}: {child.error}")
            log(f"[isolation] round {index + 1} failed: {child.error}")
            continue
        for name, got in child.data["rows"].items():
            samples[name].append(got)
        for name, why in child.data["missing"].items():
            status[name] = why
    for name in ROWS:
        p50 = [s["p50_ms"] for s in samples[name]]
        log(
            f"[isolation] {name}: p50 {spread(p50, 2)} ms"
            if p50
            else f"[isolation] {name}: {status[name]}"
        )
    return {
        "rounds": config.rounds,
        "calls": config.calls,
        "target_sandbox_adds_ms": TARGET_SANDBOX_ADDS_MS,
        "target_wasm_ms": TARGET_WASM_MS,
        "samples": samples,
        "status": status,
        "errors": errors,
    }


def p50s(result: dict[str, Any], name: str) -> list[float]:
    """The p50 of each round of row ``name``, in milliseconds."""
    return [s["p50_ms"] for s in result["samples"].get(name, [])]


def sandbox_adds(result: dict[str, Any]) -> list[float]:
    """What the sandbox added to the exec call's p50, per round."""
    none = p50s(result, "exec, isolation none")
    boxed = p50s(result, "exec, isolation sandbox")
    return [b - n for n, b in zip(none, boxed, strict=False)]


def render(result: dict[str, Any]) -> str:
    """p50 and p95 per row, median (min-max) over rounds."""
    header = ["tool call", "p50 ms", "p95 ms", "beside exec, isolation none (p50)"]
    base = p50s(result, "exec, isolation none")
    rows = []
    for name in ROWS:
        got = result["samples"].get(name, [])
        if not got:
            why = result["status"].get(name, "failed")
            rows.append([name, why if why != "ok" else "failed", "", ""])
            continue
        p50 = [s["p50_ms"] for s in got]
        p95 = [s["p95_ms"] for s in got]
        beside = ""
        if base and name != "exec, isolation none":
            delta = median(p50) - median(base)
            beside = f"{'+' if delta >= 0 else '-'}{fmt(abs(delta), 2)} ms"
        rows.append([name, spread(p50, 2), spread(p95, 2), beside])
    text = table(header, rows)
    if result.get("errors"):
        text += "\n\nFailed rounds: " + "; ".join(result["errors"])
    return text


def main() -> None:
    import anyio

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", action="store_true", help="measure one round, print it")
    parser.add_argument("--calls", type=int, default=Config.calls)
    parser.add_argument("--warmup", type=int, default=Config.warmup)
    parser.add_argument("--rounds", type=int, default=Config.rounds)
    args = parser.parse_args()
    if args.child:
        data = anyio.run(_child, args.calls, args.warmup)
        print(RESULT_MARK + json.dumps(data), flush=True)
        return
    result = run(Config(rounds=args.rounds, calls=args.calls, warmup=args.warmup))
    print(render(result))


if __name__ == "__main__":
    sys.path.insert(0, str(BENCH))
    main()
