"""The ``anthropic`` provider against the fake Messages API server.

Every test goes through the real ``anthropic`` SDK and real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import pathlib
import time

import pytest

from corral.core.errors import (
    ConfigurationError,
    ModelConnectionError,
    ModelError,
    ModelTimeoutError,
)
from corral.core.messages import Message, ModelResponse, StreamItem, TextDelta, ToolCall
from corral.models import anthropic as anthropic_provider
from corral.models.base import Model, ModelSettings, NamedTool, ToolChoice
from corral.models.registry import build_model
from corral.resources.kinds import Pricing
from corral.testing.fake_anthropic import FakeAnthropicServer, FakeReply, FakeToolCall, ToolLoop
from fixtures_models import (  # noqa: F401 - fixtures
    CLOCK,
    LOOKUP,
    anthropic_server_fixture,
    closed_port_url,
    endpoint,
    fake_anthropic_fixture,
)

SETTINGS = ModelSettings()


def make(server: FakeAnthropicServer, **kw: object) -> Model:
    """The bare provider model (no retries, no pricing)."""
    spec = endpoint("anthropic", server.base_url, model="claude-test", **kw)  # type: ignore[arg-type]
    return anthropic_provider.create("claude", spec, "sk-ant-test")


async def test_request_translates_a_multi_step_tool_conversation(
    fake_anthropic: FakeAnthropicServer,
) -> None:
    fake_anthropic.add_reply(
        FakeReply(
            text="Let me check.",
            tool_calls=[
                FakeToolCall("lookup", {"query": "corral"}, id="toolu_a"),
                FakeToolCall("clock", {}, id="toolu_b"),
            ],
            input_tokens=40,
            output_tokens=11,
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

    assert first.message.content == "Let me check."
    assert first.message.tool_calls == (
        ToolCall("toolu_a", "lookup", '{"query": "corral"}'),
        ToolCall("toolu_b", "clock", "{}"),
    )
    assert first.finish_reason == "tool_calls"
    assert (first.usage.input_tokens, first.usage.output_tokens, first.usage.requests) == (
        40,
        11,
        1,
    )
    assert (first.endpoint, first.model) == ("claude", "claude-test")

    conversation += [
        first.message,
        Message.tool(first.message.tool_calls[0], "a pen for livestock"),
        Message.tool(first.message.tool_calls[1], "clock is broken", is_error=True),
    ]
    second = await model.request(conversation, [LOOKUP, CLOCK], SETTINGS)

    assert second.message == Message.assistant("A corral is a pen.")
    assert second.finish_reason == "stop"
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


async def test_stream_yields_text_deltas_and_assembles_tool_input_json(
    fake_anthropic: FakeAnthropicServer,
) -> None:
    fake_anthropic.add_reply(
        FakeReply(
            text="Looking it up now.",
            tool_calls=[FakeToolCall("lookup", {"query": "pen", "limit": 3}, id="toolu_1")],
            input_tokens=21,
            output_tokens=13,
        )
    )
    model = make(fake_anthropic)

    items: list[StreamItem] = [
        item async for item in model.stream([Message.user("hi")], [LOOKUP], SETTINGS)
    ]

    deltas = [item for item in items if isinstance(item, TextDelta)]
    assert len(deltas) > 1
    assert "".join(d.text for d in deltas) == "Looking it up now."
    final = items[-1]
    assert isinstance(final, ModelResponse)
    assert all(isinstance(item, TextDelta) for item in items[:-1])
    assert final.message.content == "Looking it up now."
    assert final.message.tool_calls == (
        ToolCall("toolu_1", "lookup", '{"query": "pen", "limit": 3}'),
    )
    assert (final.usage.input_tokens, final.usage.output_tokens) == (21, 13)
    assert final.finish_reason == "tool_calls"
    assert final.model == "claude-test"
    assert fake_anthropic.requests[0].json["stream"] is True
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


async def test_rate_limit_is_retried_after_the_servers_retry_after(
    fake_anthropic: FakeAnthropicServer,
) -> None:
    fake_anthropic.fail(429, times=1, retry_after="0.1")
    fake_anthropic.add_reply(FakeReply(text="finally"))
    spec = endpoint("anthropic", fake_anthropic.base_url, model="claude-test", max_attempts=3)
    model = build_model("claude", spec, "k")

    started = time.monotonic()
    response = await model.request([Message.user("hi")], [], SETTINGS)

    assert response.message.content == "finally"
    assert fake_anthropic.calls == 2
    assert time.monotonic() - started >= 0.1
    await model.aclose()


@pytest.mark.parametrize(
    ("status", "retryable"), [(429, True), (500, True), (529, True), (400, False), (403, False)]
)
async def test_status_errors_are_retryable_only_for_overload_and_server_failures(
    fake_anthropic: FakeAnthropicServer, status: int, retryable: bool
) -> None:
    fake_anthropic.fail(status, retry_after="3")
    model = make(fake_anthropic)

    with pytest.raises(ModelError) as caught:
        await model.request([Message.user("hi")], [], SETTINGS)

    assert caught.value.status_code == status
    assert caught.value.retryable is retryable
    assert caught.value.retry_after == 3.0
    assert caught.value.endpoint == "claude"
    await model.aclose()


async def test_bad_request_is_not_retried(fake_anthropic: FakeAnthropicServer) -> None:
    fake_anthropic.fail(400, times=None)
    spec = endpoint("anthropic", fake_anthropic.base_url, model="claude-test", max_attempts=4)
    model = build_model("claude", spec, "k")

    with pytest.raises(ModelError):
        await model.request([Message.user("hi")], [], SETTINGS)

    assert fake_anthropic.calls == 1
    await model.aclose()


async def test_stream_failure_before_any_event_raises_model_error(
    fake_anthropic: FakeAnthropicServer,
) -> None:
    fake_anthropic.fail(529)
    model = make(fake_anthropic)

    with pytest.raises(ModelError) as caught:
        async for _ in model.stream([Message.user("hi")], [], SETTINGS):
            pass

    assert caught.value.retryable and caught.value.status_code == 529
    await model.aclose()


async def test_slow_server_times_out_within_the_timeout(
    fake_anthropic: FakeAnthropicServer,
) -> None:
    fake_anthropic.delay(5.0)
    model = make(fake_anthropic, timeout=0.3)

    started = time.monotonic()
    with pytest.raises(ModelTimeoutError):
        await model.request([Message.user("hi")], [], SETTINGS)

    assert time.monotonic() - started < 1.5
    await model.aclose()


async def test_trickling_stream_cannot_outlast_the_whole_call_deadline(
    fake_anthropic: FakeAnthropicServer,
) -> None:
    fake_anthropic.delay(0.0, chunk_delay=0.15)
    fake_anthropic.add_reply(FakeReply(text="a long answer that arrives slowly"))
    model = make(fake_anthropic, timeout=0.5)

    started = time.monotonic()
    with pytest.raises(ModelTimeoutError):
        async for _ in model.stream([Message.user("hi")], [], SETTINGS):
            pass

    assert time.monotonic() - started < 1.0
    await model.aclose()


async def test_stream_cut_short_is_an_error_not_a_shorter_answer(
    fake_anthropic: FakeAnthropicServer,
) -> None:
    fake_anthropic.truncate(4)
    fake_anthropic.add_reply(FakeReply(text="an answer that never finishes"))
    model = make(fake_anthropic)

    with pytest.raises(ModelConnectionError, match="before the answer was complete"):
        async for _ in model.stream([Message.user("hi")], [], SETTINGS):
            pass

    await model.aclose()


async def test_body_cut_short_is_a_retryable_model_error(
    fake_anthropic: FakeAnthropicServer,
) -> None:
    fake_anthropic.truncate(2)
    fake_anthropic.add_reply(FakeReply(text="an answer that never finishes"))
    model = make(fake_anthropic)

    with pytest.raises(ModelError, match="malformed") as caught:
        await model.request([Message.user("hi")], [], SETTINGS)

    assert caught.value.retryable
    await model.aclose()


async def test_unreachable_server_is_a_retryable_connection_error() -> None:
    spec = endpoint("anthropic", closed_port_url().removesuffix("/v1"), model="claude-test")
    model = anthropic_provider.create("claude", spec, "k")

    with pytest.raises(ModelConnectionError) as caught:
        await model.request([Message.user("hi")], [], SETTINGS)

    assert caught.value.retryable
    await model.aclose()


async def test_cost_is_computed_from_the_endpoint_pricing(
    fake_anthropic: FakeAnthropicServer,
) -> None:
    fake_anthropic.add_reply(FakeReply(text="ok", input_tokens=2_000, output_tokens=1_000))
    spec = endpoint(
        "anthropic",
        fake_anthropic.base_url,
        model="claude-test",
        pricing=Pricing(input_per_million=3.0, output_per_million=15.0),
    )
    model = build_model("claude", spec, "k")

    response = await model.request([Message.user("hi")], [], SETTINGS)

    assert response.cost_usd == pytest.approx(2_000 * 3.0 / 1e6 + 1_000 * 15.0 / 1e6)
    await model.aclose()


async def test_tool_loop_mode_counts_tool_results(fake_anthropic: FakeAnthropicServer) -> None:
    fake_anthropic.tool_loop = ToolLoop(tool_name="lookup", calls=2)
    model = make(fake_anthropic)
    conversation = [Message.user("go")]

    for _ in range(10):
        response = await model.request(conversation, [LOOKUP], SETTINGS)
        conversation.append(response.message)
        if not response.message.tool_calls:
            break
        conversation += [Message.tool(call, "r") for call in response.message.tool_calls]

    assert conversation[-1].content == "done after 2 tool results"
    assert fake_anthropic.calls == 3
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
