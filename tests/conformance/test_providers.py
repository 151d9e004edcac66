"""What every model provider does, run against each one and its fake server (real HTTP).

Tool calls, streaming, retries of 429 and fallbacks past failing endpoints, timeouts,
and the conversion of every failure into a :class:`~corral.core.errors.ModelError`:
each test runs once per row of :data:`PROVIDERS`, through the provider's real SDK. A new
provider gets these tests by a row (and, for a new wire protocol, a fake server). What
goes over the wire in each protocol stays in the provider's own module
(``tests/test_models_openai.py``, ``tests/test_models_anthropic.py``).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from corral.core.errors import ModelConnectionError, ModelError, ModelTimeoutError
from corral.core.messages import Message, ModelResponse, StreamItem, TextDelta, ToolCall
from corral.models import registry
from corral.models.base import Model, ModelSettings
from corral.resources.kinds import ModelEndpointSpec, Pricing
from corral.testing._fake_http import FakeModelServer
from corral.testing.fake_anthropic import FakeAnthropicServer
from corral.testing.fake_openai import FakeOpenAIServer, FakeReply, FakeToolCall, ToolLoop
from fixtures_models import (
    CLOCK,
    LOOKUP,
    FakeServers,
    closed_port_url,
    endpoint,
    fake_servers_fixture,
)

__all__ = ["fake_servers_fixture"]

SETTINGS = ModelSettings()
HI = [Message.user("hi")]


@dataclass(frozen=True)
class Provider:
    """One provider under test: its fake server, and the endpoint that reaches it."""

    name: str
    server: type[FakeModelServer]
    #: what the endpoint's base_url adds to the server's root
    api_path: str = ""
    options: Mapping[str, Any] = field(default_factory=dict[str, Any])
    key: str | None = "sk-test"


PROVIDERS = [
    Provider("openai", FakeOpenAIServer, "/v1"),
    Provider("azure-openai", FakeOpenAIServer, options={"deployment": "test-deployment"}),
    Provider("ollama", FakeOpenAIServer, "/v1", key=None),
    Provider("anthropic", FakeAnthropicServer),
]


@dataclass
class Api:
    """A provider with its fake server (and a second one for fallbacks), reset for the test."""

    provider: Provider
    servers: FakeServers
    server: FakeModelServer

    def spec(self, root: str | None = None, **options: Any) -> ModelEndpointSpec:
        """The ModelEndpoint of the server at ``root`` (default: the primary fake server)."""
        base_url = (root or self.server.root_url) + self.provider.api_path
        return endpoint(self.provider.name, base_url, **{**self.provider.options, **options})

    def bare(self, name: str = "primary", **options: Any) -> Model:
        """The provider's own model: no retries, no pricing."""
        module = importlib.import_module(registry.PROVIDERS[self.provider.name])
        model: Model = module.create(name, self.spec(**options), self.provider.key)
        return model

    def built(self, name: str = "primary", root: str | None = None, **options: Any) -> Model:
        """The model as an agent gets it: retries and pricing around the provider's own."""
        return registry.build_model(name, self.spec(root, **options), self.provider.key)

    def backup(self) -> FakeModelServer:
        """A second server speaking the same protocol, for fallbacks."""
        return self.servers.get(self.provider.server, "backup")


@pytest.fixture(params=PROVIDERS, ids=lambda provider: provider.name)
def api(request: pytest.FixtureRequest, fake_servers: FakeServers) -> Api:
    provider: Provider = request.param
    return Api(provider, fake_servers, fake_servers.get(provider.server))


async def collect(model: Model, messages: list[Message] = HI) -> list[StreamItem]:
    return [item async for item in model.stream(messages, [LOOKUP, CLOCK], SETTINGS)]


# --------------------------------------------------------------------------- tool calls


