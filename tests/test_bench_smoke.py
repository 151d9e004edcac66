"""The benchmark scripts run to the end in a tiny configuration and print their tables.

No timing is checked: the figures live in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def run_script(name: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(BENCH / name), *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.timeout(300)
def test_durable_overhead_script_prints_its_table() -> None:
    out = run_script(
        "durable_overhead.py", "--runs", "1", "--concurrency", "1,2", "--conversations", "2"
    )
    assert "| concurrency" in out
    assert "ratio" in out
    assert out.count("\n| ") >= 3  # header and one row per concurrency level


@pytest.mark.timeout(300)
def test_throughput_script_prints_its_table() -> None:
    out = run_script("throughput.py", "--runs", "1", "--tasks", "20", "--concurrency", "4")
    assert "submit -> succeeded" in out
    assert "tasks/s" in out
