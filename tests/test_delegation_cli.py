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
  limits: {max_tokens: 500, max_cost_usd: 0.25}
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


def test_tasks_tree_and_describe_show_the_child_under_its_parent(tmp_path: Path) -> None:
    path = tmp_path / "boss.yaml"
    path.write_text(BOSS)
    home = tmp_path / "home"
    corral(home, "apply", "-f", str(path))
    code, out, err = corral(home, "run", "boss", "ask the adder", "-o", "json")
    assert code == 0, err
    parent = json.loads(out)
    assert (parent["parent_run_id"], parent["depth"]) == (None, 0)

    code, out, err = corral(home, "tasks", "tree", parent["id"], "-o", "json")
    assert code == 0, err
    tree = json.loads(out)
    (child,) = tree["children"]
    assert (tree["agent"], child["agent"], child["state"]) == ("boss", "adder", "succeeded")
    assert (child["parent_run_id"], child["depth"], child["children"]) == (parent["id"], 1, [])

    code, out, err = corral(home, "tasks", "tree", parent["id"])
    assert code == 0, err
    assert out.splitlines() == [
        f"{parent['id']}  boss  succeeded",
        f"└─ {child['id']}  adder  succeeded",
    ]

    code, out, err = corral(home, "tasks", "describe", parent["id"])
    assert code == 0, err
    assert f"  {child['id']}  adder  succeeded" in out.split("Children:")[1]
    code, out, err = corral(home, "tasks", "describe", child["id"])
    assert code == 0, err
    assert f"{parent['id']} (depth 1)" in out
    # what its parent left it: boss's limits, its first turn free
    assert "  Capped At:" in out and "$0.250000, 500 tokens" in out

    code, out, err = corral(home, "tasks", "tree", "run_nope")
    assert code == 2 and "not found" in err and "Traceback" not in err


def test_the_api_client_and_remote_cli_show_a_tasks_children(tmp_path: Path) -> None:
    from corral.client import Client
    from corral.core.errors import NotFoundError
    from server_harness import LiveServer

    with LiveServer(tmp_path / "server", workers=2) as server:
        with Client(server.url, server.admin) as client:
            client.apply(BOSS)
            task = client.prompt("boss", "ask the adder", timeout_seconds=30)
            assert (task.state.value, task.output) == ("succeeded", "the adder says 5")
            (child,) = client.task_children(task.id).items
            assert (child.agent, child.parent_run_id, child.depth) == ("adder", task.id, 1)
            assert client.task_children(child.id).items == []
            try:
                client.task_children("run_nope")
            except NotFoundError:
                pass
            else:
                raise AssertionError("the children of a task that is not there are a 404")
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        env.update(CORRAL_URL=server.url, CORRAL_TOKEN=server.admin)
        proc = invoke(["tasks", "tree", task.id], env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines() == [
            f"{task.id}  boss  succeeded",
            f"└─ {child.id}  adder  succeeded",
        ]


def test_run_whose_child_waits_for_approval_exits_3_and_says_where(tmp_path: Path) -> None:
    path = tmp_path / "boss.yaml"
    path.write_text(
        BOSS.replace(
            "  model: adder-model\n",
            "  model: adder-model\n  links: [boss]\n  approval: {policy: always}\n",
        ).replace('    - text: "5"', '    - tool_calls: [{name: agents_list}]\n    - text: "5"')
    )
    home = tmp_path / "home"
    corral(home, "apply", "-f", str(path))
    code, out, err = corral(home, "run", "boss", "ask the adder")
    assert code == 3, err
    assert "waits for its child tasks" in err and "corral tasks tree run_" in err
    code, out, err = corral(home, "approvals", "list", "-o", "json")
    (approval,) = json.loads(out)
    assert approval["tool"] == "agents_list"


def test_remote_run_whose_child_waits_for_approval_exits_3_as_embedded(tmp_path: Path) -> None:
    from server_harness import LiveServer

    waits = BOSS.replace(
        "  model: adder-model\n",
        "  model: adder-model\n  links: [boss]\n  approval: {policy: always}\n",
    ).replace('    - text: "5"', '    - tool_calls: [{name: agents_list}]\n    - text: "5"')
    with LiveServer(tmp_path / "server", workers=2) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        env.update(CORRAL_URL=server.url, CORRAL_TOKEN=server.admin)
        path = tmp_path / "boss.yaml"
        path.write_text(waits)
        assert invoke(["apply", "-f", str(path)], env).returncode == 0
        proc = invoke(["run", "boss", "ask the adder"], env)
        assert proc.returncode == 3, proc.stderr
        assert "waits for its child tasks" in proc.stderr
