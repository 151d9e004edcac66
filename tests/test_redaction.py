"""Secrets never leave a run in clear: not in its record, events, messages, approvals,
sessions, what the model sees, the logs, nor anywhere in the database file.

One ``corral serve`` (uvicorn, embedded worker, SQLite) serves the module; the model
is the fake OpenAI-compatible server over real HTTP under the real ``openai`` SDK,
and the tools are a real ``exec`` program and a real ``python`` function. The
secrets come from the server's environment (``from_env``), so the database never
holds them legitimately: any trace of them in its file is a leak.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.core.redaction import SCAN_FORMS, Redactor, install_log_redaction
from corral.testing.fake_anthropic import FakeAnthropicServer
from corral.testing.fake_openai import FakeOpenAIServer, FakeReply, FakeToolCall
from fixtures_models import (
    anthropic_server_fixture,
    fake_anthropic_fixture,
    fake_openai_fixture,
    openai_server_fixture,
)
from server_harness import LiveServer, apply, wait_for

__all__ = [
    "anthropic_server_fixture",
    "fake_anthropic_fixture",
    "fake_openai_fixture",
    "openai_server_fixture",
]

TESTS = Path(__file__).parent
PROBE = TESTS / "tool_programs" / "probe.py"

# A model key goes out in an HTTP header: printable ASCII, quote and backslash included.
MODEL_KEY = 'sk-"quoted\\back-MODELKEY-7f3a9c2e'
# A tool secret has everything that changes when text is encoded.
TOOL_SECRET = 'tok-"q\\b\n\u00fcn\u00ef-TOOLSECRET-5b1d8e'
# Basic auth: the header carries base64("user:password"); a server may echo the password.
PASSWORD = 'pa"ss\\w\u00f6rd-BASICPW-93c1'
BASIC = f"robot:{PASSWORD}"
SECRETS = {
    "CORRAL_TEST_MODEL_KEY": MODEL_KEY,
    "CORRAL_TEST_TOOL_SECRET": TOOL_SECRET,
    "CORRAL_TEST_BASIC": BASIC,
}
# A key no Secret names: the anthropic SDK reads it from ANTHROPIC_API_KEY itself.
SDK_KEY = "sk-ant-SDKENVKEY-0c4f2a91d7"
ALL = (MODEL_KEY, TOOL_SECRET, PASSWORD, SDK_KEY)


def traces(secret: str) -> list[str]:
    """What of ``secret`` must never show: a part of it that every escaped form keeps, and
    its base64, base64url and hex forms."""
    raw = secret.encode()
    return [
        secret[-17:],  # the marker: plain, JSON-escaped and repr forms all contain it
        base64.b64encode(raw).decode().rstrip("=")[:-2],
        base64.urlsafe_b64encode(raw).decode().rstrip("=")[:-2],
        raw.hex(),
    ]


def assert_clean(text: str, *secrets: str) -> None:
    for secret in secrets or ALL:
        for trace in traces(secret):
            assert trace not in text, f"{trace!r} leaked"


def assert_database_clean(server: LiveServer) -> None:
    """Nothing in the database files (WAL included) holds a trace of a secret."""
    files = sorted(server.home.glob("corral.db*"))
    assert files
    for path in files:
        data = path.read_bytes()
        for secret in ALL:
            for trace in traces(secret):
                for form in {trace.encode(), json.dumps(trace)[1:-1].encode()}:
                    assert form not in data, f"{trace!r} is in {path.name}"


def stored_row(server: LiveServer, run_id: str) -> dict[str, Any]:
    """The run's row as SQLite holds it, read past Corral."""
    with sqlite3.connect(server.home / "corral.db") as db:
        db.row_factory = sqlite3.Row
        row = db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
    assert row is not None
    return dict(row)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    saved = {name: os.environ.get(name) for name in SECRETS}
    os.environ.update(SECRETS)
    try:
        with LiveServer(tmp_path_factory.mktemp("home")) as live:
            yield live
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def resources(agent: str, base_url: str, *, stream: bool = False, extra_tools: str = "") -> str:
    """Both secrets, a model endpoint keyed with one, the probe tool given the other."""
    return f"""
apiVersion: corral/v1
kind: Secret
metadata: {{name: model-key}}
spec: {{from_env: CORRAL_TEST_MODEL_KEY}}
---
apiVersion: corral/v1
kind: Secret
metadata: {{name: tool-token}}
spec: {{from_env: CORRAL_TEST_TOOL_SECRET}}
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: {agent}-model}}
spec:
  provider: openai
  model: test-model
  base_url: {base_url}
  api_key: {{secret: model-key}}
  retry: {{max_attempts: 1}}
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: probe}}
spec:
  type: exec
  exec:
    command: ["{sys.executable}", "{PROBE}"]
    env: {{SERVICE_TOKEN: {{secret: tool-token}}}}
  parameters: {{type: object, properties: {{mode: {{type: string}}, note: {{type: string}}}}}}
---
{extra_tools}apiVersion: corral/v1
kind: Agent
metadata: {{name: {agent}}}
spec:
  model: {agent}-model
  tools: [probe{", fail_with_env" if extra_tools else ""}]
  stream: {str(stream).lower()}
"""