async def test_a_tool_calling_turn_and_the_answer_to_its_results(api: Api) -> None:
    api.server.add_reply(
        FakeReply(
            text="Let me check.",
            tool_calls=[
                FakeToolCall("lookup", {"query": "corral"}, id="call_a"),
                FakeToolCall("clock", "{}", id="call_b"),
            ],
            input_tokens=30,
            output_tokens=7,
        ),
        FakeReply(text="A corral is a pen.", input_tokens=50, output_tokens=9),
    )
    model = api.bare()
    conversation = [Message.system("Be brief."), Message.user("What is a corral?")]

    first = await model.request(conversation, [LOOKUP, CLOCK], SETTINGS)

    assert first.message.content == "Let me check."
    assert first.message.tool_calls == (
        ToolCall("call_a", "lookup", '{"query": "corral"}'),
        ToolCall("call_b", "clock", "{}"),
    )
    assert first.finish_reason == "tool_calls"
    assert (first.usage.input_tokens, first.usage.output_tokens, first.usage.requests) == (
        30,
        7,
        1,
    )
    assert (first.endpoint, first.model) == ("primary", "test-model")

    conversation += [
        first.message,
        Message.tool(first.message.tool_calls[0], "a pen for livestock"),
        Message.tool(first.message.tool_calls[1], "clock is broken", is_error=True),
    ]
    second = await model.request(conversation, [LOOKUP, CLOCK], SETTINGS)

    assert second.message == Message.assistant("A corral is a pen.")
    assert second.finish_reason == "stop"
    assert (second.usage.input_tokens, second.usage.output_tokens) == (50, 9)
    await model.aclose()


async def test_a_tool_loop_runs_to_its_final_answer(api: Api) -> None:
    api.server.tool_loop = ToolLoop(tool_name="lookup", calls=3, arguments={"query": "x"})
    model = api.bare()
    conversation = [Message.user("go")]

    for _ in range(10):
        response = await model.request(conversation, [LOOKUP], SETTINGS)
        conversation.append(response.message)
        if not response.message.tool_calls:
            break
        for call in response.message.tool_calls:
            assert json.loads(call.arguments) == {"query": "x"}
            conversation.append(Message.tool(call, "result"))

    assert conversation[-1].content == "done after 3 tool results"
    assert api.server.calls == 4
    await model.aclose()


# --------------------------------------------------------------------------- streaming


async def test_a_stream_yields_text_deltas_then_one_assembled_response(api: Api) -> None:
    api.server.add_reply(
        FakeReply(
            text="Let me look.",
            tool_calls=[
                FakeToolCall("lookup", {"query": "pen", "limit": 3}, id="call_1"),
                FakeToolCall("clock", {}, id="call_2"),
            ],
            input_tokens=12,
            output_tokens=34,
        )
    )
    model = api.bare()

    items = await collect(model)

    deltas = [item for item in items if isinstance(item, TextDelta)]
    assert len(deltas) > 1, "the fake server streams text in several pieces"
    assert "".join(d.text for d in deltas) == "Let me look."
    final = items[-1]
    assert isinstance(final, ModelResponse)
    assert all(isinstance(item, TextDelta) for item in items[:-1])
    assert final.message.content == "Let me look."
    # each call's arguments arrived in pieces and are reassembled
    assert final.message.tool_calls == (
        ToolCall("call_1", "lookup", '{"query": "pen", "limit": 3}'),
        ToolCall("call_2", "clock", "{}"),
    )
    assert (final.usage.input_tokens, final.usage.output_tokens, final.usage.requests) == (
        12,
        34,
        1,
    )
    assert final.finish_reason == "tool_calls"
    assert (final.endpoint, final.model) == ("primary", "test-model")
    assert api.server.requests[0].json["stream"] is True
    await model.aclose()


@pytest.mark.parametrize("status", [503, 529])
async def test_a_stream_that_fails_before_any_event_raises_a_model_error(
    api: Api, status: int
) -> None:
    api.server.fail(status)
    model = api.bare()

    with pytest.raises(ModelError) as caught:
        await collect(model)

    assert caught.value.retryable and caught.value.status_code == status
    await model.aclose()


async def test_a_stream_cut_short_is_an_error_not_a_shorter_answer(api: Api) -> None:
    api.server.truncate(3)
    api.server.add_reply(FakeReply(text="an answer that never finishes"))
    model = api.bare()

    with pytest.raises(ModelConnectionError, match="before the answer was complete"):
        await collect(model)

    await model.aclose()


