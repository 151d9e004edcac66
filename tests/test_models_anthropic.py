"""The ``anthropic`` provider against the fake Messages API server: what goes over the wire.

Every test goes through the real ``anthropic`` SDK and real HTTP on 127.0.0.1. What every
provider does (tool calls, streaming, retries, fallbacks, timeouts, errors) is in the
provider suite, ``tests/conformance/test_providers.py``.
"""

from __future__ import annotations

import pathlib

import pytest

from corral.core.errors import ConfigurationError
from corral.core.messages import Message, ModelResponse, ToolCall
from corral.models import anthropic as anthropic_provider
from corral.models.base import Model, ModelSettings, NamedTool, ToolChoice
from corral.testing.fake_anthropic import FakeAnthropicServer, FakeReply, FakeToolCall
from fixtures_models import (  # noqa: F401 - fixtures
    CLOCK,
    LOOKUP,
    anthropic_server_fixture,
    endpoint,
    fake_anthropic_fixture,
)

SETTINGS = ModelSettings()


def make(server: FakeAnthropicServer, **kw: object) -> Model:
    """The bare provider model (no retries, no pricing)."""
    spec = endpoint("anthropic", server.base_url, model="claude-test", **kw)  # type: ignore[arg-type]
    return anthropic_provider.create("claude", spec, "sk-ant-test")


async def test_a_multi_step_tool_conversation_goes_out_as_messages(
    fake_anthropic: FakeAnthropicServer,
) -> None:
    """What is sent; what comes back is the provider suite's (tests/conformance)."""
    fake_anthropic.add_reply(
        FakeReply(
            text="Let me check.",
            tool_calls=[
                FakeToolCall("lookup", {"query": "corral"}, id="toolu_a"),
                FakeToolCall("clock", {}, id="toolu_b"),
            ],
        ),
        FakeReply(text="A corral is a pen."),
    )
    model = make(fake_anthropic)
    conversation = [
        Message.system("Be brief."),
        Message.system("Answer in English."),
        Message.user("What is a corral?"),
    ]

    first = await model.request(conversation, [LOOKUP, CLOCK], SETTINGS)
    conversation += [
        first.message,
        Message.tool(first.message.tool_calls[0], "a pen for livestock"),
        Message.tool(first.message.tool_calls[1], "clock is broken", is_error=True),
    ]
    await model.request(conversation, [LOOKUP, CLOCK], SETTINGS)

    sent = fake_anthropic.requests[1]
    assert sent.path == "/v1/messages"
    # the SDK sends the key as x-api-key or (this SDK version) a bearer token
    assert "sk-ant-test" in (
        sent.headers.get("x-api-key"),
        sent.headers.get("authorization", "").removeprefix("Bearer "),
    )
    assert "anthropic-version" in sent.headers
    body = sent.json
    assert body["system"] == "Be brief.\n\nAnswer in English."
    assert body["max_tokens"] == anthropic_provider.DEFAULT_MAX_TOKENS
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "What is a corral?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {
                    "type": "tool_use",
                    "id": "toolu_a",
                    "name": "lookup",
                    "input": {"query": "corral"},
                },
                {"type": "tool_use", "id": "toolu_b", "name": "clock", "input": {}},
            ],
        },
        # both results in one user message, the failed one flagged
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_a",
                    "content": "a pen for livestock",
                    "is_error": False,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_b",
                    "content": "clock is broken",
                    "is_error": True,
                },
            ],
        },
    ]
    assert body["tools"][0] == {
        "name": "lookup",
        "description": "Look a word up.",
        "input_schema": LOOKUP.parameters,
    }
    await model.aclose()


async def test_settings_reach_the_wire(fake_anthropic: FakeAnthropicServer) -> None:
    fake_anthropic.add_reply(FakeReply(text="ok"))
    model = make(fake_anthropic)

    await model.request(
        [Message.user("hi")], [], ModelSettings(temperature=0.3, max_output_tokens=64)
    )

    body = fake_anthropic.requests[0].json
    assert body["max_tokens"] == 64
    assert body["temperature"] == 0.3
    assert "tools" not in body and "system" not in body
    await model.aclose()


def test_missing_key_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    for var in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path))  # no profiles on disk

    with pytest.raises(ConfigurationError, match="claude"):
        anthropic_provider.create("claude", endpoint("anthropic", None, model="c"), None)


def test_invalid_tool_arguments_are_sent_as_an_empty_object() -> None:
    call = ToolCall("toolu_x", "lookup", "{not json")

    _, messages = anthropic_provider.to_anthropic_messages(
        [Message.user("hi"), Message.assistant("", (call,)), Message.tool(call, "bad args")]
    )

    assert messages[1]["content"] == [
        {"type": "tool_use", "id": "toolu_x", "name": "lookup", "input": {}}
    ]


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", {"type": "auto"}),
        ("required", {"type": "any"}),
        ("none", {"type": "none"}),
        (NamedTool("lookup"), {"type": "tool", "name": "lookup"}),
    ],
)
async def test_tool_choice_is_mapped_to_the_messages_api(
    fake_anthropic: FakeAnthropicServer, choice: ToolChoice, wire: object
) -> None:
    fake_anthropic.add_reply(FakeReply(text="ok"), FakeReply(text="ok"))
    model = make(fake_anthropic)

    await model.request([Message.user("hi")], [LOOKUP], ModelSettings(tool_choice=choice))
    await model.request([Message.user("hi")], [LOOKUP], SETTINGS)

    assert fake_anthropic.requests[0].json["tool_choice"] == wire
    assert "tool_choice" not in fake_anthropic.requests[1].json
    await model.aclose()


@pytest.mark.parametrize("stream", [True, False])
async def test_a_negative_usage_counts_as_none(
    fake_anthropic: FakeAnthropicServer, stream: bool
) -> None:
    # a broken or hostile server's negative count would give back what the run spent
    fake_anthropic.add_reply(FakeReply(text="ok", input_tokens=-500, output_tokens=-3))
    model = make(fake_anthropic)
    if stream:
        final = [item async for item in model.stream([Message.user("hi")], [], ModelSettings())][-1]
    else:
        final = await model.request([Message.user("hi")], [], ModelSettings())
    await model.aclose()
    assert isinstance(final, ModelResponse)
    assert (final.usage.input_tokens, final.usage.output_tokens) == (0, 0)
