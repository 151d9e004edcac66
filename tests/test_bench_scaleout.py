"""``bench/scaleout.py`` still runs: a tiny configuration, every row measured, none failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from databases import PostgresServer
from nats_servers import nats_server_url_fixture

__all__ = ["nats_server_url_fixture"]

SCRIPT = Path(__file__).parent.parent / "bench" / "scaleout.py"


def test_the_scaleout_benchmark_measures_every_configuration(
    tmp_path: Path, postgres: PostgresServer, nats_server_url: str
) -> None:
    out = tmp_path / "figures.json"
    argv = [sys.executable, str(SCRIPT), "--tasks", "20", "--latency-runs", "2"]
    argv += ["--workers", "1", "--concurrency", "4", "--postgres-alone", "--timeout", "60"]
    argv += ["--postgres-url", postgres.base_url.render_as_string(hide_password=False)]
    argv += ["--nats-url", nats_server_url, "--json", str(out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [(r["name"], r["workers"]) for r in rows] == [
        ("sqlite", 1),
        ("postgres", 1),
        ("nats", 1),
    ]
    for row in rows:
        assert row["error"] is None, row
        assert row["drain_per_s"] > 0 and row["submit_per_s"] > 0
        assert len(row["dispatch_ms"]) == len(row["execution_ms"]) == 2
    assert "| PostgreSQL + NATS | 1 |" in done.stdout