async def test_a_body_cut_short_is_a_retryable_model_error(api: Api) -> None:
    api.server.truncate(2)
    api.server.add_reply(FakeReply(text="an answer that never finishes"))
    model = api.bare()

    with pytest.raises(ModelError, match="malformed") as caught:
        await model.request(HI, [], SETTINGS)

    assert caught.value.retryable
    await model.aclose()


# --------------------------------------------------------------------------- 429 and retries


@pytest.mark.parametrize("streamed", [False, True], ids=["request", "stream"])
async def test_a_rate_limit_is_retried_after_the_servers_retry_after(
    api: Api, streamed: bool
) -> None:
    api.server.fail(429, times=2, retry_after="0.1")
    api.server.add_reply(FakeReply(text="third time lucky"))
    # backoff is zero: any wait comes from the Retry-After header
    model = api.built(max_attempts=3)

    started = anyio.current_time()
    if streamed:
        final = (await collect(model))[-1]
    else:
        final = await model.request(HI, [], SETTINGS)

    assert isinstance(final, ModelResponse) and final.message.content == "third time lucky"
    assert api.server.calls == 3
    assert anyio.current_time() - started >= 0.2  # two waits of the server's 0.1 s at least
    await model.aclose()


async def test_a_bad_request_is_not_retried(api: Api) -> None:
    api.server.fail(400, times=None)
    model = api.built(max_attempts=5)

    with pytest.raises(ModelError) as caught:
        await model.request(HI, [], SETTINGS)

    assert caught.value.status_code == 400
    assert api.server.calls == 1
    await model.aclose()


async def test_timeouts_are_retried(api: Api) -> None:
    api.server.delay(5.0, times=1)
    api.server.add_reply(FakeReply(text="slow, dropped"), FakeReply(text="fast"))
    model = api.built(max_attempts=2, timeout=1.0)

    response = await model.request(HI, [], SETTINGS)

    assert response.message.content == "fast"
    assert api.server.calls == 2
    await model.aclose()


# --------------------------------------------------------------------------- 5xx and fallbacks


async def test_a_failing_endpoint_falls_back_to_the_next_after_its_retries(api: Api) -> None:
    api.server.fail(500, times=None)
    backup = api.backup()
    backup.add_reply(FakeReply(text="from the backup"))
    primary = api.built("primary", max_attempts=2)
    model = registry.with_fallbacks([primary, api.built("secondary", backup.root_url)])

    response = await model.request(HI, [], SETTINGS)

    assert response.message.content == "from the backup"
    assert response.endpoint == "secondary"
    assert api.server.calls == 2  # the primary's own retries came first
    assert backup.calls == 1
    await model.aclose()


async def test_a_fallback_stream_uses_the_next_endpoint_before_the_first_item(api: Api) -> None:
    api.server.fail(503, times=None)
    backup = api.backup()
    backup.add_reply(FakeReply(text="streamed by the backup"))
    model = registry.with_fallbacks([api.built("primary"), api.built("secondary", backup.root_url)])

    items = await collect(model)

    assert "".join(i.text for i in items if isinstance(i, TextDelta)) == "streamed by the backup"
    final = items[-1]
    assert isinstance(final, ModelResponse) and final.endpoint == "secondary"
    await model.aclose()


# --------------------------------------------------------------------------- timeouts


async def test_a_slow_server_times_out(api: Api) -> None:
    # without the deadline the call would end at 5 s in a 400 (no reply is scripted)
    api.server.delay(5.0)
    model = api.bare(timeout=0.3)

    with pytest.raises(ModelTimeoutError) as caught:
        await model.request(HI, [], SETTINGS)

    assert caught.value.retryable
    assert caught.value.endpoint == "primary"
    await model.aclose()


