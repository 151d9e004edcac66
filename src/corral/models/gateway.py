"""Wrappers that add gateway behaviour around any :class:`~corral.models.base.Model`.

Each wrapper is a ``Model`` itself, so they compose::

    FallbackModel([
        PricedModel(RetryingModel(primary, retry_policy), pricing),
        PricedModel(RetryingModel(secondary, retry_policy), pricing),
    ])

- :class:`RetryingModel` retries retryable :class:`~corral.core.errors.ModelError`
  with exponential backoff and full jitter, honouring the server's ``Retry-After``.
- :class:`PricedModel` fills ``ModelResponse.cost_usd`` from the endpoint's prices
  (:func:`~corral.models.registry.build_model` leaves it out when there are none).
- :class:`FallbackModel` moves on to the next model when one fails for good.

A stream is retried (or falls back) only while nothing has been yielded yet: once
a caller has seen a text delta, replaying the turn would show it twice.

Embeddings (:meth:`~corral.models.base.Model.embed`) pass through the same wrappers:
retried like a turn, priced at the input price. A :class:`FallbackModel` never falls
back for them: vectors of two models are not comparable, so a stored vector and a
query embedded by a fallback would not match.

:func:`retry_after_seconds` is re-exported from :mod:`corral.models._adapter`,
where the helpers the provider adapters share live.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import Any, TypeVar

import anyio
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from corral.core.backoff import jittered_backoff
from corral.core.errors import ModelError
from corral.core.messages import Message, ModelResponse, StreamItem, ToolSpec
from corral.models._adapter import retry_after_seconds
from corral.models.base import Embeddings, Model, ModelSettings, TurnBound
from corral.resources.kinds import Pricing, RetryPolicy

R = TypeVar("R")

__all__ = [
    "MAX_RETRY_AFTER_SECONDS",
    "AllModelsFailedError",
    "FallbackModel",
    "PricedModel",
    "RetryingModel",
    "cost_usd",
    "retry_after_seconds",
]

#: the longest a server's ``Retry-After`` hint may make us wait before one retry
MAX_RETRY_AFTER_SECONDS = 60.0


# --------------------------------------------------------------------------- streams


async def _open_stream(
    model: Model, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
) -> tuple[AsyncIterator[StreamItem], StreamItem]:
    """Start ``model.stream`` and wait for its first item.

    Everything up to the first item may be retried or handed to a fallback, so
    wrappers run this step under their retry logic and the rest without it;
    :func:`_relay` then yields the first item and the rest.
    """
    stream = model.stream(messages, tools, settings)
    try:
        first = await anext(stream)
    except StopAsyncIteration:
        raise ModelError(
            f"model {model.name!r} ended its stream without a response", endpoint=model.name
        ) from None
    # a generator that raised is finished: there is nothing to close on failure
    return stream, first


async def _close(stream: AsyncIterator[StreamItem]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


async def _relay(
    opening: Callable[[], Awaitable[tuple[AsyncIterator[StreamItem], StreamItem]]],
    retries: list[dict[str, Any]] | None = None,
) -> AsyncIterator[StreamItem]:
    """Await ``opening()`` (an :func:`_open_stream`), then yield the first item and the rest;
    the final response carries ``retries`` (those opening took).

    The wrappers' ``stream`` methods return this generator rather than iterating
    it inside one of their own: a nested generator would not be closed when the
    caller's is, and closing this one closes the stream.
    """
    stream, first = await opening()
    try:
        yield _with_retries(first, retries)
        async for item in stream:
            yield _with_retries(item, retries)
    finally:
        await _close(stream)


def _with_retries(item: StreamItem, retries: list[dict[str, Any]] | None) -> StreamItem:
    if retries and isinstance(item, ModelResponse):
        return replace(item, retries=(*item.retries, *retries))
    return item


# --------------------------------------------------------------------------- RetryingModel


def _is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, ModelError) and exc.retryable


class RetryingModel(Model):
    """Retries retryable model errors according to a :class:`RetryPolicy`.

    ``max_attempts`` counts every attempt, the first included. Between attempts
    it waits a random time in ``[0, min(initial * 2**n, max_backoff)]`` (full
    jitter), or exactly the server's ``Retry-After`` when the error carries one
    (at most :data:`MAX_RETRY_AFTER_SECONDS`). The last error is raised as is.
    """

    def __init__(self, inner: Model, policy: RetryPolicy) -> None:
        self.inner = inner
        self.policy = policy
        self.name = inner.name
        self.default_output_tokens = inner.default_output_tokens

    def turn_bound(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> TurnBound:
        return self.inner.turn_bound(messages, tools, settings)

    def _delay(self, exc: BaseException | None, failed_attempts: int) -> float:
        """The wait after ``failed_attempts`` failures: Retry-After, else full jitter."""
        if isinstance(exc, ModelError) and exc.retry_after is not None:
            return min(exc.retry_after, MAX_RETRY_AFTER_SECONDS)
        policy = self.policy
        return jittered_backoff(
            failed_attempts, policy.initial_backoff_seconds, policy.max_backoff_seconds
        )

    def _note(
        self, retries: list[dict[str, Any]], exc: BaseException | None, failed: int, delay: float
    ) -> None:
        """Remember a retry for the journal: the attempt that comes next, of how many,
        after how long, and why."""
        retries.append(
            {
                "retry": failed + 1,
                "max_attempts": self.policy.max_attempts,
                "retry_in": round(delay, 3),
                "code": exc.code if isinstance(exc, ModelError) else "model_error",
                "message": str(exc.message if isinstance(exc, ModelError) else exc),
            }
        )

    def _retrying(self, retries: list[dict[str, Any]], done: int = 0) -> AsyncRetrying:
        """The policy's attempts after ``done`` already failed."""

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome is not None else None
            delay = self._delay(exc, done + state.attempt_number)
            self._note(retries, exc, done + state.attempt_number, delay)
            return delay

        return AsyncRetrying(
            stop=stop_after_attempt(self.policy.max_attempts - done),
            wait=wait,
            retry=retry_if_exception(_is_retryable),
            reraise=True,
        )

    async def request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> ModelResponse:
        retries: list[dict[str, Any]] = []
        response = await self._attempts(retries, self.inner.request, messages, tools, settings)
        if retries:
            return replace(response, retries=(*response.retries, *retries))
        return response

    def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> AsyncIterator[StreamItem]:
        if type(self.inner).stream is Model.stream:
            # The inner model streams by replaying one request (scripted, llama-cpp):
            # replay this model's retried request the same way, one generator instead
            # of a relay around another.
            return super().stream(messages, tools, settings)
        retries: list[dict[str, Any]] = []
        return _relay(
            lambda: self._attempts(retries, _open_stream, self.inner, messages, tools, settings),
            retries,
        )

    async def embed(self, texts: Sequence[str], *, dimensions: int | None = None) -> Embeddings:
        retries: list[dict[str, Any]] = []

        async def embed(batch: Sequence[str]) -> Embeddings:
            return await self.inner.embed(batch, dimensions=dimensions)

        embeddings = await self._attempts(retries, embed, texts)
        if retries:
            return replace(embeddings, retries=(*embeddings.retries, *retries))
        return embeddings

    async def _attempts(
        self, retries: list[dict[str, Any]], call: Callable[..., Awaitable[R]], *args: Any
    ) -> R:
        """``call(*args)`` under the policy; each retry is noted in ``retries``.

        Most calls succeed at once, so the first attempt skips tenacity's per-call
        machinery (measurable at agent-loop speeds); after a retryable failure
        tenacity runs the policy's remaining attempts.
        """
        try:
            return await call(*args)
        except ModelError as exc:
            if not exc.retryable or self.policy.max_attempts < 2:
                raise
            first_failure = exc
        delay = self._delay(first_failure, 1)
        self._note(retries, first_failure, 1, delay)
        await anyio.sleep(delay)
        result: R = await self._retrying(retries, done=1)(call, *args)
        return result

    def credentials(self) -> list[str]:
        return self.inner.credentials()

    async def prepare(self) -> None:
        await self.inner.prepare()

    async def aclose(self) -> None:
        await self.inner.aclose()


