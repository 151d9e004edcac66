"""Loading YAML resources: every problem named with file, line and field; references checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.core.errors import Location, ResourceError
from corral.resources.kinds import AgentSpec, McpServerSpec, ToolSpecModel
from corral.resources.loader import LoadedResource, format_path, load_path, load_text
from corral.resources.references import check_references, parse_tool_ref, referrers

MODEL = """\
apiVersion: corral/v1
kind: ModelEndpoint
metadata:
  name: gpt
spec:
  provider: scripted
"""

AGENT = """\
apiVersion: corral/v1
kind: Agent
metadata:
  name: assistant
  labels: {team: core}
spec:
  model: gpt
  limits:
    max_steps: 5
"""


def problems(exc: pytest.ExceptionInfo[ResourceError]) -> list[tuple[Location, str]]:
    return exc.value.problems


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_multi_document_file_loads_with_start_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "all.yaml", MODEL + "---\n" + AGENT)
    loaded = load_path(path)
    assert [item.resource.key for item in loaded] == [
        ("default", "ModelEndpoint", "gpt"),
        ("default", "Agent", "assistant"),
    ]
    agent = loaded[1]
    assert agent.file == str(path)
    assert agent.line == 8
    assert agent.line_of(("spec", "limits", "max_steps")) == 16
    assert isinstance(agent.resource.spec, AgentSpec)
    assert agent.resource.metadata.labels == {"team": "core"}


def test_empty_documents_are_skipped() -> None:
    assert len(load_text("---\n" + MODEL + "---\n---\n")) == 1


def test_default_namespace_applies_only_where_none_is_given() -> None:
    text = (
        MODEL
        + "---\n"
        + AGENT.replace("  name: assistant\n", "  name: assistant\n  namespace: ops\n")
    )
    loaded = load_text(text, default_namespace="team-a")
    assert [item.resource.namespace for item in loaded] == ["team-a", "ops"]


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.yaml", MODEL + "  model: [unclosed\nother: x\n")
    with pytest.raises(ResourceError) as exc:
        load_path(path)
    [(loc, reason)] = problems(exc)
    assert loc.file == str(path)
    assert loc.line is not None and loc.line >= 7
    assert "invalid YAML" in reason


def test_unknown_kind_lists_the_known_kinds() -> None:
    with pytest.raises(ResourceError) as exc:
        load_text(MODEL.replace("ModelEndpoint", "agent"), "m.yaml")
    [(loc, reason)] = problems(exc)
    assert (loc.file, loc.line, loc.field) == ("m.yaml", 2, "kind")
    assert "unknown kind 'agent'" in reason and "did you mean 'Agent'" in reason
    assert "ModelEndpoint, Tool, McpServer, Agent" in reason


def test_missing_field_points_at_the_parent_mapping() -> None:
    with pytest.raises(ResourceError) as exc:
        load_text(MODEL.replace("  provider: scripted\n", "  model: x\n"), "m.yaml")
    [(loc, reason)] = problems(exc)
    assert (loc.line, loc.field) == (5, "spec.provider")
    assert reason == "required field is missing"


def test_nested_invalid_value_points_at_its_own_line() -> None:
    with pytest.raises(ResourceError) as exc:
        load_text(AGENT.replace("max_steps: 5", "max_steps: 0"), "a.yaml")
    [(loc, reason)] = problems(exc)
    assert str(loc) == "a.yaml:9, field 'spec.limits.max_steps'"
    assert "greater than or equal to 1" in reason


def test_a_token_limit_past_64_bits_is_refused_where_it_is() -> None:
    # (a child run's cap is stored as a 64-bit integer: one past it could not be)
    fits = load_text(AGENT.replace("max_steps: 5", f"max_tokens: {2**63 - 1}"), "a.yaml")
    assert fits
    with pytest.raises(ResourceError) as exc:
        load_text(AGENT.replace("max_steps: 5", f"max_tokens: {2**63}"), "a.yaml")
    [(loc, reason)] = problems(exc)
    assert str(loc) == "a.yaml:9, field 'spec.limits.max_tokens'"
    assert "less than or equal to" in reason


def test_unknown_field_is_reported_where_it_is() -> None:
    with pytest.raises(ResourceError) as exc:
        load_text(AGENT.replace("  model: gpt\n", "  model: gpt\n  modle: gpt\n"), "a.yaml")
    [(loc, reason)] = problems(exc)
    assert (loc.line, loc.field, reason) == (8, "spec.modle", "unknown field")


def test_model_level_rule_is_reported_at_the_spec() -> None:
    text = MODEL.replace("provider: scripted", "provider: openai")
    with pytest.raises(ResourceError) as exc:
        load_text(text, "m.yaml")
    [(loc, reason)] = problems(exc)
    assert (loc.line, loc.field) == (5, "spec")
    assert reason == "provider 'openai' needs 'model'"


def test_union_member_errors_are_merged_without_type_tags() -> None:
    text = """\
