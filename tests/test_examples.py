"""Every folder of ``examples/`` runs as its README says, through the real ``corral``.

Each test applies one example into a store of its own and runs the commands of its
README in ``corral`` processes (``python -m corral``) from the repository root, asserting
on what they print: an example that rots fails here. One more applies every YAML document
of ``examples/`` into one store (the names are distinct across the examples), and one
checks that each example folder has a README and a test in this module.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from corral.tools.sandbox.policy import private_parent
from sandboxing import require_bwrap, sandbox_host

ROOT = Path(__file__).parent.parent
EXAMPLES = ROOT / "examples"
CORRAL = [sys.executable, "-m", "corral"]
#: the example folders, each tested below (test_every_example_folder_is_tested)
FOLDERS = (
    "agent-system",
    "approvals",
    "http-tools",
    "linked-agents",
    "mcp-stdio",
    "memory",
    "roles",
    "sandboxed-exec",
    "tenant-policy",
    "wasm",
)
#: how long one ``corral`` command may take (a process start and a short scripted run)
COMMAND_SECONDS = 60


def environment(root: Path) -> dict[str, str]:
    """A newcomer's environment: a store of its own, no context, no remote server; in a
    clone other users may not enter, the one setting examples/README.md names for it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "XDG_"))}
    env.update(
        CORRAL_HOME=str(root / "home"),
        XDG_CONFIG_HOME=str(root / "config"),
        XDG_STATE_HOME=str(root / "state"),
        NO_COLOR="1",
    )
    if private_parent(EXAMPLES) is not None or private_parent(root) is not None:
        env["CORRAL_SANDBOX_ALLOWED_PATHS"] = f"{EXAMPLES}:{root}"
    return env


