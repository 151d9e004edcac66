"""``handoff`` at the CLI: ``corral run`` and ``corral logs`` render the switch, ``tasks get``
and ``tasks describe`` show the agent the run went on under."""

from __future__ import annotations

import json
from pathlib import Path

from test_delegation_cli import corral

TRIAGE = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: triage-model}
spec:
  provider: scripted
  script:
    - tool_calls: [{name: handoff, arguments: {agent: billing, reason: "about an invoice"}}]
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: billing-model}
spec:
  provider: scripted
  script:
    - text: "(triage's turn)"
    - text: "you owe 5"
---
apiVersion: corral/v1
kind: Agent
metadata: {name: billing}
spec:
  model: billing-model
  instructions: You are billing.
---
apiVersion: corral/v1
kind: Agent
metadata: {name: triage}
spec:
  model: triage-model
  links: [{agent: billing, description: "invoices and payments"}]
"""


def test_run_logs_and_tasks_get_show_the_handoff(tmp_path: Path) -> None:
    path = tmp_path / "triage.yaml"
    path.write_text(TRIAGE)
    home = tmp_path / "home"
    code, _, err = corral(home, "apply", "-f", str(path))
    assert code == 0, err
    code, out, err = corral(home, "run", "triage", "what do I owe?")
    assert code == 0, err
    assert out.strip() == "you owe 5"
    assert "⇒ billing handoff from triage: about an invoice" in err

    code, out, err = corral(home, "tasks", "list", "-o", "json")
    assert code == 0, err
    (task,) = json.loads(out)
    assert (task["agent"], task["active_agent"]) == ("triage", "billing")

    code, out, err = corral(home, "tasks", "get", task["id"])
    assert code == 0, err
    header, row = out.splitlines()
    assert header.split()[:3] == ["ID", "AGENT", "STATE"]
    assert row.split()[:3] == [task["id"], "triage→billing", "succeeded"]

    code, out, err = corral(home, "logs", task["id"])
    assert code == 0, err
    assert "⇒ billing handoff from triage: about an invoice" in out
    assert out.index("handoff from triage") < out.index("you owe 5")

    code, out, err = corral(home, "tasks", "describe", task["id"])
    assert code == 0, err
    assert "billing (after a handoff)" in out