def prompt(client: httpx.Client, agent: str, **body: Any) -> dict[str, Any]:
    """Prompt the agent and wait; the task as ``GET /v1/tasks/{id}`` answers (with messages)."""
    response = client.post(f"/v1/agents/{agent}/prompt", json={"input": "go", **body})
    assert response.status_code == 200, response.text
    assert_clean(response.text)
    task = client.get(f"/v1/tasks/{response.json()['id']}")
    assert task.status_code == 200
    result: dict[str, Any] = task.json()
    return result


def everything_about(client: httpx.Client, run_id: str, agent: str) -> str:
    """Every answer of the API about one run, as text."""
    answers = [
        client.get(f"/v1/tasks/{run_id}"),
        client.get("/v1/tasks", params={"agent": agent}),
        client.get(f"/v1/runs/{run_id}/events"),
        client.get("/v1/approvals", params={"run_id": run_id}),
    ]
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    return "\n".join(a.text for a in answers)


@pytest.mark.parametrize("stream", [False, True])
def test_a_provider_error_echoing_the_bearer_key_is_redacted_in_the_record_and_the_store(
    server: LiveServer, client: httpx.Client, fake_openai: FakeOpenAIServer, stream: bool
) -> None:
    agent = f"echoed-key-{str(stream).lower()}"
    apply(client, resources(agent, fake_openai.base_url, stream=stream))
    fake_openai.fail(400, message=f"bad key: Bearer {MODEL_KEY}")

    task = prompt(client, agent)

    assert fake_openai.requests[-1].headers["authorization"] == f"Bearer {MODEL_KEY}"
    assert task["state"] == "failed"
    assert "bad key: Bearer [REDACTED:model-key]" in task["error"]["message"]
    assert_clean(json.dumps(task))
    answers = everything_about(client, task["id"], agent)
    assert "[REDACTED:model-key]" in answers
    assert_clean(answers)
    row = stored_row(server, task["id"])
    assert "[REDACTED:model-key]" in row["error"]
    assert_clean(json.dumps(row, default=str))
    assert_database_clean(server)


def test_a_retried_provider_error_echoing_the_key_is_redacted_in_each_attempts_error(
    server: LiveServer, client: httpx.Client, fake_openai: FakeOpenAIServer
) -> None:
    docs = resources("retried-key", fake_openai.base_url) + "  max_attempts: 2\n"
    apply(client, docs)
    fake_openai.fail(503, times=2, message=f"upstream rejected Bearer {MODEL_KEY}")

    task = prompt(client, "retried-key")

    assert task["state"] == "dead_letter"
    events = client.get(f"/v1/runs/{task['id']}/events").json()["items"]
    errors = [e["data"] for e in events if e["type"] == "error"]
    assert [e.get("retry") for e in errors] == [2, None]  # the worker's, then the loop's
    assert all("[REDACTED:model-key]" in e["message"] for e in errors)
    assert "[REDACTED:model-key]" in task["error"]["message"]
    assert_clean(everything_about(client, task["id"], "retried-key") + json.dumps(task))
    assert_database_clean(server)


