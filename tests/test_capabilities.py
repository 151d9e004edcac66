"""What the machine offers, through both front doors: ``GET /v1/capabilities`` (any
authenticated caller, nothing of CORRAL_HOME in it) and ``corral doctor``."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

from corral.core.tokens import Role
from corral.store.sql.vectors import sqlite_vector_index
from corral.tools.sandbox.host import SandboxHost
from server_harness import LiveServer


def test_any_role_may_read_the_capabilities_and_they_name_no_path_of_corral_home(
    server: LiveServer,
) -> None:
    expected = SandboxHost.from_env().probe()
    for role in (Role.VIEWER, Role.OPERATOR, Role.ADMIN):
        with server.client(server.mint("default", role)) as client:
            response = client.get("/v1/capabilities")
        assert response.status_code == 200, response.text
        body = response.json()
        assert str(server.home) not in response.text
        assert body["sandbox"]["bubblewrap"] is expected.works
        assert body["sandbox"]["auto_mode"] == ("sandbox" if expected.works else "none")
        assert body["wasmtime"] is True  # a dependency since WASM tools
        assert body["wasmtime_version"] == importlib.metadata.version("wasmtime")
        assert set(body["providers"]) >= {"llama-cpp"}
        assert body["store"] == {"kind": "sqlite", "configured": True, "reachable": True}
        assert body["bus"]["configured"] is False
        assert body["memory_vectors"] == sqlite_vector_index()


def test_without_a_token_the_capabilities_are_401(server: LiveServer) -> None:
    with server.client() as anonymous:
        response = anonymous.get("/v1/capabilities")
    assert response.status_code == 401
    assert "sandbox" not in response.text


def test_doctor_reports_the_sandbox_and_an_unreachable_bus(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(
        CORRAL_HOME=str(tmp_path / "home"),
        CORRAL_NATS_URL="nats://user:hunter2@127.0.0.1:1",  # nothing listens on port 1
    )
    done = subprocess.run(
        [sys.executable, "-m", "corral", "doctor", "-o", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["sandbox"]["bubblewrap"] is SandboxHost.from_env().probe().works
    assert body["bus"] == {"kind": "nats", "configured": True, "reachable": False}
    assert body["store"] == {"kind": "sqlite", "configured": True, "reachable": True}
    assert "hunter2" not in done.stdout and str(tmp_path) not in done.stdout
    assert body["memory_vectors"] == sqlite_vector_index()
    table = subprocess.run(
        [sys.executable, "-m", "corral", "doctor"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert table.stdout.splitlines()[0].startswith("sandbox")
    assert "bus" in table.stdout and "Traceback" not in table.stderr
    assert any(
        line.startswith("memory vectors") and line.endswith(sqlite_vector_index())
        for line in table.stdout.splitlines()
    )
