"""Section 4, start-up: whole ``corral`` processes, as a user's shell runs them.

Timed from spawn to exit (wall time), with each process's own peak RSS (from
GNU ``time``, see :func:`timed`); interleaved ``repeats`` times:

- ``python -c pass``: the interpreter alone, the floor under any Python CLI;
- ``corral --help``;
- ``corral run hello "hi"``: a scripted one-step agent (applied once, untimed,
  to a fresh ``CORRAL_HOME``): open the store, submit, claim, run, journal, print.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import spread, table

TARGET_HELP_MS = 300  # `corral --help` (the target)

AGENT = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: script}
spec:
  provider: scripted
  script:
    - {text: hello}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: hello}
spec: {model: script}
"""


@dataclass(frozen=True)
class Config:
    """How much to measure."""

    repeats: int = 10
    warm: bool = True  # one untimed run of each command first, so the page cache is warm


#: GNU time reports a child's peak RSS without inheriting ours (see :func:`timed`)
GNU_TIME = Path("/usr/bin/time")


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float | None]:
    """Run ``argv`` to its end; wall milliseconds, and its peak RSS in MiB when it can be known.

    A process's peak RSS starts from that of the process it was forked from
    (Linux carries the high-water mark across ``exec``), so spawning the command
    from this ~30 MB Python process would report at least ~30 MB for any of them.
    GNU ``time`` (a few MB) spawns it instead and reports its ``%M``; its own
    fork and exec add about a millisecond, the same for every command. Without
    it the RSS is not reported rather than reported wrong.
    """
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss, tempfile.TemporaryFile() as err:
        prefix = [str(GNU_TIME), "-f", "%M", "-o", rss.name] if GNU_TIME.exists() else []
        start = time.perf_counter()
        code = subprocess.call([*prefix, *argv], env=env, stdout=subprocess.DEVNULL, stderr=err)
        elapsed = 1000 * (time.perf_counter() - start)
        if code != 0:
            err.seek(0)
            message = err.read().decode(errors="replace").strip()
            raise RuntimeError(f"{' '.join(argv[:3])} exited {code}: {message[-300:]}")
        kib = rss.read().strip().splitlines()[-1:] if prefix else []
    return elapsed, int(kib[0]) / 1024 if kib and kib[0].isdigit() else None


def run(config: Config, log: Any = print) -> dict[str, Any]:
    """Time each command ``repeats`` times, interleaved."""
    corral = Path(sys.executable).parent / "corral"
    if not corral.exists():
        return {"repeats": config.repeats, "error": f"no corral executable beside {sys.executable}"}
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        env = {**os.environ, "CORRAL_HOME": tmp}
        env.pop("CORRAL_DB_URL", None)
        agent = Path(tmp) / "hello.yaml"
        agent.write_text(AGENT)
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "corral --help": [str(corral), "--help"],
            'corral run hello "hi"': [str(corral), "run", "hello", "hi"],
        }
        samples: dict[str, dict[str, list[float]]] = {
            name: {"ms": [], "rss_mb": []} for name in commands
        }
        errors: dict[str, str] = {}
        try:
            timed([str(corral), "apply", "-f", str(agent)], env)
        except RuntimeError as exc:
            errors['corral run hello "hi"'] = f"apply failed: {exc}"
        for name, argv in commands.items() if config.warm else ():
            if name not in errors:
                try:
                    timed(argv, env)
                except RuntimeError as exc:
                    errors[name] = str(exc)
        for _ in range(config.repeats):
            for name, argv in commands.items():
                if name in errors:
                    continue
                try:
                    ms, rss = timed(argv, env)
                except RuntimeError as exc:
                    errors[name] = str(exc)
                    continue
                samples[name]["ms"].append(ms)
                if rss is not None:
                    samples[name]["rss_mb"].append(rss)
    for name, got in samples.items():
        log(
            f"[startup] {name}: {spread(got['ms'], 0)} ms"
            if got["ms"]
            else f"[startup] {name}: {errors[name]}"
        )
    return {
        "repeats": config.repeats,
        "warm": config.warm,
        "target_help_ms": TARGET_HELP_MS,
        "samples": samples,
        "errors": errors,
    }


def render(result: dict[str, Any]) -> str:
    """Wall milliseconds and peak RSS per command, median (min-max)."""
    header = ["command", "wall ms", "peak RSS MB", "target"]
    if "error" in result:
        return table(header, [["corral", result["error"], "", ""]])
    rows = []
    for name, got in result["samples"].items():
        target = f"< {result['target_help_ms']} ms" if name == "corral --help" else ""
        if name in result["errors"]:
            rows.append([name, f"failed: {result['errors'][name]}", "", target])
        else:
            rss = spread(got["rss_mb"], 0) if got["rss_mb"] else "unknown (no /usr/bin/time)"
            rows.append([name, spread(got["ms"], 0), rss, target])
    return table(header, rows)
