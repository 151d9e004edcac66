"""The benchmark harness runs end to end in its ``--quick`` configuration.

No figure is checked (they live in ``docs/benchmarks.md``, from a real run):
only that every section produces its rows, that Corral's rows were measured,
and that peer frameworks missing from this environment (Corral's own ``.venv``
has none) are reported as not installed rather than failing the run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.timeout(300)
def test_quick_benchmark_run_produces_every_section(tmp_path: Path) -> None:
    results_file, page = tmp_path / "results.json", tmp_path / "benchmarks.md"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "run.py"),
            "--quick",
            f"--json={results_file}",
            f"--write-docs={page}",
        ],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(results_file.read_text())

    rows = {(row["name"], row["level"]): row for row in results["overhead"]["rows"]}
    for name in ("floor", "corral", "corral-worker"):
        for level in results["overhead"]["levels"]:
            assert rows[name, level]["status"] == "ok", rows[name, level]
            assert rows[name, level]["ms_per_call"], rows[name, level]
    for (name, _), row in rows.items():
        assert row["status"] == "ok" or row["status"].startswith("not installed"), (name, row)

    assert results["throughput"]["samples"]["corral-sqlite"], results["throughput"]
    assert results["scale"]["samples"], results["scale"]
    startup = results["startup"]["samples"]
    assert startup["corral --help"]["ms"] and startup['corral run hello "hi"']["ms"], startup
    http = results["http"]
    assert http["samples"] and not http["errors"], http
    assert [row["concurrency"] for row in http["samples"][0]["submit"]] == http["concurrency"]
    fan_out = http["samples"][0]["sse_fan_out"]
    assert [f["followers"] for f in fan_out] == http["followers"], fan_out
    assert all(f["events"] > 0 for f in fan_out), fan_out

    # SQLite is always there; PostgreSQL + NATS rows are measured, or say why not
    scaleout = results["scaleout"]
    assert scaleout["samples"]["sqlite-1"], scaleout
    for key, status in scaleout["status"].items():
        assert status == "ok" or "not reachable" in status, (key, status)
        if status == "ok":
            (sample,) = scaleout["samples"][key]
            assert sample["drain_per_s"] > 0, sample
            assert len(sample["execution_ms"]) == scaleout["latency_runs"], sample

    isolation = results["isolation"]
    assert isolation["samples"]["exec, isolation none"], isolation
    assert isolation["samples"]["wasm (cached module)"], isolation
    assert isolation["samples"]["python, isolation: process"], isolation

    multiagent = results["multiagent"]
    assert not multiagent["errors"], multiagent
    for row in ("plain", "boss", "fan-1", "fan-10"):
        [sample] = multiagent["samples"][row]
        assert 0 < sample["p50_ms"] <= sample["p95_ms"], (row, sample)
    systems = multiagent["systems"]
    assert systems["samples"]["sqlite-1"], systems
    for key, status in systems["status"].items():
        assert status == "ok" or "not reachable" in status, (key, status)
        if status == "ok":
            (sample,) = systems["samples"][key]
            assert sample["systems_per_s"] > 0, sample
            assert len(sample["latency_ms"]) == systems["latency_runs"], sample
    (sqlite_systems,) = systems["samples"]["sqlite-1"]
    # the system run and its 4 node runs: at least their submits and saves are commits
    assert sqlite_systems["commits_per_system"] >= 10, sqlite_systems
    assert "System runs" in proc.stdout and "system runs/s" in page.read_text()
    memory = results["memory"]
    sqlite = memory["samples"]["corral, SQLite@200"]
    assert sqlite["ingest_per_s"] > 0 and sqlite["p50_ms"] > 0, memory
    assert memory["status"]["chromadb"] == "ok" or "not installed" in memory["status"]["chromadb"]

    headings = (
        "Agent-loop overhead",
        "Task throughput",
        "Scale",
        "Start-up",
        "HTTP API",
        "Scale-out",
        "Isolation",
        "Multi-agent",
        "Memory",
        "Targets",
    )
    for heading in headings:
        assert heading in proc.stdout
    text = page.read_text()
    assert "## Targets" in text and "## Where and when" in text and "--quick" in text


def test_rendering_saved_results_measures_nothing(tmp_path: Path) -> None:
    """``--from-json`` re-renders the page from saved figures (how a run's page is rebuilt)."""
    meta = {
        "date": "today",
        "commit": "abc1234",
        "machine": {
            "cpu": "cpu",
            "cores": "2",
            "memory": "1 GiB",
            "os": "os",
            "python": "CPython",
            "sqlite": "3",
            "host": "h",
        },
        "versions": {"corral": "0.1.0"},
        "quick": False,
        "note": "",
        "load": {},
        "disk_commits_per_s": [],
    }
    startup = {
        "repeats": 2,
        "target_help_ms": 300,
        "samples": {"corral --help": {"ms": [200.0, 400.0], "rss_mb": [30.0, 31.0]}},
        "errors": {},
    }
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps({"meta": meta, "startup": startup}))
    page = tmp_path / "page.md"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "run.py"), f"--from-json={saved}", f"--write-docs={page}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    flat = " ".join(page.read_text().split())  # the table's padding aside
    # "under 300 ms" is strict: a median of exactly 300 ms does not meet it
    assert "`corral --help` under 300 ms | 300 (200-400) ms | **not met**" in flat
    assert "HTTP API" not in flat  # saved results without the section render without it
