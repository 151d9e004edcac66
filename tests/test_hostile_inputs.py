"""Hostile and careless inputs: each is refused with a clear error and a stable code.

No input makes the API answer 500 or the CLI print a traceback (without ``--debug``).
Grouped by area; add a case to the section of the door it comes through:

- documents over the API: ``POST /v1/resources`` (YAML and JSON bodies)
- documents through the CLI: ``corral apply``, ``corral prompt-object --schema``
- CLI errors: one line, whatever went wrong
- tool-call arguments: what a model sends
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.core.events import EventType
from corral.core.limits import DocumentLimits
from corral.core.messages import Message, dump
from corral.core.runs import RunState
from corral.core.settings import Settings
from corral.engine.replay import replay
from corral.resources.loader import load_text
from corral.runtime.local import run_agent
from corral.store import Store
from corral.testing.fake_openai import FakeOpenAIServer, FakeReply, FakeToolCall
from fixtures_models import fake_openai_fixture, openai_server_fixture
from server_harness import LiveServer

__all__ = ["fake_openai_fixture", "openai_server_fixture"]

TESTS = Path(__file__).parent
#: what a refusal may take: parsing stops at the limit, so it is quick even on a loaded machine
QUICK_SECONDS = 3.0


def alias_bomb(levels: int) -> str:
    """A billion-laughs ModelEndpoint: each level lists the one before it nine times.

    ``levels=6`` is ~400 bytes that expand to 9**6 = 531,441 values.
    """
    rows = ['    l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels):
        aliases = ",".join([f"*l{level - 1}"] * 9)
        rows.append(f"    l{level}: &l{level} [{aliases}]")
    return (
        "apiVersion: corral/v1\nkind: ModelEndpoint\nmetadata: {name: bomb}\n"
        "spec:\n  provider: scripted\n  options:\n" + "\n".join(rows) + "\n"
    )


def nested(depth: int, *, flow: bool) -> str:
    """A ModelEndpoint whose ``options`` nest ``depth`` lists deep (flow or block style)."""
    # block style: lists in compact notation ("- - - 1"), so 1,000 levels stay small
    value = " " + "[" * depth + "]" * depth if flow else "\n      " + "- " * depth + "1\n"
    return (
        "apiVersion: corral/v1\nkind: ModelEndpoint\nmetadata: {name: deep}\n"
        f"spec:\n  provider: scripted\n  options:\n    x:{value}"
    )


# a mapping that contains itself: no limit to count it by, and a tree walk would never end
RECURSIVE_ALIAS = (
    "apiVersion: corral/v1\nkind: ModelEndpoint\nmetadata: {name: loop}\n"
    "spec:\n  provider: scripted\n  options: &a {y: *a}\n"
)


def deep_json_document(depth: int) -> str:
    document = {
        "apiVersion": "corral/v1",
        "kind": "ModelEndpoint",
        "metadata": {"name": "deep"},
        "spec": {"provider": "scripted", "options": {"x": "HOLE"}},
    }
    return json.dumps(document).replace('"HOLE"', "[" * depth + "]" * depth)


def padded_secret(size: int) -> str:
    """A valid Secret document of about ``size`` bytes."""
    return (
        "apiVersion: corral/v1\nkind: Secret\nmetadata: {name: big}\n"
        f"spec:\n  value: {'x' * size}\n"
    )


# --------------------------------------------------------------------------- documents over the API


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    limits = DocumentLimits(max_bytes=64 * 1024)  # under the body limit, so it is the one hit
    with LiveServer(tmp_path_factory.mktemp("hostile"), workers=0, document_limits=limits) as live:
        yield live


@pytest.fixture
def admin(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client(server.admin) as client:
        yield client


def post_yaml(client: httpx.Client, text: str) -> httpx.Response:
    return client.post(
        "/v1/resources", content=text.encode(), headers={"Content-Type": "application/yaml"}
    )


def post_json(client: httpx.Client, text: str) -> httpx.Response:
    return client.post(
        "/v1/resources", content=text.encode(), headers={"Content-Type": "application/json"}
    )


def assert_too_complex(response: httpx.Response, limit: str) -> None:
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["code"] == "document_too_complex"
    assert f"limit {limit}=" in problem["detail"]
    assert problem["errors"][0]["field"] == "body"


def assert_nothing_stored(client: httpx.Client) -> None:
    response = client.get("/v1/resources")
    assert response.status_code == 200
    assert response.json()["items"] == []


def test_an_alias_bomb_is_refused_while_parsing_over_the_api(
    server: LiveServer, admin: httpx.Client
) -> None:
    bomb = alias_bomb(6)
    assert len(bomb) < 450
    started = time.monotonic()
    response = post_yaml(admin, bomb)
    assert time.monotonic() - started < QUICK_SECONDS
    assert_too_complex(response, "max_nodes")
    assert response.json()["errors"][0]["line"] is not None
    assert_nothing_stored(admin)
    assert admin.get("/healthz").status_code == 200


@pytest.mark.parametrize("flow", [True, False], ids=["flow", "block"])
def test_yaml_nested_1000_deep_is_422_not_500_over_the_api(admin: httpx.Client, flow: bool) -> None:
    response = post_yaml(admin, nested(1000, flow=flow))
    assert_too_complex(response, "max_depth")
    assert_nothing_stored(admin)


def test_json_nested_1000_deep_is_422_not_500_over_the_api(admin: httpx.Client) -> None:
    response = post_json(admin, deep_json_document(1000))
    assert_too_complex(response, "max_depth")
    # also as the second document of a list: the error names it
    listed = f"[{deep_json_document(1)}, {deep_json_document(200)}]"
    response = post_json(admin, listed)
    assert_too_complex(response, "max_depth")
    assert_nothing_stored(admin)


def test_json_nested_just_within_the_limit_is_applied(admin: httpx.Client) -> None:
    response = post_json(admin, deep_json_document(60))
    assert response.status_code == 200, response.text
    assert admin.delete("/v1/resources/ModelEndpoint/deep").status_code == 204


def test_a_document_over_the_size_limit_is_422_naming_it(admin: httpx.Client) -> None:
    response = post_yaml(admin, padded_secret(80 * 1024))
    assert_too_complex(response, "max_bytes")
    assert "CORRAL_MAX_DOCUMENT_BYTES" in response.json()["detail"]
    assert_nothing_stored(admin)


def test_a_recursive_alias_is_invalid_yaml_not_500(admin: httpx.Client) -> None:
    text = RECURSIVE_ALIAS
    response = post_yaml(admin, text)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["code"] == "invalid_resource"
    assert "alias" in problem["errors"][0]["reason"]


def test_deep_json_bodies_of_other_endpoints_are_4xx_not_500(admin: httpx.Client) -> None:
    # (a guard: FastAPI parses these bodies itself and already refuses them)
    for path, field in (("/v1/tasks", '"agent": "x", "input"'), ("/v1/agents/x/prompt", '"input"')):
        body = "{" + field + ": " + "[" * 100_000 + "]" * 100_000 + "}"
        response = admin.post(path, content=body, headers={"Content-Type": "application/json"})
        assert response.status_code in (400, 422), response.text


def test_a_control_character_the_yaml_reader_refuses_is_422_naming_its_line_not_500(
    admin: httpx.Client,
) -> None:
    text = "apiVersion: corral/v1\nkind: Secret\nmetadata: {name: nul}\nspec: {value: a\x00b}\n"
    response = post_yaml(admin, text)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["code"] == "invalid_resource"
    assert problem["errors"][0]["line"] == 4
    assert "#x0000 is not allowed" in problem["errors"][0]["reason"]
    assert_nothing_stored(admin)


# --------------------------------------------------------------------------- documents through the CLI


def corral(
    home: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real command in a subprocess (its own ``main()``, as a user runs it)."""
    return subprocess.run(
        [sys.executable, "-m", "corral", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**_base_env(), "CORRAL_HOME": str(home), **(env or {})},
    )


