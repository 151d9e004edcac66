"""The ``openai``, ``azure-openai`` and ``ollama`` providers against the fake server: what
goes over the wire (Chat Completions, Azure's deployment paths, the dialects of other servers).

Every test goes through the real ``openai`` SDK and real HTTP on 127.0.0.1. What every
provider does (tool calls, streaming, retries, fallbacks, timeouts, errors) is in the
provider suite, ``tests/conformance/test_providers.py``.
"""

from __future__ import annotations

import pytest
from openai._utils import async_maybe_transform
from openai.types.chat.completion_create_params import (
    CompletionCreateParamsNonStreaming,
    CompletionCreateParamsStreaming,
)

from corral.core.errors import ConfigurationError, ResourceError
from corral.core.messages import Message, ModelResponse, StreamItem, ToolCall, Usage
from corral.models import openai as openai_provider
from corral.models.base import Model, ModelSettings, NamedTool, ToolChoice
from corral.resources.loader import load_text
from corral.testing.fake_openai import FakeOpenAIServer, FakeReply, FakeToolCall
from fixtures_models import (  # noqa: F401 - fixtures
    CLOCK,
    LOOKUP,
    endpoint,
    fake_openai_fixture,
    openai_server_fixture,
)

SETTINGS = ModelSettings()


#: the fake server stands in for the OpenAI API: its ways, not another server's
OPENAI_API_WAYS = {"max_tokens_param": "max_completion_tokens", "tool_call_content": "omit"}


def make(server: FakeOpenAIServer, **kw: object) -> Model:
    """The bare provider model (no retries, no pricing)."""
    spec = endpoint("openai", server.base_url, **{**OPENAI_API_WAYS, **kw})  # type: ignore[arg-type]
    return openai_provider.create("primary", spec, "sk-test")


async def collect(model: Model, messages: list[Message]) -> list[StreamItem]:
    return [item async for item in model.stream(messages, [LOOKUP, CLOCK], SETTINGS)]


async def test_a_multi_step_tool_conversation_goes_out_as_chat_completions(
    fake_openai: FakeOpenAIServer,
) -> None:
    """What is sent; what comes back is the provider suite's (tests/conformance)."""
    fake_openai.add_reply(
        FakeReply(
            tool_calls=[
                FakeToolCall("lookup", {"query": "corral"}, id="call_a"),
                FakeToolCall("clock", "{}", id="call_b"),
            ]
        ),
        FakeReply(text="A corral is a pen."),
    )
    model = make(fake_openai)
    conversation = [Message.system("Be brief."), Message.user("What is a corral?")]

    first = await model.request(conversation, [LOOKUP, CLOCK], SETTINGS)
    conversation += [
        first.message,
        Message.tool(first.message.tool_calls[0], "a pen for livestock"),
        Message.tool(first.message.tool_calls[1], "boom", is_error=True),
    ]
    await model.request(conversation, [LOOKUP, CLOCK], SETTINGS)

    sent = fake_openai.requests[1].json
    assert sent["model"] == "test-model"
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is a corral?"},
        {
            "role": "assistant",  # no "content": the calls are the whole message
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"query": "corral"}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "clock", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "a pen for livestock"},
        {"role": "tool", "tool_call_id": "call_b", "content": "boom"},
    ]
    assert sent["tools"][0] == {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": LOOKUP.parameters,
        },
    }
    assert "stream" not in sent or sent["stream"] is False
    assert fake_openai.requests[1].headers["authorization"] == "Bearer sk-test"
    await model.aclose()


async def test_what_is_posted_is_what_the_sdks_create_would_post(
    fake_openai: FakeOpenAIServer,
) -> None:
    """The adapter posts its body as it is (``client.post``), skipping the transform that
    ``chat.completions.create`` runs over its arguments: that transform must change
    nothing in any request the adapter sends (a new SDK whose types rename or reformat
    a field of a chat request fails here)."""
    fake_openai.add_reply(
        FakeReply(tool_calls=[FakeToolCall("lookup", {"query": "corral"}, id="call_a")]),
        FakeReply(text="A pen.", tool_calls=[FakeToolCall("clock", "{}", id="call_b")]),
        FakeReply(text="Done."),
    )
    model = make(fake_openai)
    settings = ModelSettings(temperature=0.2, max_output_tokens=64)
    conversation = [Message.system("Be brief."), Message.user("What is a corral?")]
    for _ in range(2):
        answer = await model.request(conversation, [LOOKUP, CLOCK], settings)
        conversation += [answer.message, Message.tool(answer.message.tool_calls[0], "ok")]
    [item async for item in model.stream(conversation, [LOOKUP, CLOCK], settings)]
    await model.aclose()

    *requests, streamed = [r.json for r in fake_openai.requests]
    assert streamed["stream"] is True and len(streamed["messages"]) == 6
    for sent in requests:
        assert await async_maybe_transform(sent, CompletionCreateParamsNonStreaming) == sent
    assert await async_maybe_transform(streamed, CompletionCreateParamsStreaming) == streamed