def corral(
    root: Path,
    *args: str,
    check: int | None = 0,
    input: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``corral ARGS`` from the repository root, with ``check`` as the expected exit code
    (``env``: variables the example's README sets)."""
    proc = subprocess.run(
        [*CORRAL, *args],
        cwd=ROOT,
        env={**environment(root), **(env or {})},
        input=input,
        capture_output=True,
        text=True,
        timeout=COMMAND_SECONDS,
    )
    if check is not None:
        assert proc.returncode == check, (args, proc.returncode, proc.stdout, proc.stderr)
    return proc


def task(root: Path, run_id: str) -> dict[str, object]:
    record: dict[str, object] = json.loads(
        corral(root, "tasks", "get", run_id, "-o", "json").stdout
    )
    return record


def test_every_example_folder_has_a_readme_and_is_tested() -> None:
    folders = sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir() and p.name != "tools")
    assert folders == sorted(FOLDERS)
    tested = {n for n in globals() if n.startswith("test_")}
    for folder in FOLDERS:
        readme = (EXAMPLES / folder / "README.md").read_text()
        assert f"examples/{folder}/" in readme, folder  # its commands name the folder
        assert f"test_{folder.replace('-', '_')}" in tested, folder
        assert f"[{folder}/]({folder}/)" in (EXAMPLES / "README.md").read_text(), folder


def test_every_example_document_applies_into_one_store(tmp_path: Path) -> None:
    """What the quickstart's `corral apply -f examples/` does: every document of every
    example, in one store, without a name colliding."""
    documents = sum(
        1
        for path in EXAMPLES.rglob("*.yaml")
        for document in path.read_text().split("\n---\n")
        if "apiVersion:" in document
    )
    applied = corral(tmp_path, "apply", "-f", "examples/").stdout.splitlines()
    assert len(applied) == documents, applied
    assert all(line.endswith(" created") for line in applied), applied
    # applied again: nothing changes
    again = corral(tmp_path, "apply", "-f", "examples/").stdout.splitlines()
    assert all(line.endswith(" unchanged") for line in again), again


def test_linked_agents(tmp_path: Path) -> None:
    corral(tmp_path, "apply", "-f", "examples/linked-agents/")
    boss = corral(tmp_path, "run", "boss", "add 2 and 3")
    assert boss.stdout.strip() == "The adder says 5."
    assert "⇢ adder" in boss.stderr and "⇠ adder succeeded" in boss.stderr

    triage = corral(tmp_path, "run", "triage", "what do I owe?")
    assert triage.stdout.strip() == "Your invoice INV-7 is 42 EUR, due on the 1st."
    assert "⇒ billing handoff from triage: a question about an invoice" in triage.stderr

    tasks = json.loads(corral(tmp_path, "tasks", "list", "-o", "json").stdout)
    assert sorted((t["agent"], t["active_agent"], t["state"]) for t in tasks) == [
        ("adder", None, "succeeded"),
        ("boss", None, "succeeded"),
        ("triage", "billing", "succeeded"),
    ]
    (parent,) = [t for t in tasks if t["agent"] == "boss"]
    tree = corral(tmp_path, "tasks", "tree", parent["id"]).stdout
    assert "boss" in tree and "adder" in tree


def test_agent_system(tmp_path: Path) -> None:
    corral(tmp_path, "apply", "-f", "examples/agent-system/")
    run = corral(tmp_path, "systems", "run", "report", "write about otters")
    assert run.stdout.strip().endswith(
        "Sea otters hold hands while they sleep, so they do not drift apart."
    )
    tasks = json.loads(corral(tmp_path, "tasks", "list", "-o", "json").stdout)
    assert sorted(t["agent"] for t in tasks if t["agent"] != "report") == [
        "critic",
        "planner",
        "researcher",
        "writer",
    ]
    assert {t["state"] for t in tasks} == {"succeeded"}
    # the writer ran once, on the join of both branches
    (writer,) = [t for t in tasks if t["agent"] == "writer"]
    joined = json.loads(str(task(tmp_path, str(writer["id"]))["input"]))
    assert [i["from"] for i in joined["inputs"]] == ["critic", "researcher"]


def test_memory(tmp_path: Path) -> None:
    corral(tmp_path, "apply", "-f", "examples/memory/")
    wrote = corral(
        tmp_path, "run", "note-taker", "remember: we deploy on Thursdays, never on Fridays"
    )
    assert wrote.stdout.strip() == "Noted."
    found = corral(tmp_path, "run", "note-finder", "when do we deploy?")
    assert found.stdout.strip() == "The notes say: we deploy on Thursdays, never on Fridays."
    assert "deploy-day" in found.stderr  # the search's result, as the model got it
    listed = corral(tmp_path, "memory", "list", "team-notes").stdout
    assert "deploy-day" in listed and "Thursdays" in listed


def test_mcp_stdio(tmp_path: Path) -> None:
    corral(tmp_path, "apply", "-f", "examples/mcp-stdio/")
    run = corral(tmp_path, "run", "shouter", "shout hello")
    assert run.stdout.strip() == "The server shouted back: HELLO FROM MCP!"
    assert "HELLO FROM MCP!" in run.stderr.replace(run.stdout, "")
    # the server alone, as the README shows it
    alone = subprocess.run(
        ["python3", "examples/mcp-stdio/notes_server.py"],
        cwd=ROOT,
        input='{"jsonrpc":"2.0","id":1,"method":"tools/list"}\n',
        capture_output=True,
        text=True,
        timeout=COMMAND_SECONDS,
        check=True,
    )
    assert json.loads(alone.stdout)["result"]["tools"][0]["name"] == "shout"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_http_tools(tmp_path: Path) -> None:
    # The README's port, 8765, may be taken on a test machine: the example runs on a free
    # one, its YAML changed to match and nothing else.
    port = free_port()
    folder = tmp_path / "http-tools"
    shutil.copytree(EXAMPLES / "http-tools", folder)
    agent = folder / "agent.yaml"
    assert "127.0.0.1:8765" in agent.read_text()
    agent.write_text(agent.read_text().replace("127.0.0.1:8765", f"127.0.0.1:{port}"))
    server = subprocess.Popen(
        ["python3", str(folder / "weather_server.py"), str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip() == f"listening on http://127.0.0.1:{port}"
        corral(tmp_path, "apply", "-f", str(folder))
        # without the operator's allow-list the loopback address stays refused
        blocked = corral(tmp_path, "run", "forecaster", "weather in Paris?", check=None)
        assert "CORRAL_ALLOWED_PRIVATE_DESTINATIONS" in blocked.stderr, blocked.stderr
        allowed = {"CORRAL_ALLOWED_PRIVATE_DESTINATIONS": "127.0.0.1"}
        run = corral(tmp_path, "run", "forecaster", "weather in Paris?", env=allowed)
        assert run.stdout.strip() == "Paris: sunny, 21 °C."
        assert '"forecast": "sunny"' in run.stderr
        seen = server.stdout.readline()
        assert re.match(r"call for 'Paris': Idempotency-Key \S+, run run_\w+", seen), seen
    finally:
        server.terminate()
        server.communicate(timeout=10)

    # without allow_private, apply refuses the loopback url
    agent.write_text(agent.read_text().replace("allow_private: true", "allow_private: false"))
    refused = corral(tmp_path, "apply", "-f", str(agent), check=2)
    assert "spec.http.url" in refused.stderr


def wait_for_state(root: Path, run_id: str, state: str) -> dict[str, object]:
    deadline = time.monotonic() + COMMAND_SECONDS
    while True:
        record = task(root, run_id)
        if record["state"] == state or time.monotonic() > deadline:
            assert record["state"] == state, record
            return record
        time.sleep(0.2)


def test_approvals(tmp_path: Path) -> None:
    corral(tmp_path, "apply", "-f", "examples/approvals/")
    waiting = corral(tmp_path, "run", "refunds", "refund order A-1001", check=3)
    approval = re.search(r"approve: corral approvals approve (\S+)", waiting.stderr)
    assert approval is not None, waiting.stderr
    assert "refund-issue" in waiting.stderr and "A-1001" in waiting.stderr
    (listed,) = json.loads(corral(tmp_path, "approvals", "list", "-o", "json").stdout)
    assert listed["id"] == approval[1] and listed["tool"] == "refund-issue"
    run_id = str(listed["run_id"])

    corral(tmp_path, "approvals", "approve", approval[1])
    worker = subprocess.Popen(
        [*CORRAL, "worker", "--poll-seconds", "0.1", "--grace-seconds", "1"],
        cwd=ROOT,
        env=environment(tmp_path),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_state(tmp_path, run_id, "succeeded")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=30)
    logs = corral(tmp_path, "logs", run_id).stdout
    assert "refunded 30 EUR on order A-1001" in logs  # the call ran, once approved
    assert "Done: order A-1001 was refunded 30 EUR.\nsucceeded" in logs


def test_approvals_in_a_chat(tmp_path: Path) -> None:
    corral(tmp_path, "apply", "-f", "examples/approvals/")
    chat = corral(tmp_path, "chat", "refunds", input="refund order A-1001\n/approve\n", check=0)
    assert "refund-issue" in chat.stderr
    assert "Done: order A-1001 was refunded 30 EUR." in chat.stdout


def test_roles(tmp_path: Path) -> None:
    corral(tmp_path, "apply", "-f", "examples/roles/")
    run = corral(tmp_path, "run", "auditor", "book -120 EUR on acme")
    assert run.stdout.strip() == "I may not book entries. The balance of acme is 120 EUR."
    assert "permission_denied" in run.stderr
    assert "acme: 120 EUR" in run.stderr
    assert "booked" not in run.stderr  # the write never ran
    described = corral(tmp_path, "describe", "agent", "auditor").stdout
    assert "ledger-reader" in described


def test_tenant_policy(tmp_path: Path) -> None:
    require_bwrap(sandbox_host(tmp_path / "home"))
    corral(tmp_path, "apply", "-f", "examples/tenant-policy/")
    run = corral(tmp_path, "run", "-n", "acme", "counter", "count the characters of 'tenant'")
    assert run.stdout.strip() == '"tenant" has 6 characters.'
    assert '"characters": 6' in run.stderr
    described = corral(tmp_path, "describe", "agent", "counter", "-n", "acme").stdout
    assert "required" in described and "deny" in described and "namespace" in described

    # a python tool in acme: refused at apply, naming the field
    python_tool = tmp_path / "python-tool.yaml"
    python_tool.write_text(
        (EXAMPLES / "tenant-policy" / "tenant.yaml")
        .read_text()
        .split("\n---\n", 1)[1]  # all but the policy
        .replace("type: exec", "type: python")
        .replace(
            'exec:\n    command: ["python3", "./count_chars.py"]',
            'python:\n    function: "json:dumps"',
        )
        .replace("\n    isolation: {workspace: none}", "")
    )
    refused = corral(tmp_path, "apply", "-f", str(python_tool), check=2)
    assert "spec.tools[0]" in refused.stderr and "python" in refused.stderr


def test_sandboxed_exec(tmp_path: Path) -> None:
    require_bwrap(sandbox_host(tmp_path / "home"))
    corral(tmp_path, "apply", "-f", "examples/sandboxed-exec/")
    run = corral(tmp_path, "run", "prober", "what can a tool reach?")
    assert run.stdout.strip() == "The probe ran sandboxed: no network, no host home."
    found = re.search(r'\{"network": .*\}', run.stderr)
    assert found is not None, run.stderr
    report = json.loads(found[0])
    assert report["network"] == "unreachable"
    assert report["host_home_visible"] is False
    assert "CORRAL_HOME" not in report["environment"]
    assert not [k for k in report["environment"] if "TOKEN" in k or "SECRET" in k]


def test_wasm(tmp_path: Path) -> None:
    corral(tmp_path, "apply", "-f", "examples/wasm-tools.yaml", "-f", "examples/wasm/")
    run = corral(tmp_path, "run", "wasm-counter", "how many words in 'hello big wide world'?")
    assert run.stdout.strip() == "The text has 4 words."
    assert re.search(r"← word-count-wasm .*4", run.stderr), run.stderr
