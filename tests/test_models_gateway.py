"""Retries, pricing and fallbacks around models, around a small scripted :class:`Model`
for the timing and streaming rules that need exact control.

The wrappers around each provider, built by the registry as the engine gets its models
and run against the provider's fake server, are in ``tests/conformance/test_providers.py``.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import AsyncIterator, Sequence

import anyio
import pytest

from corral.core.errors import ModelError, ModelTimeoutError
from corral.core.messages import (
    Message,
    ModelResponse,
    StreamItem,
    TextDelta,
    ToolSpec,
    Usage,
)
from corral.models.base import Model, ModelSettings
from corral.models.gateway import (
    AllModelsFailedError,
    FallbackModel,
    PricedModel,
    RetryingModel,
    retry_after_seconds,
)
from corral.resources.kinds import Pricing, RetryPolicy

SETTINGS = ModelSettings()
HI = [Message.user("hi")]


class StepModel(Model):
    """A model that plays a list of outcomes: an exception to raise or a text to answer.

    ``stream`` yields the text in two deltas and may fail after the first one
    (``fail_mid_stream``), to check that a partly delivered stream is not replayed.
    """

    def __init__(
        self,
        name: str,
        outcomes: Sequence[ModelError | str],
        *,
        fail_mid_stream: ModelError | None = None,
    ) -> None:
        self.name = name
        self.outcomes = list(outcomes)
        self.fail_mid_stream = fail_mid_stream
        self.calls = 0
        self.events: list[str] = []

    def _next(self) -> str:
        self.calls += 1
        if not self.outcomes:
            raise AssertionError(f"{self.name} called more often than scripted")
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, ModelError):
            raise outcome
        return outcome

    def _response(self, text: str) -> ModelResponse:
        return ModelResponse(
            Message.assistant(text), Usage(1_000, 500, 1), model="m", endpoint=self.name
        )

    async def request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> ModelResponse:
        return self._response(self._next())

    async def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> AsyncIterator[StreamItem]:
        text = self._next()
        half = len(text) // 2
        yield TextDelta(text[:half])
        if self.fail_mid_stream is not None:
            raise self.fail_mid_stream
        yield TextDelta(text[half:])
        yield self._response(text)

    async def prepare(self) -> None:
        self.events.append("prepare")

    async def aclose(self) -> None:
        self.events.append("aclose")


def retryable(message: str = "busy", retry_after: float | None = None) -> ModelError:
    return ModelError(message, retryable=True, status_code=503, retry_after=retry_after)


def fatal(message: str = "bad request") -> ModelError:
    return ModelError(message, retryable=False, status_code=400)


FAST = RetryPolicy(max_attempts=3, initial_backoff_seconds=0.0, max_backoff_seconds=0.0)


async def drain(model: Model) -> list[StreamItem]:
    return [item async for item in model.stream(HI, [], SETTINGS)]


# --------------------------------------------------------------------------- RetryingModel


async def test_retrying_model_retries_retryable_errors_until_success() -> None:
    inner = StepModel("a", [retryable(), retryable(), "ok"])

    response = await RetryingModel(inner, FAST).request(HI, [], SETTINGS)

    assert response.message.content == "ok"
    assert inner.calls == 3


async def test_retrying_model_gives_up_after_max_attempts_with_the_last_error() -> None:
    inner = StepModel("a", [retryable("one"), retryable("two"), retryable("three")])

    with pytest.raises(ModelError, match="three") as caught:
        await RetryingModel(inner, FAST).request(HI, [], SETTINGS)

    assert inner.calls == 3
    assert caught.value.retryable


async def test_retrying_model_does_not_retry_non_retryable_errors() -> None:
    inner = StepModel("a", [fatal(), "never reached"])

    with pytest.raises(ModelError, match="bad request"):
        await RetryingModel(inner, FAST).request(HI, [], SETTINGS)

    assert inner.calls == 1


async def test_retrying_model_waits_the_servers_retry_after_rather_than_its_backoff() -> None:
    inner = StepModel("a", [retryable(retry_after=0.15), "ok"])
    # a backoff this long would time the test out if it were used
    policy = RetryPolicy(max_attempts=2, initial_backoff_seconds=100, max_backoff_seconds=100)

    started = time.monotonic()
    await RetryingModel(inner, policy).request(HI, [], SETTINGS)

    assert 0.15 <= time.monotonic() - started < 1.0


async def test_retrying_model_backoff_is_capped_by_max_backoff() -> None:
    inner = StepModel("a", [retryable()] * 4 + ["ok"])
    policy = RetryPolicy(max_attempts=5, initial_backoff_seconds=10, max_backoff_seconds=0.02)

    started = time.monotonic()
    await RetryingModel(inner, policy).request(HI, [], SETTINGS)

    assert time.monotonic() - started < 0.5
    assert inner.calls == 5


async def test_retrying_model_retries_a_stream_that_fails_before_yielding() -> None:
    inner = StepModel("a", [retryable(), "hello"])

    items = await drain(RetryingModel(inner, FAST))

    assert [i.text for i in items if isinstance(i, TextDelta)] == ["he", "llo"]
    assert isinstance(items[-1], ModelResponse)
    assert inner.calls == 2


async def test_retrying_model_retries_the_stream_of_a_model_that_only_answers_whole() -> None:
    class WholeAnswers(StepModel):
        """Streams the default way: one request, replayed as one delta and the response."""

        stream = Model.stream

    inner = WholeAnswers("a", [retryable(), "hello"])

    items = await drain(RetryingModel(inner, FAST))

    assert items[:-1] == [TextDelta("hello")]
    assert isinstance(items[-1], ModelResponse) and items[-1].message.content == "hello"
    assert inner.calls == 2


async def test_retrying_model_never_replays_a_stream_that_already_yielded() -> None:
    inner = StepModel("a", ["hello", "hello"], fail_mid_stream=retryable("dropped"))

    seen: list[StreamItem] = []
    with pytest.raises(ModelError, match="dropped"):
        async for item in RetryingModel(inner, FAST).stream(HI, [], SETTINGS):
            seen.append(item)

    assert seen == [TextDelta("he")]
    assert inner.calls == 1


async def test_cancellation_during_a_retry_wait_is_not_swallowed() -> None:
    inner = StepModel("a", [retryable(retry_after=5.0), "never reached"])

    with anyio.move_on_after(0.1) as scope:
        await RetryingModel(inner, FAST).request(HI, [], SETTINGS)

    assert scope.cancelled_caught
    assert inner.calls == 1


# --------------------------------------------------------------------------- PricedModel


async def test_priced_model_fills_cost_for_requests_and_streams() -> None:
    pricing = Pricing(input_per_million=2.5, output_per_million=10.0)
    model = PricedModel(StepModel("a", ["x", "y"]), pricing)
    expected = 1_000 * 2.5 / 1e6 + 500 * 10.0 / 1e6

    response = await model.request(HI, [], SETTINGS)
    streamed = (await drain(model))[-1]

    assert response.cost_usd == pytest.approx(expected)
    assert isinstance(streamed, ModelResponse)
    assert streamed.cost_usd == pytest.approx(expected)


# --------------------------------------------------------------------------- FallbackModel


async def test_fallback_error_names_every_endpoints_failure() -> None:
    first = StepModel("first", [ModelTimeoutError("took too long", endpoint="first")])
    second = StepModel("second", [fatal("quota exhausted")])

    with pytest.raises(AllModelsFailedError) as caught:
        await FallbackModel([first, second]).request(HI, [], SETTINGS)

    error = caught.value
    assert "first: took too long" in error.message
    assert "second: quota exhausted" in error.message
    assert [type(e) for e in error.errors] == [ModelTimeoutError, ModelError]
    assert error.retryable  # the timeout may pass


async def test_fallback_does_not_move_on_after_a_stream_has_yielded() -> None:
    first = StepModel("first", ["hello"], fail_mid_stream=retryable("dropped"))
    second = StepModel("second", ["never"])

    with pytest.raises(ModelError, match="dropped"):
        await drain(FallbackModel([first, second]))

    assert second.calls == 0


async def test_fallback_does_not_catch_programming_errors() -> None:
    class Broken(StepModel):
        async def request(
            self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
        ) -> ModelResponse:
            raise KeyError("bug")

    second = StepModel("second", ["fine"])

    with pytest.raises(KeyError):
        await FallbackModel([Broken("first", []), second]).request(HI, [], SETTINGS)

    assert second.calls == 0


# --------------------------------------------------------------------------- pass-through


async def test_wrappers_pass_name_prepare_and_aclose_through() -> None:
    first, second = StepModel("first", []), StepModel("second", [])
    model = FallbackModel(
        [PricedModel(RetryingModel(first, FAST), Pricing()), RetryingModel(second, FAST)]
    )

    await model.prepare()
    await model.aclose()

    assert model.name == "first"
    assert PricedModel(RetryingModel(second, FAST), Pricing()).name == "second"
    assert first.events == ["prepare", "aclose"]
    assert second.events == ["prepare", "aclose"]


async def test_fallback_aclose_closes_every_model_even_when_one_fails() -> None:
    class FailsToClose(StepModel):
        async def aclose(self) -> None:
            raise RuntimeError("close failed")

    second = StepModel("second", [])

    with pytest.raises(RuntimeError, match="close failed"):
        await FallbackModel([FailsToClose("first", []), second]).aclose()

    assert second.events == ["aclose"]


# --------------------------------------------------------------------------- Retry-After


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "2"}, 2.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "-1"}, None),
        ({}, None),
    ],
)
def test_retry_after_is_read_as_seconds(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after_seconds(headers) == expected


def test_retry_after_is_read_as_an_http_date() -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)

    seconds = retry_after_seconds({"retry-after": when})

    assert seconds is not None and 25 <= seconds <= 31
    past = email.utils.formatdate(time.time() - 30, usegmt=True)
    assert retry_after_seconds({"retry-after": past}) == 0.0


# --------------------------------------------------------------------------- turn bounds


class CappedModel(StepModel):
    """A provider with an output cap of its own."""

    default_output_tokens = 300


def test_a_turn_bound_is_the_estimated_input_and_the_output_cap_priced() -> None:
    from corral.models.base import DEFAULT_OUTPUT_TOKENS, TurnBound
    from corral.models.estimate import estimate_input_tokens

    pricing = Pricing(input_per_million=2.0, output_per_million=10.0)
    inner = StepModel("a", [])
    model = RetryingModel(PricedModel(inner, pricing), RetryPolicy(max_attempts=1))
    tokens = estimate_input_tokens(HI, [])
    assert tokens == 4 + 1  # "hi": 2 bytes, one token, and the message's 4

    capped = model.turn_bound(HI, [], ModelSettings(max_output_tokens=100))
    assert capped == TurnBound(tokens, 100, (tokens * 2.0 + 100 * 10.0) / 1e6)
    # nothing set: the provider's own cap, else the default one
    assert model.turn_bound(HI, [], SETTINGS).output_tokens == DEFAULT_OUTPUT_TOKENS
    assert (
        PricedModel(CappedModel("b", []), pricing).turn_bound(HI, [], SETTINGS).output_tokens == 300
    )


def test_a_fallback_chains_bound_is_its_dearest_models() -> None:
    cheap = PricedModel(CappedModel("cheap", []), Pricing(output_per_million=1.0))
    dear = PricedModel(StepModel("dear", []), Pricing(output_per_million=50.0))
    chain = FallbackModel([cheap, dear])
    assert chain.default_output_tokens is None  # one of them sends no cap of its own
    bound = chain.turn_bound(HI, [], SETTINGS)
    assert bound == dear.turn_bound(HI, [], SETTINGS)
    both_capped = FallbackModel([cheap, PricedModel(CappedModel("c", []), Pricing())])
    assert both_capped.default_output_tokens == 300


def test_usage_sums_are_estimated_when_any_part_was() -> None:
    reported, estimated = Usage(1, 2, 1), Usage(3, 4, 1, "estimated")
    assert (reported + reported).source == "reported"
    assert (reported + estimated) == Usage(4, 6, 2, "estimated")
    assert (estimated + reported).source == "estimated"
