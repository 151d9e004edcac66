"""What every provider that embeds does, run against each one and its fake server (real HTTP).

Embeddings are a capability of :class:`~corral.models.base.Model`
(:meth:`~corral.models.base.Model.embed`): one batch, one request; vectors in the texts'
order; usage and cost like a chat turn; retries of retryable failures, the endpoint's
timeout, and every failure a :class:`~corral.core.errors.ModelError` (wrong dimensions:
:class:`~corral.core.errors.EmbeddingDimensionsError`). Each test runs once per row of
:data:`PROVIDERS`, through the provider's real SDK. The in-process ``llama-cpp`` provider
is tested on the real SmolLM2 weights in ``tests/test_models_llama_cpp.py``.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from corral.core.errors import (
    ConfigurationError,
    EmbeddingDimensionsError,
    ModelConnectionError,
    ModelError,
    ModelTimeoutError,
)
from corral.models import registry
from corral.models.base import EMBEDDING_PROVIDERS, Model
from corral.models.gateway import FallbackModel
from corral.resources.kinds import ModelEndpointSpec, Pricing
from corral.testing.fake_anthropic import FakeAnthropicServer
from corral.testing.fake_openai import FakeOpenAIServer, hashed_embedding
from fixtures_models import FakeServers, closed_port_url, endpoint, fake_servers_fixture

__all__ = ["fake_servers_fixture"]


@dataclass(frozen=True)
class Provider:
    """One embedding provider under test and how its endpoint reaches the fake server."""

    name: str
    api_path: str = ""
    options: Mapping[str, Any] = field(default_factory=dict[str, Any])
    key: str | None = "sk-test"
    #: the path the embeddings request goes to
    request_path: str = "/v1/embeddings"


PROVIDERS = [
    Provider("openai", "/v1"),
    Provider(
        "azure-openai",
        options={"deployment": "embed-deployment"},
        request_path="/openai/deployments/embed-deployment/embeddings",
    ),
    Provider("ollama", "/v1", key=None),
]


@dataclass
class Api:
    provider: Provider
    server: FakeOpenAIServer

    def spec(self, root: str | None = None, **kw: Any) -> ModelEndpointSpec:
        base_url = (root or self.server.root_url) + self.provider.api_path
        return endpoint(self.provider.name, base_url, **{**self.provider.options, **kw})

    def bare(self, **kw: Any) -> Model:
        module = importlib.import_module(registry.PROVIDERS[self.provider.name])
        model: Model = module.create("embedder", self.spec(**kw), self.provider.key)
        return model

    def built(self, root: str | None = None, **kw: Any) -> Model:
        return registry.build_model("embedder", self.spec(root, **kw), self.provider.key)


@pytest.fixture(params=PROVIDERS, ids=lambda provider: provider.name)
def api(request: pytest.FixtureRequest, fake_servers: FakeServers) -> Api:
    return Api(request.param, fake_servers.get(FakeOpenAIServer))


def test_the_providers_under_test_are_the_ones_that_embed_over_http() -> None:
    assert {p.name for p in PROVIDERS} | {"llama-cpp"} == EMBEDDING_PROVIDERS


async def test_a_batch_is_one_request_and_the_vectors_come_in_the_texts_order(api: Api) -> None:
    texts = ["the cat sat on the mat", "stock prices fell", "a cat on a mat"]
    model = api.bare()
    embeddings = await model.embed(texts)
    assert api.server.calls == 1
    sent = api.server.requests[0]
    assert sent.path == api.provider.request_path
    assert sent.json["input"] == texts
    assert sent.json["encoding_format"] == "float"
    assert embeddings.vectors == [hashed_embedding(t, 16) for t in texts]
    assert embeddings.dimensions == 16
    assert embeddings.endpoint == "embedder"
    assert embeddings.usage.input_tokens == 6 + 3 + 5 and embeddings.usage.requests == 1
    await model.aclose()


async def test_embeddings_are_priced_at_the_input_price(api: Api) -> None:
    model = api.built(pricing=Pricing(input_per_million=2.0, output_per_million=100.0))
    embeddings = await model.embed(["one two three four"])
    assert embeddings.usage.input_tokens == 4
    assert math.isclose(embeddings.cost_usd, 4 * 2.0 / 1_000_000)
    await model.aclose()


async def test_a_server_error_is_retried_by_the_endpoint_policy(api: Api) -> None:
    api.server.fail(500, times=2)
    model = api.built(max_attempts=3)
    embeddings = await model.embed(["hello"])
    assert api.server.calls == 3
    assert [r["code"] for r in embeddings.retries] == ["model_error", "model_error"]
    await model.aclose()


async def test_a_server_error_left_after_the_retries_is_a_retryable_model_error(
    api: Api,
) -> None:
    api.server.fail(503, times=None)
    model = api.built(max_attempts=2)
    with pytest.raises(ModelError) as caught:
        await model.embed(["hello"])
    assert caught.value.retryable and caught.value.status_code == 503
    assert api.server.calls == 2
    await model.aclose()


async def test_a_refused_request_is_not_retried(api: Api) -> None:
    api.server.fail(400, message="input too long")
    model = api.built(max_attempts=3)
    with pytest.raises(ModelError, match="input too long") as caught:
        await model.embed(["hello"])
    assert not caught.value.retryable and api.server.calls == 1
    await model.aclose()


async def test_a_hanging_server_is_a_timeout_within_the_endpoint_timeout(api: Api) -> None:
    api.server.delay(5.0)
    model = api.bare(timeout=0.3)
    with pytest.raises(ModelTimeoutError, match="embedder"):
        await model.embed(["hello"])
    await model.aclose()


async def test_a_trickling_answer_runs_into_the_whole_call_deadline(api: Api) -> None:
    api.server.delay(0.0, chunk_delay=0.2)
    model = api.bare(timeout=0.3)
    with pytest.raises(ModelTimeoutError):
        await model.embed(["hello"])
    await model.aclose()


async def test_an_unreachable_server_is_a_connection_error(api: Api) -> None:
    model = api.built(root=closed_port_url().removesuffix("/v1"))
    with pytest.raises(ModelConnectionError):
        await model.embed(["hello"])
    await model.aclose()


async def test_vectors_of_other_dimensions_than_fixed_are_a_clear_error(api: Api) -> None:
    api.server.embed_with(dimensions=8)
    model = api.built(max_attempts=3)
    with pytest.raises(EmbeddingDimensionsError) as caught:
        await model.embed(["hello"], dimensions=16)
    error = caught.value
    assert error.code == "embedding_dimensions_mismatch" and not error.retryable
    assert "8 dimensions, not the 16" in error.message
    assert api.server.calls == 1
    await model.aclose()


@pytest.mark.parametrize(
    ("vector", "problem"),
    [([], "sizes"), (["0.5", "x"], "not numbers")],
    ids=["empty", "words"],
)
async def test_a_malformed_vector_is_a_model_error(
    api: Api, vector: list[Any], problem: str
) -> None:
    api.server.embed_with(lambda _text, _dims: vector)
    model = api.bare()
    with pytest.raises(ModelError, match=problem):
        await model.embed(["hello"])
    await model.aclose()


async def test_a_fallback_chain_embeds_with_its_first_model_only(
    api: Api, fake_servers: FakeServers
) -> None:
    """A fallback's vectors would not match the stored ones: its failure is the answer."""
    backup = fake_servers.get(FakeOpenAIServer, "backup")
    api.server.fail(500, times=None)
    chain = FallbackModel([api.built(), api.built(root=backup.root_url)])
    with pytest.raises(ModelError):
        await chain.embed(["hello"])
    assert backup.calls == 0
    await chain.aclose()


async def test_a_provider_without_embeddings_refuses_clearly(fake_servers: FakeServers) -> None:
    server = fake_servers.get(FakeAnthropicServer)
    model = registry.build_model(
        "chat-only", endpoint("anthropic", server.root_url, model="claude"), "sk-test"
    )
    with pytest.raises(ConfigurationError, match="'chat-only': its provider has no embeddings"):
        await model.embed(["hello"])
    assert server.calls == 0
    await model.aclose()
