"""Wrappers that add gateway behaviour around any :class:`~corral.models.base.Model`.

Each wrapper is a ``Model`` itself, so they compose::

    FallbackModel([
        PricedModel(RetryingModel(primary, retry_policy), pricing),
        PricedModel(RetryingModel(secondary, retry_policy), pricing),
    ])

- :class:`RetryingModel` retries retryable :class:`~corral.core.errors.ModelError`
  with exponential backoff and full jitter, honouring the server's ``Retry-After``.
- :class:`PricedModel` fills ``ModelResponse.cost_usd`` from the endpoint's prices.
- :class:`FallbackModel` moves on to the next model when one fails for good.

A stream is retried (or falls back) only while nothing has been yielded yet: once
a caller has seen a text delta, replaying the turn would show it twice.

The module also holds two helpers the provider adapters share:
:func:`retry_after_seconds`, the one parser of the ``Retry-After`` hint they
attach to their errors, and :class:`CallDeadline`, the whole-call time budget.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, contextmanager
from dataclasses import replace

import anyio
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_random_exponential

from corral.core.errors import ModelError
from corral.core.messages import Message, ModelResponse, StreamItem, ToolSpec
from corral.models.base import Model, ModelSettings
from corral.resources.kinds import Pricing, RetryPolicy

#: the longest a server's ``Retry-After`` hint may make us wait before one retry
MAX_RETRY_AFTER_SECONDS = 60.0


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """The server's retry hint in seconds, or ``None`` when it gave none.

    Reads ``retry-after-ms`` (sent by OpenAI) and ``retry-after`` as either a
    number of seconds or an HTTP date. ``headers`` must look names up without
    regard to case, as ``httpx`` headers do.
    """
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            value = float(millis) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        value = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())
    return value if math.isfinite(value) and value >= 0 else None


# --------------------------------------------------------------------------- streams


async def _open_stream(
    model: Model, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
) -> tuple[AsyncIterator[StreamItem], StreamItem]:
    """Start ``model.stream`` and wait for its first item.

    Everything up to the first item may be retried or handed to a fallback, so
    wrappers run this step under their retry logic and the rest without it. The
    caller yields the first item, then the rest, and closes the stream itself
    (a nested generator would not be closed when the caller is).
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
        self._backoff = wait_random_exponential(
            multiplier=policy.initial_backoff_seconds, max=policy.max_backoff_seconds
        )

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, ModelError) and exc.retry_after is not None:
            return min(exc.retry_after, MAX_RETRY_AFTER_SECONDS)
        return float(self._backoff(state))

    def _retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            stop=stop_after_attempt(self.policy.max_attempts),
            wait=self._wait,
            retry=retry_if_exception(_is_retryable),
            reraise=True,
        )

    async def request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> ModelResponse:
        response: ModelResponse = await self._retrying()(
            self.inner.request, messages, tools, settings
        )
        return response

    async def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> AsyncIterator[StreamItem]:
        opened: tuple[AsyncIterator[StreamItem], StreamItem] = await self._retrying()(
            _open_stream, self.inner, messages, tools, settings
        )
        stream, first = opened
        try:
            yield first
            async for item in stream:
                yield item
        finally:
            await _close(stream)

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

    def _priced(self, response: ModelResponse) -> ModelResponse:
        return replace(response, cost_usd=cost_usd(response, self.pricing))

    async def request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> ModelResponse:
        return self._priced(await self.inner.request(messages, tools, settings))

    async def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> AsyncIterator[StreamItem]:
        stream = self.inner.stream(messages, tools, settings)
        try:
            async for item in stream:
                yield self._priced(item) if isinstance(item, ModelResponse) else item
        finally:
            await _close(stream)

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

    def _failed(self, errors: list[ModelError]) -> ModelError:
        return AllModelsFailedError(errors, [m.name for m in self.models])

    async def request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> ModelResponse:
        errors: list[ModelError] = []
        for model in self.models:
            try:
                return await model.request(messages, tools, settings)
            except ModelError as exc:
                errors.append(exc)
        raise self._failed(errors)

    async def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> AsyncIterator[StreamItem]:
        errors: list[ModelError] = []
        opened: tuple[AsyncIterator[StreamItem], StreamItem] | None = None
        for model in self.models:
            try:
                opened = await _open_stream(model, messages, tools, settings)
                break
            except ModelError as exc:
                errors.append(exc)
        if opened is None:
            raise self._failed(errors)
        stream, first = opened
        try:
            yield first
            async for item in stream:
                yield item
        finally:
            await _close(stream)

    async def prepare(self) -> None:
        for model in self.models:
            await model.prepare()

    async def aclose(self) -> None:
        async with AsyncExitStack() as stack:
            for model in reversed(self.models):
                stack.push_async_callback(model.aclose)


# --------------------------------------------------------------------------- for adapters


class CallDeadline:
    """The time budget of one model call, spent only while waiting on the server.

    SDK timeouts bound each read; a server that trickles a byte every few seconds
    never trips them. Adapters wrap every wait (the request, each stream chunk)
    in :meth:`waiting`, which raises ``TimeoutError`` once the budget is spent.
    Time the caller spends between stream items is not charged.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.remaining = seconds

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Charge the time spent inside the block; raise ``TimeoutError`` past the budget."""
        start = anyio.current_time()
        try:
            with anyio.fail_after(max(self.remaining, 0.0)):
                yield
        finally:
            self.remaining -= anyio.current_time() - start