# --------------------------------------------------------------------------- PricedModel


def cost_usd(response: ModelResponse, pricing: Pricing) -> float:
    """What one response cost in US dollars under ``pricing``."""
    usage = response.usage
    return (
        usage.input_tokens * pricing.input_per_million
        + usage.output_tokens * pricing.output_per_million
    ) / 1_000_000


class PricedModel(Model):
    """Fills ``ModelResponse.cost_usd`` from usage and per-million-token prices."""

    def __init__(self, inner: Model, pricing: Pricing) -> None:
        self.inner = inner
        self.pricing = pricing
        self.name = inner.name
        self.default_output_tokens = inner.default_output_tokens

    def turn_bound(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> TurnBound:
        """The inner model's bound, priced."""
        bound = self.inner.turn_bound(messages, tools, settings)
        cost = (
            bound.input_tokens * self.pricing.input_per_million
            + bound.output_tokens * self.pricing.output_per_million
        ) / 1_000_000
        return replace(bound, cost_usd=cost)

    def _priced(self, response: ModelResponse) -> ModelResponse:
        return replace(response, cost_usd=cost_usd(response, self.pricing))

    async def request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> ModelResponse:
        return self._priced(await self.inner.request(messages, tools, settings))

    async def embed(self, texts: Sequence[str], *, dimensions: int | None = None) -> Embeddings:
        try:
            embeddings = await self.inner.embed(texts, dimensions=dimensions)
        except ModelError as exc:
            if exc.paid is not None:  # a refused answer is billed as an accepted one
                exc.paid = self._priced_embeddings(exc.paid)
            raise
        return self._priced_embeddings(embeddings)

    def _priced_embeddings(self, embeddings: Embeddings) -> Embeddings:
        cost = embeddings.usage.input_tokens * self.pricing.input_per_million / 1_000_000
        return replace(embeddings, cost_usd=cost)

    async def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> AsyncIterator[StreamItem]:
        stream = self.inner.stream(messages, tools, settings)
        try:
            async for item in stream:
                yield self._priced(item) if isinstance(item, ModelResponse) else item
        finally:
            await _close(stream)

    def credentials(self) -> list[str]:
        return self.inner.credentials()

    async def prepare(self) -> None:
        await self.inner.prepare()

    async def aclose(self) -> None:
        await self.inner.aclose()


# --------------------------------------------------------------------------- FallbackModel


class AllModelsFailedError(ModelError):
    """Every model of a :class:`FallbackModel` failed; ``errors`` holds each failure in order.

    It is retryable when at least one of the failures was.
    """

    def __init__(self, errors: Sequence[ModelError], names: Sequence[str]) -> None:
        details = "; ".join(
            f"{name}: {error.message}" for name, error in zip(names, errors, strict=True)
        )
        last = errors[-1]
        super().__init__(
            f"all {len(errors)} model endpoints failed: {details}",
            retryable=any(error.retryable for error in errors),
            status_code=last.status_code,
            retry_after=last.retry_after,
            endpoint=last.endpoint,
        )
        self.errors = list(errors)


class FallbackModel(Model):
    """Tries each model in order and answers with the first one that succeeds.

    A model that raises :class:`ModelError` (after its own retries) hands the turn
    to the next one; any other exception is a bug and propagates at once.
    """

    def __init__(self, models: Sequence[Model], name: str | None = None) -> None:
        if not models:
            raise ValueError("FallbackModel needs at least one model")
        self.models = list(models)
        self.name = name or self.models[0].name
        caps = [model.default_output_tokens for model in self.models]
        self.default_output_tokens = None if None in caps else max(c or 0 for c in caps)

    def turn_bound(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> TurnBound:
        """The most any of its models can spend (the turn may fall back to any of them)."""
        bounds = [model.turn_bound(messages, tools, settings) for model in self.models]
        return TurnBound(
            max(b.input_tokens for b in bounds),
            max(b.output_tokens for b in bounds),
            max(b.cost_usd for b in bounds),
        )

    async def _first_success(self, call: Callable[[Model], Awaitable[R]]) -> R:
        """``call(model)`` for each model in order, until one does not raise ``ModelError``."""
        errors: list[ModelError] = []
        for model in self.models:
            try:
                return await call(model)
            except ModelError as exc:
                errors.append(exc)
        raise AllModelsFailedError(errors, [model.name for model in self.models])

    async def request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> ModelResponse:
        return await self._first_success(lambda model: model.request(messages, tools, settings))

    def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> AsyncIterator[StreamItem]:
        return _relay(
            lambda: self._first_success(
                lambda model: _open_stream(model, messages, tools, settings)
            )
        )

    async def embed(self, texts: Sequence[str], *, dimensions: int | None = None) -> Embeddings:
        # the first model only: a fallback's vectors would not match the stored ones
        return await self.models[0].embed(texts, dimensions=dimensions)

    async def prepare(self) -> None:
        for model in self.models:
            await model.prepare()

    async def aclose(self) -> None:
        async with AsyncExitStack() as stack:
            for model in reversed(self.models):
                stack.push_async_callback(model.aclose)