def _base_env() -> dict[str, str]:
    # (wide, so rich does not wrap the one line)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    return env | {"COLUMNS": "400"}


def assert_one_line(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_an_argument_that_is_not_utf8_exits_2_with_one_line(tmp_path: Path) -> None:
    # a byte that is not UTF-8 reaches Python as a lone surrogate, which no store encodes
    assert_one_line(corral(tmp_path, "logs", "run_\udcff"), 2, "argument 2 is not UTF-8 text")


def test_cli_numbers_out_of_the_apis_range_exit_2_and_create_nothing(tmp_path: Path) -> None:
    """The local CLI took what the API refuses (a priority of 10**11) or ignored it (a limit)."""
    file = tmp_path / "agent.yaml"
    file.write_text(
        "apiVersion: corral/v1\nkind: ModelEndpoint\nmetadata: {name: canned}\n"
        "spec: {provider: scripted, script: [{text: fine}]}\n---\n"
        "apiVersion: corral/v1\nkind: Agent\nmetadata: {name: a}\nspec: {model: canned}\n"
    )
    assert corral(tmp_path, "apply", "-f", str(file)).returncode == 0
    for args in (
        ("submit", "a", "hi", "--priority", "99999999999"),
        ("submit", "a", "hi", "--delay", "1e12"),
        ("tasks", "list", "--limit", "0"),
        ("tasks", "list", "--limit", "501"),
    ):
        result = corral(tmp_path, *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
    listed = corral(tmp_path, "tasks", "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []


def test_corral_apply_refuses_an_alias_bomb_quickly_with_one_line(tmp_path: Path) -> None:
    file = tmp_path / "bomb.yaml"
    file.write_text(alias_bomb(6))
    started = time.monotonic()
    result = corral(tmp_path / "home", "apply", "-f", str(file))
    assert time.monotonic() - started < 20  # (a Python start included, on a loaded machine)
    assert_one_line(result, 2, "bomb.yaml:", "max_nodes")


@pytest.mark.parametrize("flow", [True, False], ids=["flow", "block"])
def test_corral_apply_of_yaml_nested_1000_deep_exits_2_with_one_line(
    tmp_path: Path, flow: bool
) -> None:
    file = tmp_path / "deep.yaml"
    file.write_text(nested(1000, flow=flow))
    assert_one_line(corral(tmp_path / "home", "apply", "-f", str(file)), 2, "max_depth")


def test_corral_apply_refuses_a_file_over_the_size_limit_set_by_the_environment(
    tmp_path: Path,
) -> None:
    file = tmp_path / "big.yaml"
    file.write_text(padded_secret(3000))
    home = tmp_path / "home"
    result = corral(home, "apply", "-f", str(file), env={"CORRAL_MAX_DOCUMENT_BYTES": "2048"})
    assert_one_line(result, 2, "big.yaml", "max_bytes=2048")
    # the default limit takes it
    assert corral(home, "apply", "-f", str(file)).returncode == 0


def test_corral_apply_of_a_recursive_alias_exits_2_with_one_line(tmp_path: Path) -> None:
    file = tmp_path / "loop.yaml"
    file.write_text(RECURSIVE_ALIAS)
    assert_one_line(corral(tmp_path / "home", "apply", "-f", str(file)), 2, "alias")


def test_prompt_object_schema_nested_1000_deep_exits_2_with_one_line(tmp_path: Path) -> None:
    schema = tmp_path / "deep.json"
    schema.write_text("[" * 1000 + "]" * 1000)
    result = corral(tmp_path / "home", "prompt-object", "any", "hi", "--schema", str(schema))
    assert_one_line(result, 2, "deep.json:1", "max_depth")


def test_prompt_object_schema_that_is_not_utf8_exits_2_with_one_line(tmp_path: Path) -> None:
    schema = tmp_path / "latin1.json"
    schema.write_bytes('{"description": "café"}'.encode("latin-1"))
    result = corral(tmp_path / "home", "prompt-object", "any", "hi", "--schema", str(schema))
    assert_one_line(result, 2, "latin1.json", "not UTF-8")


# --------------------------------------------------------------------------- CLI errors: one line

# A command added to the real app, as a plugin would add one, that fails the way no
# Corral code should: the entry point must still print one line.
_FAILING_COMMAND = """
import sys
from corral.cli import main as cli

@cli.app.command("explode")
def explode() -> None:
    def down(n: int) -> int:
        return down(n + 1)
    down(0)

cli.main()
"""


def test_an_unexpected_error_is_one_line_and_exit_1_and_a_traceback_only_with_debug(
    tmp_path: Path,
) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", _FAILING_COMMAND, *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**_base_env(), "CORRAL_HOME": str(tmp_path / "home")},
        )

    result = run("explode")
    assert_one_line(result, 1, "internal error: RecursionError", "--debug")
    with_debug = run("--debug", "explode")
    assert with_debug.returncode != 0
    assert "Traceback" in with_debug.stderr and "RecursionError" in with_debug.stderr


# --------------------------------------------------------------------------- tool-call arguments

ECHO_TOOL = f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: echo}}
spec:
  type: python
  python: {{function: "server_tools:slow_echo", path: "{TESTS}"}}