apiVersion: corral/v1
kind: Tool
metadata: {name: t}
spec:
  type: exec
  parameters: {type: object}
  exec:
    command: [run]
    env:
      GOOD: plain
      BAD: {value: x, secret: y}
"""
    with pytest.raises(ResourceError) as exc:
        load_text(text, "t.yaml")
    [(loc, reason)] = problems(exc)
    assert (loc.line, loc.field) == (11, "spec.exec.env.BAD")
    assert "give exactly one of 'value' or 'secret'" in reason


def test_envelope_problems_are_all_reported() -> None:
    text = "kind: Agent\nmetadata: {name: Not_Valid}\nspec: {model: gpt}\nextra: 1\n"
    with pytest.raises(ResourceError) as exc:
        load_text(text, "a.yaml")
    found = {(loc.field, loc.line): reason for loc, reason in problems(exc)}
    assert "missing apiVersion" in found[("apiVersion", 1)]
    assert "unknown field" in found[("extra", 4)]
    assert "lower case" in found[("metadata.name", 2)]


def test_wrong_api_version_and_non_mapping_documents() -> None:
    text = MODEL.replace("corral/v1", "corral/v2") + "---\n- just\n- a list\n"
    with pytest.raises(ResourceError) as exc:
        load_text(text, "m.yaml")
    [(first, reason1), (second, reason2)] = problems(exc)
    assert (first.line, first.field) == (1, "apiVersion") and "corral/v2" in reason1
    assert second.line == 8 and "must be a mapping" in reason2


def test_problems_of_all_files_and_documents_come_together(tmp_path: Path) -> None:
    write(tmp_path, "a/one.yaml", MODEL.replace("scripted", "nope"))
    write(tmp_path, "b/two.yml", AGENT + "---\n" + AGENT.replace("max_steps: 5", "max_steps: -1"))
    write(tmp_path, "notes.txt", "not yaml: [")
    with pytest.raises(ResourceError) as exc:
        load_path(tmp_path)
    files = [Path(loc.file or "").name for loc, _ in problems(exc)]
    assert files == ["one.yaml", "two.yml"]


def test_directory_loads_recursively_in_sorted_order(tmp_path: Path) -> None:
    write(tmp_path, "b/agent.yaml", AGENT)
    write(tmp_path, "a/model.yml", MODEL)
    write(tmp_path, "README.md", "# not a resource")
    loaded = load_path(tmp_path)
    assert [Path(item.file or "").name for item in loaded] == ["model.yml", "agent.yaml"]


def test_missing_path_and_empty_directory_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ResourceError, match="no such file"):
        load_path(tmp_path / "absent.yaml")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ResourceError, match=r"no \*\.yaml"):
        load_path(tmp_path / "empty")


def test_duplicate_resource_in_one_batch_is_an_error() -> None:
    with pytest.raises(ResourceError) as exc:
        load_text(MODEL + "---\n" + MODEL, "m.yaml")
    [(loc, reason)] = problems(exc)
    assert (loc.line, loc.field) == (11, "metadata.name")
    assert "duplicate ModelEndpoint 'gpt'" in reason and "m.yaml:1" in reason


def test_duplicate_yaml_key_is_an_error() -> None:
    with pytest.raises(ResourceError) as exc:
        load_text(MODEL + "  provider: ollama\n  model: m\n", "m.yaml")
    [(loc, reason)] = problems(exc)
    assert loc.line == 7 and reason == "duplicate key 'provider'"


def test_relative_program_paths_become_absolute_from_the_yaml_directory(tmp_path: Path) -> None:
    text = """\