def test_a_key_the_provider_sdk_read_from_its_environment_is_redacted_too(
    server: LiveServer,
    client: httpx.Client,
    fake_anthropic: FakeAnthropicServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", SDK_KEY)
    apply(
        client,
        f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: claude-env-key}}
spec:
  provider: anthropic
  model: test-model
  base_url: {fake_anthropic.base_url}
  retry: {{max_attempts: 1}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: env-key}}
spec: {{model: claude-env-key, stream: false}}
""",
    )
    fake_anthropic.fail(401, message=f"invalid x-api-key: {SDK_KEY}")

    task = prompt(client, "env-key")

    assert SDK_KEY in " ".join(fake_anthropic.requests[-1].headers.values())  # it was sent
    assert task["state"] == "failed"
    assert "[REDACTED:claude-env-key-api-key]" in task["error"]["message"]
    assert_clean(everything_about(client, task["id"], "env-key") + json.dumps(task))
    assert_database_clean(server)


def test_tool_secrets_with_quotes_backslashes_newlines_and_non_ascii_never_leave_the_run(
    server: LiveServer, client: httpx.Client, fake_openai: FakeOpenAIServer
) -> None:
    apply(client, resources("leaky-tools", fake_openai.base_url, stream=True))
    fake_openai.add_reply(
        FakeReply(
            tool_calls=[
                FakeToolCall("probe", {"mode": "echo"}),  # its environment, as escaped JSON
                FakeToolCall("probe", {"mode": "leak"}),  # plain, base64, base64url, hex
                FakeToolCall("probe", {"mode": "leak-stderr"}),  # in the error's stderr
            ]
        ),
        # the model repeats the secret; the fake streams its answer in pieces
        FakeReply(text=f"The service token is {TOOL_SECRET} (json: {json.dumps(TOOL_SECRET)})"),
    )

    task = prompt(client, "leaky-tools", session="redaction-session")

    assert task["state"] == "succeeded", task["error"]
    results = [m["content"] for m in task["messages"] if m["role"] == "tool"]
    assert len(results) == 3
    assert "[REDACTED:tool-token]" in results[0]  # the echoed environment
    assert results[1].count("[REDACTED:tool-token]") == 4  # each form of it
    assert "cannot log in with [REDACTED:tool-token]" in results[2]
    assert task["output"].startswith("The service token is [REDACTED:tool-token]")
    # what the model was sent back holds no secret either (only the key, in its header)
    assert_clean(json.dumps([r.body for r in fake_openai.requests]))
    answers = everything_about(client, task["id"], "leaky-tools")
    events = client.get(f"/v1/runs/{task['id']}/events").json()["items"]
    deltas = "".join(e["data"]["text"] for e in events if e["type"] == "text.delta")
    assert deltas == task["output"]  # the streamed pieces, redacted across their seams
    session = client.get("/v1/sessions/redaction-session/messages")
    assert session.status_code == 200
    assert "[REDACTED:tool-token]" in session.text
    assert_clean(answers + session.text + json.dumps(task))
    assert_clean(json.dumps(stored_row(server, task["id"]), default=str))
    assert_database_clean(server)


def test_a_session_summary_that_repeats_a_secret_is_stored_redacted(
    server: LiveServer, client: httpx.Client, fake_openai: FakeOpenAIServer
) -> None:
    policy = (
        "  session: {max_history_tokens: 100, compaction: summarize, keep_recent_messages: 0}\n"
    )
    apply(client, resources("summarizer", fake_openai.base_url) + policy)
    fake_openai.add_reply(
        FakeReply(text="a long answer " * 40),  # the first run: history past 100 tokens
        FakeReply(text=f"Summary: the user's token is {TOOL_SECRET}"),  # the compaction
        FakeReply(text="ok"),  # the second run
    )

    first = prompt(client, "summarizer", session="compacted-session")
    second = prompt(client, "summarizer", session="compacted-session")

    assert (first["state"], second["state"]) == ("succeeded", "succeeded")
    messages = client.get(
        "/v1/sessions/compacted-session/messages", params={"include_hidden": "true"}
    )
    assert messages.status_code == 200
    assert "Summary: the user's token is [REDACTED:tool-token]" in messages.text
    assert_clean(messages.text + everything_about(client, second["id"], "summarizer"))
    assert_database_clean(server)


def test_the_exception_text_of_a_python_tool_is_redacted(
    server: LiveServer, client: httpx.Client, fake_openai: FakeOpenAIServer
) -> None:
    fail_tool = f"""apiVersion: corral/v1