"""


def model_and_agent(base_url: str) -> str:
    return f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: fake}}
spec: {{provider: openai, model: test-model, base_url: "{base_url}", retry: {{max_attempts: 1}}}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: writer}}
spec:
  model: fake
  tools: [echo]
  stream: false
---
{ECHO_TOOL}"""


async def test_a_2mb_tool_argument_is_invalid_input_journaled_once_cut_and_the_run_goes_on(
    env: tuple[Store, Settings], fake_openai: FakeOpenAIServer
) -> None:
    db, settings = env
    huge = "A" * (2 * 1024 * 1024)
    fake_openai.add_reply(
        FakeReply(tool_calls=[FakeToolCall("echo", {"text": huge}, "call_huge")]),
        FakeReply(tool_calls=[FakeToolCall("echo", {"text": "short"}, "call_short")]),
        FakeReply(text="done"),
    )
    await db.apply(load_text(model_and_agent(fake_openai.base_url), "test.yaml"))

    record = await run_agent(db, settings, "writer", "write a lot")

    assert record.state is RunState.SUCCEEDED, record.error
    assert record.output == "done"
    events = await db.list_events(record.id)
    stored = json.dumps([e.data.to_dict() for e in events])
    assert "A" * 1000 not in stored  # not once in full: cut before it was journaled
    assert len(stored) < 64 * 1024
    [cut_result, short_result] = [
        e.data.to_dict() for e in events if e.type is EventType.TOOL_RESULT
    ]
    assert cut_result["error"]["code"] == "invalid_input"
    assert "max_input_bytes" in cut_result["error"]["reason"]
    assert short_result["output"] == "short" and short_result["error"] is None
    # the refused call never started: only the short one has a tool.call
    assert [e.data.call_id for e in events if e.type is EventType.TOOL_CALL] == ["call_short"]
    # the model saw its call cut (with a glimpse), and the error saying why
    second_request = fake_openai.requests[1].json["messages"]
    [assistant] = [m for m in second_request if m["role"] == "assistant"]
    seen = json.loads(assistant["tool_calls"][0]["function"]["arguments"])
    assert "max_input_bytes" in seen["corral_arguments_not_kept"]
    assert seen["start"].startswith('{"text": "AAA')
    [tool_message] = [m for m in second_request if m["role"] == "tool"]
    assert json.loads(tool_message["content"])["error"]["code"] == "invalid_input"
    # replaying the journal gives the conversation the live run had
    replayed = replay(events).messages
    assert [dump(m) for m in replayed] == [dump(m) for m in record.messages]
    assert all(isinstance(m, Message) for m in replayed)


