"""The test session refuses connections to hosted model APIs (tests/hosted_apis.py) and
only those: the fake servers on localhost still answer."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from corral.testing.fake_openai import FakeOpenAIServer, FakeReply
from fixtures_models import fake_openai_fixture, openai_server_fixture
from hosted_apis import HostedModelApiRefused

__all__ = ["fake_openai_fixture", "openai_server_fixture"]


def test_an_httpx_request_to_openai_is_refused_naming_the_host() -> None:
    with pytest.raises(HostedModelApiRefused, match=r"api\.openai\.com, a hosted model API"):
        httpx.get("https://api.openai.com/v1/models")


@pytest.mark.parametrize(
    "url",
    [
        "https://API.Anthropic.com./v1/messages",
        "https://my-resource.openai.azure.com/openai/deployments",
        "https://generativelanguage.googleapis.com/v1beta/models",
        "https://openrouter.ai/api/v1/models",
    ],
)
async def test_an_async_request_to_a_hosted_api_is_refused(url: str) -> None:
    async with httpx.AsyncClient() as client:
        with pytest.raises(HostedModelApiRefused) as refused:
            await client.get(url)
    assert refused.value.host == httpx.URL(url).host.lower().rstrip(".")


async def test_the_provider_sdks_cannot_reach_their_default_hosts() -> None:
    # The refusal is raised, or is the cause of the SDK's connection error (anthropic's).
    failures = (HostedModelApiRefused, openai.APIConnectionError, anthropic.APIConnectionError)
    async with openai.AsyncOpenAI(api_key="sk-test", max_retries=0) as client:
        with pytest.raises(failures) as failed:
            await client.models.list()
    assert refusal(failed.value).host == "api.openai.com"
    async with anthropic.AsyncAnthropic(api_key="sk-test", max_retries=0) as other:
        with pytest.raises(failures) as failed:
            await other.models.list()
    assert refusal(failed.value).host == "api.anthropic.com"


def refusal(error: BaseException) -> HostedModelApiRefused:
    """The refusal ``error`` is or was caused by."""
    found: BaseException | None = error
    while found is not None and not isinstance(found, HostedModelApiRefused):
        found = found.__cause__ or found.__context__
    assert found is not None, f"not refused: {error!r}"
    return found


async def test_a_fake_server_on_localhost_still_answers(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.add_reply(FakeReply(text="hello"))
    url = fake_openai.base_url.replace("127.0.0.1", "localhost")
    async with openai.AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0) as client:
        answer = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    assert answer.choices[0].message.content == "hello"
