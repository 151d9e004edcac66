"""``corral run`` of an agent that delegates, embedded (no worker): the child runs here too."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cli_harness import invoke

BOSS = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: boss-model}
spec:
  provider: scripted
  script:
    - tool_calls: [{name: agents_exec, arguments: {agent: adder, input: "2 + 3?"}}]
    - text: "the adder says 5"
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: adder-model}
spec:
  provider: scripted
  script:
    - text: "5"
---
apiVersion: corral/v1
kind: Agent
metadata: {name: adder}
spec:
  model: adder-model
---
apiVersion: corral/v1
kind: Agent
metadata: {name: boss}
spec:
  model: boss-model
  links:
    - {agent: adder, description: "adds numbers"}
"""


def corral(home: Path, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "CORRAL_HOME": str(home)}
    env.pop("CORRAL_DB_URL", None)
    env.pop("CORRAL_NATS_URL", None)
    proc = invoke(args, env)
    return proc.returncode, proc.stdout, proc.stderr


def test_run_executes_the_child_run_in_process_and_prints_the_parents_answer(
    tmp_path: Path,
) -> None:
    path = tmp_path / "boss.yaml"
    path.write_text(BOSS)
    corral(tmp_path / "home", "apply", "-f", str(path))
    code, out, err = corral(tmp_path / "home", "run", "boss", "ask the adder")
    assert code == 0, err
    assert out.strip() == "the adder says 5"
    assert "⇢ adder" in err and "⇠ adder succeeded" in err
    # the child's own events are not the parent's: its answer shows only as the result
    assert err.count("← agents_exec") == 1

    code, out, err = corral(tmp_path / "home", "tasks", "list", "-o", "json")
    assert code == 0, err
    tasks = json.loads(out)
    assert sorted(t["agent"] for t in tasks) == ["adder", "boss"]
    assert {t["state"] for t in tasks} == {"succeeded"}