kind: Tool
metadata: {{name: fail_with_env}}
spec:
  type: python
  python: {{function: "server_tools:fail_with_env", path: "{TESTS}"}}
---
"""
    apply(client, resources("raising-tool", fake_openai.base_url, extra_tools=fail_tool))
    fake_openai.add_reply(
        FakeReply(
            tool_calls=[
                FakeToolCall("fail_with_env", {"variable": "CORRAL_TEST_TOOL_SECRET"}),
                FakeToolCall("fail_with_env", {"variable": "CORRAL_TEST_MODEL_KEY"}),
            ]
        ),
        FakeReply(text="gave up"),
    )
    task = prompt(client, "raising-tool")

    assert task["state"] == "succeeded", task["error"]
    errors = [m["content"] for m in task["messages"] if m["role"] == "tool"]
    # KeyError quotes its argument as a repr: \\n and \\\\ where the secret has a newline
    # and a backslash
    assert "KeyError: '[REDACTED:tool-token]'" in errors[0]
    assert "KeyError: '[REDACTED:model-key]'" in errors[1]
    assert_clean(everything_about(client, task["id"], "raising-tool") + json.dumps(task))
    assert_clean(json.dumps([r.body for r in fake_openai.requests]))
    assert_database_clean(server)


def test_the_arguments_of_an_approval_are_redacted(
    server: LiveServer, client: httpx.Client, fake_openai: FakeOpenAIServer
) -> None:
    apply(
        client,
        resources("asks-first", fake_openai.base_url).replace(
            "  tools: [probe]", "  tools: [probe]\n  approval: {policy: always}"
        ),
    )
    fake_openai.add_reply(
        FakeReply(tool_calls=[FakeToolCall("probe", {"mode": "echo", "note": TOOL_SECRET})])
    )

    task = prompt(client, "asks-first")

    assert task["state"] == "waiting_approval"
    approvals = wait_for(
        lambda: client.get("/v1/approvals", params={"run_id": task["id"]}).json()["items"]
    )
    assert "[REDACTED:tool-token]" in approvals[0]["arguments"]
    assert "[REDACTED:tool-token]" in task["pending_approvals"][0]["arguments"]
    assert_clean(everything_about(client, task["id"], "asks-first") + json.dumps(task))
    assert_database_clean(server)


def test_an_mcp_server_that_prints_its_secret_and_dies_fails_the_run_redacted(
    server: LiveServer, client: httpx.Client, fake_openai: FakeOpenAIServer
) -> None:
    blurts = f"""apiVersion: corral/v1
kind: McpServer
metadata: {{name: blurts}}
spec:
  transport: stdio
  command:
    - {sys.executable}
    - -c
    - "import os, sys; sys.stderr.write('my token: ' + os.environ['TOKEN']); sys.exit(1)"
  env: {{TOKEN: {{secret: tool-token}}}}
---
"""
    docs = resources("mcp-blurts", fake_openai.base_url, extra_tools=blurts)
    apply(client, docs.replace("tools: [probe, fail_with_env]", 'tools: [probe, "mcp:blurts/*"]'))

    task = prompt(client, "mcp-blurts")

    assert task["state"] == "failed"
    assert "my token: [REDACTED:tool-token]" in task["error"]["message"]
    assert_clean(everything_about(client, task["id"], "mcp-blurts") + json.dumps(task))
    assert_clean(json.dumps(stored_row(server, task["id"]), default=str))
    assert_database_clean(server)


def test_the_password_of_basic_auth_echoed_in_a_json_error_body_is_redacted(
    server: LiveServer, client: httpx.Client, fake_openai: FakeOpenAIServer
) -> None:
    with FakeOpenAIServer() as target:
        target.fail(401, message=f"wrong password {PASSWORD} for robot")
        login = f"""apiVersion: corral/v1
