"""`corral run`, `prompt-object` and `version` as a user runs them: real processes, real store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_harness import invoke

TESTS = Path(__file__).parent
CORRAL = [sys.executable, "-m", "corral"]

CALC = f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: scripted-add}}
spec:
  provider: scripted
  script:
    - tool_calls: [{{name: add, arguments: {{a: 2, b: 3}}}}]
    - text: "2 + 3 = 5"
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: add}}
spec:
  type: python
  python: {{function: "agent_tools:add", path: "{TESTS}"}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: calc}}
spec:
  model: scripted-add
  instructions: Use the add tool for arithmetic.
  tools: [add]
"""


def corral(home: Path, *args: str, check: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CORRAL_HOME": str(home)}
    env.pop("CORRAL_DB_URL", None)
    proc = invoke(args, env)
    if check is not None:
        assert proc.returncode == check, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture
def calc(tmp_path: Path) -> Path:
    path = tmp_path / "calc.yaml"
    path.write_text(CALC)
    corral(tmp_path / "home", "apply", "-f", str(path), check=0)
    return tmp_path / "home"


def test_run_streams_tool_calls_and_prints_the_answer(calc: Path) -> None:
    proc = corral(calc, "run", "calc", "What is 2 + 3?", check=0)
    assert proc.stdout.strip() == "2 + 3 = 5"
    assert "→ add" in proc.stderr and "← add" in proc.stderr
    assert "succeeded" in proc.stderr


def test_run_json_prints_the_final_run_record(calc: Path) -> None:
    proc = corral(calc, "run", "calc", "What is 2 + 3?", "-o", "json", check=0)
    record = json.loads(proc.stdout)
    assert record["state"] == "succeeded"
    assert record["output"] == "2 + 3 = 5"
    assert record["steps"] == 2
    tool_messages = [m for m in record["messages"] if m["role"] == "tool"]
    assert tool_messages[0]["content"] == "5"


def test_run_with_file_applies_and_runs_in_one_go(tmp_path: Path) -> None:
    path = tmp_path / "calc.yaml"
    path.write_text(CALC)
    proc = corral(tmp_path / "home", "run", "-f", str(path), "What is 2 + 3?", check=0)
    assert proc.stdout.strip() == "2 + 3 = 5"
    assert "agent/calc created" in proc.stderr


def test_unknown_agent_is_bad_input(calc: Path) -> None:
    proc = corral(calc, "run", "nobody", "hi", check=2)
    assert "Agent 'nobody' not found" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_waiting_for_approval_exits_3(tmp_path: Path) -> None:
    path = tmp_path / "calc.yaml"
    path.write_text(CALC.replace("tools: [add]", "tools: [add]\n  approval: {policy: always}"))
    proc = corral(tmp_path / "home", "run", "-f", str(path), "What is 2 + 3?", "-o", "json")
    assert proc.returncode == 3, proc.stderr
    record = json.loads(proc.stdout)
    assert record["state"] == "waiting_approval"
    assert record["pending_approvals"][0]["tool"] == "add"


def test_dead_model_endpoint_fails_with_one_line(tmp_path: Path) -> None:
    dead_endpoint = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: scripted-add}
spec:
  provider: openai
  model: gpt-test
  base_url: http://127.0.0.1:9/v1
  timeout_seconds: 2
  retry: {max_attempts: 1}
"""
    path = tmp_path / "dead.yaml"
    path.write_text(dead_endpoint + "---" + CALC.split("---", 1)[1])
    proc = corral(tmp_path / "home", "run", "-f", str(path), "hi")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "scripted-add" in proc.stderr  # the failing endpoint is named


def test_prompt_object_prints_validated_json(tmp_path: Path) -> None:
    doc = CALC.replace(
        '    - tool_calls: [{name: add, arguments: {a: 2, b: 3}}]\n    - text: "2 + 3 = 5"',
        '    - text: \'The answer: {"sum": "five"}\'\n    - text: \'{"sum": 5}\'',
    )
    path = tmp_path / "calc.yaml"
    path.write_text(doc)
    corral(tmp_path / "home", "apply", "-f", str(path), check=0)
    schema = tmp_path / "schema.json"
    schema.write_text(
        json.dumps(
            {"type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"]}
        )
    )
    proc = corral(
        tmp_path / "home", "prompt-object", "calc", "--schema", str(schema), "2+3?", check=0
    )
    assert json.loads(proc.stdout) == {"sum": 5}


def test_prompt_object_rejects_a_bad_schema_file(calc: Path, tmp_path: Path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text("{not json")
    proc = corral(calc, "prompt-object", "calc", "--schema", str(schema), "hi", check=2)
    assert f"{schema}:1" in proc.stderr


def test_version() -> None:
    proc = subprocess.run([*CORRAL, "version"], capture_output=True, text=True, check=True)
    assert proc.stdout.startswith("corral ")


def test_chat_carries_the_conversation_between_turns(tmp_path: Path) -> None:
    from corral.testing.fake_openai import FakeOpenAIServer, FakeReply

    with FakeOpenAIServer() as server:
        server.add_reply(FakeReply(text="Nice to meet you, Ada."), FakeReply(text="You are Ada."))
        path = tmp_path / "chat.yaml"
        path.write_text(
            f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: fake}}
spec: {{provider: openai, model: test-model, base_url: "{server.base_url}"}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: friend}}
spec: {{model: fake, instructions: Be kind.}}
"""
        )
        home = tmp_path / "home"
        corral(home, "apply", "-f", str(path), check=0)
        env = {**os.environ, "CORRAL_HOME": str(home)}
        proc = subprocess.run(
            [*CORRAL, "chat", "friend"],
            input="My name is Ada.\nWho am I?\n/exit\n",
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert "Nice to meet you, Ada." in proc.stdout and "You are Ada." in proc.stdout
        second = server.requests[1].json["messages"]
        assert [(m["role"], m["content"]) for m in second] == [
            ("system", "Be kind."),
            ("user", "My name is Ada."),
            ("assistant", "Nice to meet you, Ada."),
            ("user", "Who am I?"),
        ]


@pytest.mark.slow
def test_demo_agent_makes_a_real_tool_call_on_the_local_model(tmp_path: Path) -> None:
    """What `make demo` does: the real SmolLM2 model, in-process, calls the real add tool."""
    pytest.importorskip("llama_cpp", reason="the 'local' extra is not installed")
    examples = TESTS.parent / "examples"
    home = tmp_path / "home"
    corral(home, "apply", "-f", str(examples), check=0)
    proc = corral(home, "run", "assistant", "What is 17 plus 25? Use the add tool.", check=0)
    assert '→add({"a":17,"b":25})' in proc.stderr.replace(" ", "")
    assert "← add 42" in proc.stderr
    assert "42" in proc.stdout