async def test_a_tool_argument_cap_is_set_per_tool(
    env: tuple[Store, Settings], fake_openai: FakeOpenAIServer
) -> None:
    db, settings = env
    fake_openai.add_reply(
        FakeReply(tool_calls=[FakeToolCall("echo", {"text": "x" * 200})]),
        FakeReply(text="done"),
    )
    spec = model_and_agent(fake_openai.base_url) + "  max_input_bytes: 128\n"
    await db.apply(load_text(spec, "test.yaml"))
    record = await run_agent(db, settings, "writer", "hi")
    assert record.state is RunState.SUCCEEDED, record.error
    events = await db.list_events(record.id)
    [result] = [e.data.to_dict() for e in events if e.type is EventType.TOOL_RESULT]
    assert result["error"]["code"] == "invalid_input"
    assert "(128, its max_input_bytes)" in result["error"]["reason"]


async def test_tool_arguments_nested_too_deep_are_invalid_input_not_a_crash(
    env: tuple[Store, Settings], fake_openai: FakeOpenAIServer
) -> None:
    db, settings = env
    deep = '{"text": ' + "[" * 5000 + "]" * 5000 + "}"
    fake_openai.add_reply(
        FakeReply(tool_calls=[FakeToolCall("echo", deep)]),
        FakeReply(text="done"),
    )
    await db.apply(load_text(model_and_agent(fake_openai.base_url), "test.yaml"))
    record = await run_agent(db, settings, "writer", "hi")
    assert record.state is RunState.SUCCEEDED, record.error
    events = await db.list_events(record.id)
    [result] = [e.data.to_dict() for e in events if e.type is EventType.TOOL_RESULT]
    assert result["error"]["code"] == "invalid_input"
    assert "nested deeper than 64 levels" in result["error"]["reason"]