kind: Secret
metadata: {{name: basic-creds}}
spec: {{from_env: CORRAL_TEST_BASIC}}
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: login}}
spec:
  type: http
  http:
    url: {target.base_url}/chat/completions
    auth: {{type: basic, secret: basic-creds}}
    allow_private: true
  parameters: {{type: object}}
---
"""
        docs = resources("basic-auth", fake_openai.base_url, extra_tools=login)
        apply(client, docs.replace("tools: [probe, fail_with_env]", "tools: [probe, login]"))
        fake_openai.add_reply(FakeReply(tool_calls=[FakeToolCall("login", {})]))
        fake_openai.add_reply(FakeReply(text="could not log in"))

        task = prompt(client, "basic-auth")

        sent = base64.b64encode(BASIC.encode()).decode()
        assert target.requests[-1].headers["authorization"] == f"Basic {sent}"
    assert task["state"] == "succeeded", task["error"]
    [error] = [m["content"] for m in task["messages"] if m["role"] == "tool"]
    assert "HTTP 401" in error and "[REDACTED:basic-creds]" in error
    assert_clean(everything_about(client, task["id"], "basic-auth") + json.dumps(task))
    assert_clean(json.dumps([r.body for r in fake_openai.requests]))
    assert_database_clean(server)


def test_logs_never_print_a_secret_an_agent_of_the_process_resolved(
    server: LiveServer, client: httpx.Client, fake_openai: FakeOpenAIServer
) -> None:
    apply(client, resources("logged", fake_openai.base_url))
    fake_openai.add_reply(FakeReply(text="hello"))
    assert prompt(client, "logged")["state"] == "succeeded"  # its build resolved both secrets
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        install_log_redaction()  # as every CLI command does, after logging is configured
        try:
            raise KeyError(TOOL_SECRET)
        except KeyError:
            logging.getLogger("corral.anything").exception("failed with %s", MODEL_KEY)
    finally:
        root.removeHandler(handler)
    printed = log.getvalue()
    assert "failed with [REDACTED:model-key]" in printed
    assert "KeyError: '[REDACTED:tool-token]'" in printed  # the traceback too
    assert_clean(printed)


#: other secrets enough for a redactor past SCAN_FORMS forms (it matches with a regex then)
CROWD = {f"other-{n}": f"other+secret/{n:04d}" for n in range(30)}


@pytest.mark.parametrize("crowded", [False, True], ids=["few-forms", "many-forms"])
@pytest.mark.parametrize(
    "secret", [MODEL_KEY, TOOL_SECRET, "p@ss:w/o+rd=", "\u00e9t\u00e9-\U0001f511-cl\u00e9"]
)
def test_every_form_of_a_secret_is_redacted_wherever_it_sits(secret: str, crowded: bool) -> None:
    redactor = Redactor({"s": secret, **(CROWD if crowded else {})})
    assert (len(redactor._names) > SCAN_FORMS) is crowded
    raw = secret.encode()
    forms = [
        secret,
        json.dumps(secret),
        json.dumps(secret, ensure_ascii=False),
        repr(secret),
        repr(secret + "'\""),
        base64.b64encode(raw).decode(),
        base64.urlsafe_b64encode(raw).decode(),
        raw.hex(),
        raw.hex().upper(),
    ]
    for form in forms:
        text = redactor.text(f"<<{form}>>")
        assert "[REDACTED:s]" in text, form
        assert secret[-6:] not in text and raw.hex()[-8:] not in text, form
    # inside a longer text encoded in one piece, at each of the three alignments
    for prefix in (b"user:", b"us:", b"u:"):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            text = redactor.text(encode(prefix + raw).decode())
            assert "[REDACTED:s]" in text, (prefix, encode)
    assert redactor.data({secret: [secret, 1, None]}) == {"[REDACTED:s]": ["[REDACTED:s]", 1, None]}
    # data holding text that was encoded before (a JSON body, an exception's repr)
    for form in forms:
        [text] = redactor.data({"event": {"texts": [f"<<{form}>>"]}})["event"]["texts"]
        assert "[REDACTED:s]" in text and secret[-6:] not in text, form


def test_short_values_are_not_redacted_and_encoded_forms_only_from_eight_characters() -> None:
    redactor = Redactor({"tiny": "abc", "short": "s3cr3t!", "long": "l0ng-s3cret"})
    assert redactor.text("abc s3cr3t! l0ng-s3cret") == "abc [REDACTED:short] [REDACTED:long]"
    assert redactor.text(b"s3cr3t!".hex()) == b"s3cr3t!".hex()
    assert redactor.text(b"l0ng-s3cret".hex()) == "[REDACTED:long]"
    assert not Redactor({"tiny": "abc"})


@pytest.mark.parametrize("crowded", [False, True], ids=["few-forms", "many-forms"])
def test_overlapping_secrets_leave_no_character_of_either(crowded: bool) -> None:
    redactor = Redactor({"a": "abcdefgh", "b": "xyzabc", **(CROWD if crowded else {})})
    assert redactor.text("..xyzabcdefgh..") == "..[REDACTED:b].."
    assert redactor.found_in("..xyzabc..") and not redactor.found_in("..xyz abc..")
    assert redactor.cut_after("..xyzabcdefgh..", 4) == 8  # past the secret begun before it


def test_a_secret_split_across_streamed_pieces_is_caught() -> None:
    secret = "split-me-0123456789"
    stream = Redactor({"s": secret}).stream()
    text = f"before {secret} after"
    out = [stream.feed(text[i : i + 3]) for i in range(0, len(text), 3)] + [stream.flush()]
    assert "".join(out) == "before [REDACTED:s] after"
    assert all(secret[4:10] not in piece for piece in out)


@pytest.mark.parametrize("crowded", [False, True], ids=["few-forms", "many-forms"])
def test_upper_and_lower_case_and_doubly_json_escaped_forms_are_redacted(crowded: bool) -> None:
    secret = 'Tok-"q\\b-\u00fcn-Secret-42'
    redactor = Redactor({"s": secret, **(CROWD if crowded else {})})
    once = json.dumps(secret)
    forms = {
        "upper": secret.upper(),
        "lower": secret.lower(),
        "upper, JSON-escaped": json.dumps(secret.upper()),
        "JSON text in a JSON string": json.dumps(once),
        "the same, not ASCII-escaped": json.dumps(json.dumps(secret, ensure_ascii=False)),
        "in a JSON document in a JSON string": json.dumps(json.dumps({"key": secret})),
    }
    for name, form in forms.items():
        text = redactor.text(f"<<{form}>>")
        assert "[REDACTED:s]" in text and "secret-42" not in text.lower(), (name, text)
        [data] = redactor.data([f"<<{form}>>"])
        assert "[REDACTED:s]" in data and "secret-42" not in data.lower(), (name, data)
    # out of scope, as documented: reversed, split, mixed case
    assert redactor.text(secret[::-1]) == secret[::-1]
    assert redactor.text(secret.swapcase()) == secret.swapcase()


def test_a_secret_of_another_agent_of_the_namespace_is_redacted_in_this_agents_runs(
    server: LiveServer, client: httpx.Client, fake_openai: FakeOpenAIServer
) -> None:
    """The bystander resolves only the model key; the tool token is another agent's (the
    probe's Secret). It reached the bystander's model anyway (a shared file, a memory, a
    child's answer): its runs redact it too, as every Secret of the namespace."""
    apply(client, resources("token-owner", fake_openai.base_url))
    apply(
        client,
        f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: bystander-model}}
spec:
  provider: openai
  model: test-model
  base_url: {fake_openai.base_url}
  api_key: {{secret: model-key}}
  retry: {{max_attempts: 1}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: bystander}}
spec: {{model: bystander-model}}
""",
    )
    fake_openai.add_reply(FakeReply(text=f"I found {TOOL_SECRET} in a shared file"))

    task = prompt(client, "bystander")

    assert task["state"] == "succeeded", task["error"]
    assert task["output"] == "I found [REDACTED:tool-token] in a shared file"
    assert_clean(everything_about(client, task["id"], "bystander") + json.dumps(task))
    assert_database_clean(server)