apiVersion: corral/v1
kind: Tool
metadata: {name: py}
spec:
  type: python
  python: {function: "m:f", path: ./lib}
---
apiVersion: corral/v1
kind: Tool
metadata: {name: ex}
spec:
  type: exec
  parameters: {type: object}
  exec: {command: [../bin/run.sh, ./data.txt, python3, /usr/bin/env]}
---
apiVersion: corral/v1
kind: McpServer
metadata: {name: files}
spec:
  transport: stdio
  command: [./server.py, --flag]
"""
    path = write(tmp_path, "conf/tools.yaml", text)
    py, ex, mcp = (item.resource.spec for item in load_path(path))
    assert isinstance(py, ToolSpecModel) and py.python is not None
    assert py.python.path == str(tmp_path / "conf" / "lib")
    assert isinstance(ex, ToolSpecModel) and ex.exec is not None
    assert ex.exec.command == [
        str(tmp_path / "bin" / "run.sh"),
        str(tmp_path / "conf" / "data.txt"),
        "python3",
        "/usr/bin/env",
    ]
    assert isinstance(mcp, McpServerSpec)
    assert mcp.command == [str(tmp_path / "conf" / "server.py"), "--flag"]


def test_format_path() -> None:
    assert format_path(("spec", "tools", 2, "name")) == "spec.tools[2].name"
    assert format_path(()) == ""


# --------------------------------------------------------------------------- references

ALL_REFS = """\
apiVersion: corral/v1
kind: Agent
metadata: {name: assistant}
spec:
  model: gpt
  fallback_models: [backup]
  tools:
    - add
    - "mcp:files/*"
    - "mcp:files/read"
    - "mcp:/bad"
    - "http://nope"
  roles: [reader]
---
apiVersion: corral/v1
kind: AgentRole
metadata: {name: reader}
spec: {permissions: [read-only]}
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: gpt}
spec:
  provider: openai
  model: gpt-4o
  api_key: {secret: openai-key}