async def test_a_trickling_stream_cannot_outlast_the_whole_call_deadline(api: Api) -> None:
    # every piece comes well within the read timeout; the whole answer (about 20 pieces
    # 0.15 s apart) could not: only the whole-call deadline ends it
    api.server.delay(0.0, chunk_delay=0.15)
    calls = [FakeToolCall("lookup", {"query": str(n)}, id=f"call_{n}") for n in range(4)]
    api.server.add_reply(FakeReply(text="a long answer that arrives slowly", tool_calls=calls))
    model = api.bare(timeout=1.0)

    seen: list[StreamItem] = []
    with pytest.raises(ModelTimeoutError):
        async for item in model.stream(HI, [LOOKUP], SETTINGS):
            seen.append(item)

    assert seen and all(isinstance(item, TextDelta) for item in seen)
    await model.aclose()


async def test_a_trickling_body_cannot_outlast_the_whole_call_deadline(api: Api) -> None:
    # each piece within the read timeout, the whole body (3 gaps of 0.2 s) past the deadline
    api.server.delay(0.0, chunk_delay=0.2)
    api.server.add_reply(FakeReply(text="slow"))
    model = api.bare(timeout=0.4)

    with pytest.raises(ModelTimeoutError):
        await model.request(HI, [], SETTINGS)

    await model.aclose()


async def test_cancelling_a_slow_call_is_cancellation_not_a_model_timeout(api: Api) -> None:
    api.server.delay(30.0)
    api.server.add_reply(FakeReply(text="late"))
    model = api.built(max_attempts=3)
    scope = anyio.CancelScope()

    async def request() -> None:
        with scope:
            await model.request(HI, [], SETTINGS)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(request)
            while api.server.calls == 0:  # cancelled once the server has the request
                await anyio.sleep(0.01)
            scope.cancel()

    assert scope.cancelled_caught  # not converted into a timeout, not swallowed
    assert api.server.calls == 1  # nor retried
    await model.aclose()


# --------------------------------------------------------------------------- error conversion


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(429, True), (500, True), (503, True), (529, True), (400, False), (401, False), (403, False)],
)
async def test_an_error_status_is_a_model_error_retryable_only_for_overload_and_server_failures(
    api: Api, status: int, retryable: bool
) -> None:
    api.server.fail(status, retry_after="3")
    model = api.bare()

    with pytest.raises(ModelError) as caught:
        await model.request(HI, [], SETTINGS)

    error = caught.value
    assert type(error) is ModelError
    assert (error.status_code, error.retryable, error.retry_after) == (status, retryable, 3.0)
    assert error.endpoint == "primary"
    await model.aclose()


async def test_running_out_of_script_is_a_non_retryable_error(api: Api) -> None:
    model = api.bare()

    with pytest.raises(ModelError, match="no scripted reply") as caught:
        await model.request(HI, [], SETTINGS)

    assert not caught.value.retryable
    await model.aclose()


async def test_an_unreachable_server_is_a_retryable_connection_error(api: Api) -> None:
    module = importlib.import_module(registry.PROVIDERS[api.provider.name])
    closed = api.spec(closed_port_url().removesuffix("/v1"))
    model: Model = module.create("primary", closed, api.provider.key)

    with pytest.raises(ModelConnectionError) as caught:
        await model.request(HI, [], SETTINGS)

    assert caught.value.retryable
    await model.aclose()


# --------------------------------------------------------------------------- cost


async def test_cost_comes_from_the_servers_usage_and_the_endpoint_pricing(api: Api) -> None:
    api.server.add_reply(FakeReply(text="a", input_tokens=2_000, output_tokens=1_000))
    model = api.built(pricing=Pricing(input_per_million=3.0, output_per_million=15.0))

    response = await model.request(HI, [], SETTINGS)

    assert response.cost_usd == pytest.approx(2_000 * 3.0 / 1e6 + 1_000 * 15.0 / 1e6)
    await model.aclose()


async def test_an_endpoint_without_prices_costs_nothing(api: Api) -> None:
    api.server.add_reply(
        FakeReply(text="a", input_tokens=1_200, output_tokens=300),
        FakeReply(text="b", input_tokens=1_200, output_tokens=300),
    )
    model = api.built()

    response = await model.request(HI, [], SETTINGS)
    streamed = (await collect(model))[-1]

    assert response.cost_usd == 0.0
    assert isinstance(streamed, ModelResponse) and streamed.cost_usd == 0.0
    await model.aclose()