async def test_a_stream_asks_for_the_usage_in_its_last_chunk(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.add_reply(FakeReply(text="Let me look.", input_tokens=12, output_tokens=34))
    model = make(fake_openai)

    items = await collect(model, [Message.user("hi")])

    final = items[-1]
    assert isinstance(final, ModelResponse)
    assert (final.usage.input_tokens, final.usage.output_tokens) == (12, 34)
    sent = fake_openai.requests[0].json
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    await model.aclose()


async def test_settings_reach_the_wire(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.add_reply(FakeReply(text="ok"))
    model = make(fake_openai)

    await model.request(
        [Message.user("hi")], [], ModelSettings(temperature=0.2, max_output_tokens=77)
    )

    sent = fake_openai.requests[0].json
    assert sent["temperature"] == 0.2
    assert sent["max_completion_tokens"] == 77
    assert "tools" not in sent
    await model.aclose()


async def test_azure_openai_calls_the_deployment_path_with_api_version_and_key(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.add_reply(FakeReply(text="from azure"))
    spec = endpoint(
        "azure-openai",
        fake_openai.root_url,
        model="gpt-4o",
        deployment="prod-gpt",
        api_version="2025-01-01",
    )
    model = openai_provider.create("azure", spec, "azure-key")

    response = await model.request([Message.user("hi")], [], SETTINGS)

    assert response.message.content == "from azure"
    assert response.endpoint == "azure"
    seen = fake_openai.requests[0]
    assert seen.path == "/openai/deployments/prod-gpt/chat/completions"
    assert seen.query["api-version"] == "2025-01-01"
    assert seen.headers["api-key"] == "azure-key"
    await model.aclose()


async def test_azure_openai_defaults_deployment_to_model_and_has_an_api_version(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.add_reply(FakeReply(text="ok"))
    model = openai_provider.create(
        "azure", endpoint("azure-openai", fake_openai.root_url, model="gpt-4o"), "k"
    )

    await model.request([Message.user("hi")], [], SETTINGS)

    seen = fake_openai.requests[0]
    assert seen.path == "/openai/deployments/gpt-4o/chat/completions"
    assert seen.query["api-version"] == openai_provider.DEFAULT_AZURE_API_VERSION
    await model.aclose()


async def test_ollama_needs_no_key_and_sends_max_tokens(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.add_reply(FakeReply(text="local"))
    model = openai_provider.create(
        "local", endpoint("ollama", fake_openai.base_url, model="llama3.2"), None
    )

    response = await model.request([Message.user("hi")], [], ModelSettings(max_output_tokens=16))

    assert response.message.content == "local"
    sent = fake_openai.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.json["model"] == "llama3.2"
    assert sent.json["max_tokens"] == 16
    assert "max_completion_tokens" not in sent.json
    await model.aclose()


def test_ollama_defaults_to_the_local_daemon() -> None:
    model = openai_provider.create("local", endpoint("ollama", None, model="llama3.2"), None)

    assert isinstance(model, openai_provider.OpenAIChatModel)
    assert str(model.client.base_url).rstrip("/") == openai_provider.DEFAULT_OLLAMA_BASE_URL


async def test_custom_base_url_without_a_key_never_sends_the_environment_key(
    fake_openai: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-secret")
    fake_openai.add_reply(FakeReply(text="ok"))
    model = openai_provider.create("local", endpoint("openai", fake_openai.base_url), None)

    await model.request([Message.user("hi")], [], SETTINGS)

    assert "sk-real-secret" not in fake_openai.requests[0].headers["authorization"]
    await model.aclose()


def test_missing_key_for_the_hosted_api_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_ADMIN_KEY", raising=False)

    with pytest.raises(ConfigurationError, match="primary"):
        openai_provider.create("primary", endpoint("openai", None), None)


async def test_other_servers_get_max_tokens_and_an_empty_content_by_default(
    fake_openai: FakeOpenAIServer,
) -> None:
    # llama.cpp's server ignores max_completion_tokens and answers 500 to an assistant
    # message with tool calls and no content
    fake_openai.add_reply(FakeReply(text="ok"))
    model = openai_provider.create("local", endpoint("openai", fake_openai.base_url), None)
    call = ToolCall("call_1", "lookup", "{}")
    conversation = [Message.user("hi"), Message.assistant("", (call,)), Message.tool(call, "x")]

    await model.request(conversation, [LOOKUP], ModelSettings(max_output_tokens=5))

    sent = fake_openai.requests[0].json
    assert sent["max_tokens"] == 5 and "max_completion_tokens" not in sent
    assert sent["messages"][1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
        ],
    }
    await model.aclose()


@pytest.mark.parametrize(
    ("provider", "base_url", "expected"),
    [
        ("openai", None, ("max_completion_tokens", "omit")),
        ("openai", "https://api.openai.com/v1", ("max_completion_tokens", "omit")),
        ("azure-openai", "https://x.openai.azure.com", ("max_completion_tokens", "omit")),
        ("openai", "http://127.0.0.1:8000/v1", ("max_tokens", "empty")),
        ("openai", "https://api.openai.com.example.net/v1", ("max_tokens", "empty")),
        ("ollama", None, ("max_tokens", "empty")),
    ],
)
def test_the_endpoint_dialect_follows_the_base_url(
    provider: str, base_url: str | None, expected: tuple[str, str]
) -> None:
    dialect = openai_provider.Dialect.of(endpoint(provider, base_url))
    assert (dialect.max_tokens_param, dialect.tool_call_content) == expected


def test_options_override_the_dialect() -> None:
    spec = endpoint(
        "openai", "https://api.openai.com/v1", max_tokens_param="max_tokens",
        tool_call_content="empty",
    )  # fmt: skip
    assert openai_provider.Dialect.of(spec) == openai_provider.Dialect("max_tokens", "empty")


def test_an_unknown_dialect_option_is_refused_at_apply() -> None:
    document = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: e}
spec: {provider: openai, model: m, options: {max_tokens_param: both}}
"""
    with pytest.raises(ResourceError, match=r"options.max_tokens_param must be one of"):
        load_text(document, "e.yaml")


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", "auto"),
        ("required", "required"),
        ("none", "none"),
        (NamedTool("lookup"), {"type": "function", "function": {"name": "lookup"}}),
    ],
)
async def test_tool_choice_reaches_the_wire(
    fake_openai: FakeOpenAIServer, choice: ToolChoice, wire: object
) -> None:
    fake_openai.add_reply(FakeReply(text="ok"), FakeReply(text="ok"))
    model = make(fake_openai)

    await model.request([Message.user("hi")], [LOOKUP], ModelSettings(tool_choice=choice))
    await model.request([Message.user("hi")], [], ModelSettings(tool_choice=choice))

    assert fake_openai.requests[0].json["tool_choice"] == wire
    assert "tool_choice" not in fake_openai.requests[1].json  # no tools, nothing to choose
    await model.aclose()


async def test_no_tool_choice_is_sent_unless_the_agent_sets_one(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.add_reply(FakeReply(text="ok"))
    model = make(fake_openai)
    await model.request([Message.user("hi")], [LOOKUP], SETTINGS)
    assert "tool_choice" not in fake_openai.requests[0].json
    await model.aclose()


@pytest.mark.parametrize("stream", [True, False])
async def test_an_answer_without_usage_gets_an_estimated_one(stream: bool) -> None:
    # llama.cpp's server ignores stream_options.include_usage (a streamed answer) and some
    # servers send "usage": null: the answer was 0 + 0 tokens, and no limit ever bound
    conversation = [Message.system("Be brief."), Message.user("What is 17 + 25? " * 20)]
    with FakeOpenAIServer(stream_usage=False) as server:
        server.add_reply(FakeReply(text="The answer is 42.", input_tokens=0, output_tokens=0))
        model = make(server)
        if stream:
            final = (await collect(model, conversation))[-1]
        else:
            final = await model.request(conversation, [LOOKUP, CLOCK], SETTINGS)
        await model.aclose()
    assert isinstance(final, ModelResponse)
    usage = final.usage
    assert usage.source == "estimated" and usage.requests == 1
    # the question alone is 340 bytes: more than 100 tokens at 3 bytes a token
    assert usage.input_tokens > 100 and usage.output_tokens == 4 + 6


async def test_a_reported_usage_is_marked_reported(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.add_reply(FakeReply(text="ok", input_tokens=3, output_tokens=1))
    model = make(fake_openai)
    final = (await collect(model, [Message.user("hi")]))[-1]
    await model.aclose()
    assert isinstance(final, ModelResponse)
    assert final.usage == Usage(3, 1, 1, "reported")
