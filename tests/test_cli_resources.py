"""`corral apply/get/describe/delete` as a user types them, against a real store in CORRAL_HOME."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner, Result

from corral.cli import main as cli
from corral.cli import resources_cmd
from corral.core.settings import Settings
from corral.store import open_store

if "apply" not in {command.name for command in cli.app.registered_commands}:
    resources_cmd.register(cli.app)

SECRET = "hunter2-plaintext"

RESOURCES = f"""\
apiVersion: corral/v1
kind: ModelEndpoint
metadata:
  name: gpt
spec:
  provider: scripted
  api_key: {{secret: openai-key}}
---
apiVersion: corral/v1
kind: Secret
metadata:
  name: openai-key
spec:
  value: {SECRET}
---
apiVersion: corral/v1
kind: Agent
metadata:
  name: assistant
  labels: {{team: core}}
spec:
  model: gpt
  instructions: Be brief.
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CORRAL_DB_URL", raising=False)
    monkeypatch.delenv("CORRAL_SECRET_KEY", raising=False)
    return tmp_path / "home"


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    path = tmp_path / "manifests" / "agents.yaml"
    path.parent.mkdir()
    path.write_text(RESOURCES)
    return path


def corral(*args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(cli.app, list(args))
    assert result.exit_code == code, f"exit {result.exit_code}\n{result.output}"
    return result


def stored_state(namespace: str = "default") -> list[tuple[str, str, int, dict[str, Any]]]:
    """What the store of CORRAL_HOME holds, read through the library rather than the CLI."""

    async def read() -> list[tuple[str, str, int, dict[str, Any]]]:
        async with await open_store(Settings.from_env().db_url) as store:
            items = await store.list_resources(namespace)
        return [
            (i.resource.kind, i.resource.name, i.generation, i.resource.to_document())
            for i in items
        ]

    return asyncio.run(read())


def test_apply_reports_created_unchanged_and_configured(home: Path, manifests: Path) -> None:
    first = corral("apply", "-f", str(manifests))
    assert first.stdout.splitlines() == [
        "modelendpoint/gpt created",
        "secret/openai-key created",
        "agent/assistant created",
    ]
    again = corral("apply", "-f", str(manifests.parent))
    assert again.stdout.splitlines() == [
        "modelendpoint/gpt unchanged",
        "secret/openai-key unchanged",
        "agent/assistant unchanged",
    ]
    manifests.write_text(RESOURCES.replace("Be brief.", "Be kind."))
    changed = corral("apply", "-f", str(manifests))
    assert changed.stdout.splitlines() == [
        "modelendpoint/gpt unchanged",
        "secret/openai-key unchanged",
        "agent/assistant configured",
    ]


def test_apply_takes_several_files_and_a_namespace(home: Path, tmp_path: Path) -> None:
    model, secret, agent = RESOURCES.split("---\n")
    (tmp_path / "a.yaml").write_text(model + "---\n" + secret)
    (tmp_path / "b.yaml").write_text(agent)
    result = corral(
        "apply", "-f", str(tmp_path / "a.yaml"), "-f", str(tmp_path / "b.yaml"), "-n", "ops"
    )
    assert len(result.stdout.splitlines()) == 3
    assert [name for _, name, _, _ in stored_state("ops")] == ["assistant", "gpt", "openai-key"]
    assert stored_state("default") == []


def test_get_lists_a_kind_as_a_table(home: Path, manifests: Path) -> None:
    corral("apply", "-f", str(manifests))
    table = corral("get", "agents").stdout
    header, *rows = [line.split() for line in table.splitlines()]
    assert header == ["NAME", "NAMESPACE", "MODEL", "TOOLS", "AGE"]
    assert rows[0][:4] == ["assistant", "default", "gpt", "-"]
    assert "PROVIDER" in corral("get", "ModelEndpoint").stdout
    assert corral("get", "tools").stderr == "No resources found in default namespace.\n"


def test_get_one_as_json_and_yaml(home: Path, manifests: Path) -> None:
    corral("apply", "-f", str(manifests))
    doc = json.loads(corral("get", "agent", "assistant", "-o", "json").stdout)
    assert doc["metadata"] == {
        "name": "assistant",
        "namespace": "default",
        "labels": {"team": "core"},
    }
    assert doc["spec"]["model"] == "gpt"
    docs = list(yaml.safe_load_all(corral("get", "modelendpoints", "-o", "yaml").stdout))
    assert [d["metadata"]["name"] for d in docs] == ["gpt"]


def test_describe_shows_generation_times_spec_and_users(home: Path, manifests: Path) -> None:
    corral("apply", "-f", str(manifests))
    manifests.write_text(RESOURCES.replace("Be brief.", "Be kind."))
    corral("apply", "-f", str(manifests))
    text = corral("describe", "agent", "assistant").stdout
    assert "Generation:  2" in text
    assert "Labels:      team=core" in text
    assert "instructions: Be kind." in text
    assert "Created:" in text and "Updated:" in text
    model = corral("describe", "modelendpoint", "gpt").stdout
    assert "Used by:     agent/assistant (spec.model)" in model


def test_secret_values_are_never_shown_and_stored_encrypted(home: Path, manifests: Path) -> None:
    outputs = [
        corral("apply", "-f", str(manifests)).output,
        corral("get", "secrets").output,
        corral("get", "secret", "openai-key", "-o", "json").output,
        corral("get", "secret", "-o", "yaml").output,
        corral("describe", "secret", "openai-key").output,
    ]
    for output in outputs:
        assert SECRET not in output
        assert "gAAAA" not in output  # not even the ciphertext
    assert "<redacted>" in outputs[2]
    assert "encrypted" in outputs[1]

    with sqlite3.connect(home / "corral.db") as conn:
        rows = conn.execute("SELECT spec FROM resources WHERE kind = 'Secret'").fetchall()
    assert rows and all(SECRET not in spec for (spec,) in rows)
    for file in home.iterdir():
        assert SECRET.encode() not in file.read_bytes(), file


BAD_INPUTS = {
    "syntax error": (
        RESOURCES.replace("  instructions: Be brief.", "  instructions: [Be brief."),
        "agents.yaml:",
        "invalid YAML",
    ),
    "unknown kind": (
        RESOURCES.replace("kind: Agent", "kind: Agnet"),
        "agents.yaml:17, field 'kind'",
        "unknown kind 'Agnet'",
    ),
    "missing field": (
        RESOURCES.replace("  provider: scripted\n", ""),
        "agents.yaml:5, field 'spec.provider'",
        "required field is missing",
    ),
    "unknown reference": (
        RESOURCES.replace("model: gpt\n  instructions", "model: gpt-5\n  instructions"),
        "agents.yaml:22, field 'spec.model'",
        "ModelEndpoint 'gpt-5' not found in namespace 'default'",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_exits_2_names_file_line_field_and_stores_nothing(
    home: Path, manifests: Path, case: str
) -> None:
    corral("apply", "-f", str(manifests))
    before = stored_state()
    text, where, reason = BAD_INPUTS[case]
    manifests.write_text(text.replace("Be brief.", "Changed.").replace("Be kind.", "Changed."))
    result = corral("apply", "-f", str(manifests), code=2)
    assert where in result.stderr and reason in result.stderr, result.stderr
    assert result.stdout == ""
    assert stored_state() == before


def test_delete_refuses_a_referenced_resource_then_deletes(home: Path, manifests: Path) -> None:
    corral("apply", "-f", str(manifests))
    refused = corral("delete", "modelendpoint", "gpt", code=2)
    assert "referenced by Agent 'assistant' (spec.model)" in refused.stderr
    assert corral("delete", "agents", "assistant").stdout.strip() == "agent/assistant deleted"
    assert corral("delete", "ModelEndpoint", "gpt").stdout.strip() == "modelendpoint/gpt deleted"
    assert [name for _, name, _, _ in stored_state()] == ["openai-key"]


def test_unknown_names_kinds_and_formats_exit_2(home: Path, manifests: Path) -> None:
    corral("apply", "-f", str(manifests))
    assert "Agent 'ghost' not found" in corral("get", "agent", "ghost", code=2).stderr
    assert "Agent 'ghost' not found" in corral("describe", "agent", "ghost", code=2).stderr
    assert "Agent 'ghost' not found" in corral("delete", "agent", "ghost", code=2).stderr
    assert "unknown kind 'gadget'" in corral("get", "gadget", code=2).stderr
    assert "unknown output format" in corral("get", "agents", "-o", "xml", code=2).stderr
    assert "no such file" in corral("apply", "-f", str(home / "nope.yaml"), code=2).stderr
    (home / "empty.yaml").write_text("# nothing here\n")
    assert "no resources found" in corral("apply", "-f", str(home / "empty.yaml"), code=2).stderr
