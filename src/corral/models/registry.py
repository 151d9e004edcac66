"""Turn a ``ModelEndpoint`` resource into a live :class:`Model`.

Provider facts live in the provider modules; this file only knows which module
serves which provider name. Each provider module exposes
``create(name, spec, api_key) -> Model``; it is imported on first use so that
``corral --help`` does not pay for SDKs it does not need.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from corral.core.errors import ConfigurationError
from corral.models.base import Model
from corral.resources.kinds import ModelEndpointSpec

PROVIDERS: dict[str, str] = {
    "openai": "corral.models.openai",
    "azure-openai": "corral.models.openai",
    "ollama": "corral.models.openai",
    "anthropic": "corral.models.anthropic",
    "llama-cpp": "corral.models.llama_cpp",
    "scripted": "corral.models.scripted",
}


def build_model(name: str, spec: ModelEndpointSpec, api_key: str | None) -> Model:
    """A provider model wrapped with the endpoint's retry policy and pricing.

    An endpoint without prices gets no :class:`~corral.models.gateway.PricedModel`:
    every response already says it cost 0.0, and the wrapper would add a generator
    to every streamed turn for nothing.
    """
    from corral.models.gateway import PricedModel, RetryingModel

    module_name = PROVIDERS.get(spec.provider)
    if module_name is None:
        raise ConfigurationError(f"model endpoint {name!r}: unknown provider {spec.provider!r}")
    module = importlib.import_module(module_name)
    model: Model = module.create(name, spec, api_key)
    model = RetryingModel(model, spec.retry)
    pricing = spec.pricing
    if pricing.input_per_million == 0 and pricing.output_per_million == 0:
        return model
    return PricedModel(model, pricing)


def with_fallbacks(models: Sequence[Model]) -> Model:
    """The first model, falling back to the next ones when it keeps failing."""
    from corral.models.gateway import FallbackModel

    return models[0] if len(models) == 1 else FallbackModel(list(models))