"""


class Lookup:
    """The stored side of a reference check: a set of keys."""

    def __init__(self, *keys: tuple[str, str, str]) -> None:
        self.keys = set(keys)
        self.asked: list[tuple[str, str, str]] = []

    async def __call__(self, namespace: str, kind: str, name: str) -> bool:
        self.asked.append((namespace, kind, name))
        return (namespace, kind, name) in self.keys


async def test_every_missing_or_malformed_reference_is_reported() -> None:
    batch = load_text(ALL_REFS, "agents.yaml")
    with pytest.raises(ResourceError) as exc:
        await check_references(batch, Lookup())
    messages = {str(loc): reason for loc, reason in exc.value.problems}
    assert messages == {
        "agents.yaml:6, field 'spec.fallback_models[0]'": (
            "ModelEndpoint 'backup' not found in namespace 'default'"
        ),
        "agents.yaml:8, field 'spec.tools[0]'": "Tool 'add' not found in namespace 'default'",
        "agents.yaml:9, field 'spec.tools[1]'": "McpServer 'files' not found in namespace 'default'",
        "agents.yaml:10, field 'spec.tools[2]'": "McpServer 'files' not found in namespace 'default'",
        "agents.yaml:11, field 'spec.tools[3]'": (
            "malformed tool reference 'mcp:/bad': use a Tool name, 'mcp:SERVER/TOOL' or 'mcp:SERVER/*'"
        ),
        "agents.yaml:12, field 'spec.tools[4]'": (
            "malformed tool reference 'http://nope': use a Tool name, "
            "'mcp:SERVER/TOOL' or 'mcp:SERVER/*'"
        ),
        "agents.yaml:18, field 'spec.permissions[0]'": (
            "ToolPermission 'read-only' not found in namespace 'default'"
        ),
        "agents.yaml:26, field 'spec.api_key.secret'": (
            "Secret 'openai-key' not found in namespace 'default'"
        ),
    }


async def test_references_resolve_from_the_batch_or_the_store() -> None:
    text = ALL_REFS.replace('    - "mcp:/bad"\n    - "http://nope"\n', "")
    batch = load_text(text, "agents.yaml")
    stored = Lookup(
        ("default", "ModelEndpoint", "backup"),
        ("default", "Tool", "add"),
        ("default", "McpServer", "files"),
        ("default", "ToolPermission", "read-only"),
        ("default", "Secret", "openai-key"),
    )
    await check_references(batch, stored)
    # Batch members are never looked up; each stored name is asked once.
    assert ("default", "ModelEndpoint", "gpt") not in stored.asked
    assert len(stored.asked) == len(set(stored.asked))


async def test_references_do_not_cross_namespaces() -> None:
    batch = load_text(AGENT, "a.yaml", default_namespace="team-a")
    with pytest.raises(ResourceError, match="ModelEndpoint 'gpt' not found in namespace 'team-a'"):
        await check_references(batch, Lookup(("default", "ModelEndpoint", "gpt")))


async def test_secret_references_of_tools_and_mcp_servers() -> None:
    text = """\
apiVersion: corral/v1
kind: Tool
metadata: {name: ex}
spec:
  type: exec
  parameters: {type: object}
  exec:
    command: [run]
    env: {TOKEN: {secret: tok}, PLAIN: x}
---
apiVersion: corral/v1
kind: Tool
metadata: {name: web}
spec:
  type: http
  parameters: {type: object}
  http: {url: "https://example.com", auth: {type: bearer, secret: web-key}}
---
apiVersion: corral/v1
kind: McpServer
metadata: {name: files}
spec:
  transport: streamable-http
  url: https://mcp.example.com
  env: {A: {secret: mcp-env}}
  auth: {type: api-key, secret: mcp-key}
"""
    batch = load_text(text, "t.yaml")
    with pytest.raises(ResourceError) as exc:
        await check_references(batch, Lookup())
    fields = [(loc.line, loc.field) for loc, _ in exc.value.problems]
    assert fields == [
        (9, "spec.exec.env.TOKEN.secret"),
        (17, "spec.http.auth.secret"),
        (25, "spec.env.A.secret"),
        (26, "spec.auth.secret"),
    ]


async def test_references_of_resources_built_in_code_name_the_resource() -> None:
    [agent] = load_text(AGENT)
    with pytest.raises(ResourceError) as exc:
        await check_references([agent.resource], Lookup())
    assert str(exc.value) == (
        "field 'spec.model': Agent 'assistant': ModelEndpoint 'gpt' not found in namespace 'default'"
    )


def test_parse_tool_ref() -> None:
    assert parse_tool_ref("add") == ("Tool", "add")
    assert parse_tool_ref("mcp:files/*") == ("McpServer", "files")
    assert parse_tool_ref("mcp:files/read") == ("McpServer", "files")
    for bad in ("mcp:files", "mcp:Files/x", "mcp:files/a/b", "Add", "x:y"):
        assert parse_tool_ref(bad) is None


def test_referrers_name_the_field() -> None:
    batch: list[LoadedResource] = load_text(ALL_REFS)
    found = referrers(("ModelEndpoint", "gpt"), [item.resource for item in batch])
    assert [(r.name, field) for r, field in found] == [("assistant", ("spec", "model"))]
