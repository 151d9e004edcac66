"""Schemathesis (``schemathesis run --checks all``) against a real ``corral serve``.

The schemathesis CLI runs as a subprocess against the server over HTTP, with an admin
token, every phase (examples, coverage, fuzzing, stateful) and every check: no 5xx,
every response as documented (status, content type, headers, body), what the schema
forbids refused, what it allows accepted, 405s with the exact ``Allow``. Examples are
bounded and the generation deterministic (fixed seed, derandomized, no example
database), so a run takes well under a minute and fails the same way twice.

The server runs without workers: generated resources are stored but nothing ever
executes them, and a prompt can only wait (for at most a fraction of a second).

The only exceptions, each narrow and for a reason the schema cannot express, are in
:data:`CONFIG`:

* ``positive_data_acceptance`` also takes 422 where a request is well formed but its
  meaning is refused: a ``cursor`` that matches the published pattern but that this
  server never issued (cursors are opaque; every list); a task naming an agent that
  does not exist (``submit_task``: 422 ``unknown_agent``); an apply whose documents
  reference resources that do not exist, break a rule between fields (a ``Tool`` of
  type ``python`` needs a ``python`` block) or name another namespace; a ``schema`` or
  ``output_schema`` that is a JSON object but not a valid JSON Schema
  (``prompt_object``, ``submit_task``).
* The ``validation_mismatch`` warning (most generated applies and submits are 422) does
  not fail the run: those are the 422s of meaning above. The warnings that would mean
  a broken run do: ``missing_auth`` (the run locked itself out), a reference or a
  pattern schemathesis cannot use, a configuration that matches no operation.

Path parameters of the event, session, session-message and memory operations are fixed
to objects the fixture made, so those requests reach more than a 404 (a memory write or
search may also be 400 for what it holds: a text over the cap, nested metadata).
``/v1/links`` runs with an agent token (of agent ``boss``, linked to ``helper``, for
the fixture's queued task: its exec answers 409, the task not running), every other
operation with the admin token.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from string import Template

import pytest

from corral.runtime.agent_tokens import AgentTokenSigner
from server_harness import LiveServer, apply, echo_turn, resources

#: generated test cases per operation in the fuzzing phase (and stateful scenarios)
EXAMPLES = 20
SEED = 13

MEANING = '["2xx", "3xx", "401", "403", "404", "409", "422", "429"]'

CONFIG = Template("""
# The run must stay authenticated throughout (no operation answering only 401/403) and
# must understand the whole schema (every reference, every pattern). Not
# "validation_mismatch": it is the 422s of meaning below, on apply and submit.
[warnings]
fail-on = ["missing_auth", "unresolvable_reference", "unsupported_regex", "unmatched_filter"]

# /v1/links takes an agent token (of the fixture's queued task: exec answers 409 there)
[[operations]]
include-operation-id = ["list_links", "get_link", "exec_link"]
headers = { Authorization = "Bearer $agent_token" }
checks.positive_data_acceptance.expected-statuses = $meaning

[[operations]]
include-operation-id = [
    "list_resources", "list_tasks", "list_approvals", "list_sessions", "list_tokens",
    "submit_task", "apply_resources", "prompt_object", "submit_system_task", "task_messages",
]
checks.positive_data_acceptance.expected-statuses = $meaning

# Objects that exist (the fixture made them), so these get past their 404. The first
# block that matches an operation is its configuration.
[[operations]]
include-operation-id = "run_events"
parameters = { "path.run_id" = "$run_id" }
checks.positive_data_acceptance.expected-statuses = $meaning

[[operations]]
include-operation-id = "session_messages"
parameters = { "path.session_id" = "$session_id" }
checks.positive_data_acceptance.expected-statuses = $meaning

[[operations]]
include-operation-id = ["get_session", "delete_session"]
parameters = { "path.session_id" = "$session_id" }

# A Memory that exists. A write or search the schema allows may still be refused for what
# it holds (400 invalid_memory_input: a text over the cap, nested metadata, a filter key
# with a quote); an agent or session named for a Memory of namespace scope is ignored.
[[operations]]
include-operation-id = [
    "memory_stats", "list_memory_entries", "write_memory_entry", "read_memory_entry",
    "delete_memory_entry", "search_memory", "ingest_memory",
]
parameters = { "path.name" = "$memory" }
checks.positive_data_acceptance.expected-statuses = $meaning_or_400
""")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("home"), workers=0, max_prompt_seconds=0.2) as server:
        yield server


def _objects(live: LiveServer) -> dict[str, str]:
    """An agent, a task of it in a session: what the generated requests can find."""
    with live.client(live.admin) as client:
        apply(client, resources("helper", [echo_turn("x"), "{text: done}"]))
        apply(client, resources("boss", ["{text: done}"], extra="  links: [helper]"))
        body = {"agent": "helper", "input": "x", "session": "s-1"}
        task = client.post("/v1/tasks", json=body)
        assert task.status_code == 201, task.text
        assert client.get("/v1/sessions/s-1").status_code == 200
        memory = {"apiVersion": "corral/v1", "kind": "Memory", "metadata": {"name": "m"}}
        assert client.post("/v1/resources", json={**memory, "spec": {}}).status_code == 200
    agent_token = AgentTokenSigner.from_settings(live.settings).mint(
        namespace="default",
        agent="boss",
        run_id=task.json()["id"],
        links=["helper"],
        ttl_seconds=3600,  # past the default 15 minutes on a slow machine: only 401s then
    )
    return {
        "run_id": task.json()["id"],
        "session_id": "s-1",
        "agent_token": agent_token,
        "memory": "m",
    }


def test_schemathesis_with_every_check_finds_nothing(live: LiveServer, tmp_path: Path) -> None:
    config = tmp_path / "schemathesis.toml"
    meaning_or_400 = MEANING.replace('"3xx", ', '"3xx", "400", ')
    config.write_text(
        CONFIG.substitute(meaning=MEANING, meaning_or_400=meaning_or_400, **_objects(live))
    )
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(config),
        "run",
        f"{live.url}/openapi.json",
        "--checks",
        "all",
        "--header",
        f"Authorization: Bearer {live.admin}",
        "--max-examples",
        str(EXAMPLES),
        "--seed",
        str(SEED),
        "--generation-deterministic",  # derandomized, and no example database
        "--workers",
        "1",
        "--request-timeout",
        "10",
        # the labels' patterns (the characters a label may not hold, as ranges) are slow to
        # draw from on a loaded machine; nothing else is
        "--suppress-health-check",
        "too_slow",
        "--no-color",
        "--report-dir",
        str(tmp_path / "report"),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    # every operation was tested, none filtered out
    assert "Selected: 42/42" in run.stdout and "Tested: 42" in run.stdout, run.stdout
