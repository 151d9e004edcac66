"""Limits and failures of the HTTP layer: rate limit (429), body size (413), and an
unexpected error that must reach the client as a bare 500 with no trace of the code."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from corral.core.sessions import Session
from corral.core.settings import Settings
from corral.core.tokens import Role
from corral.resources.secrets import SecretCipher
from corral.server.limits import RateLimiter
from corral.store import Store
from corral.store.sql import SqlStore
from server_harness import LiveServer


class ExplodingStore(SqlStore):
    """A store whose session listing fails the way a bug would."""

    async def list_sessions(
        self,
        namespace: str,
        agent: str | None = None,
        *,
        limit: int | None = None,
        after: tuple[float, str] | None = None,
    ) -> list[Session]:
        raise RuntimeError("secret detail: /srv/corral/internal.db row 42")


async def open_exploding(settings: Settings) -> Store:
    return await ExplodingStore.open(settings.db_url, cipher=SecretCipher.from_settings(settings))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(
        tmp_path_factory.mktemp("home"),
        workers=0,
        rate_limit=1.0,
        rate_burst=3,
        max_body_bytes=2048,
        open_store_with=open_exploding,
    )
    with live:
        yield live


def test_a_token_past_its_rate_gets_429_with_retry_after(server: LiveServer) -> None:
    with server.client(server.mint("default", Role.VIEWER)) as client:
        statuses = [client.get("/v1/tasks").status_code for _ in range(4)]
        assert statuses == [200, 200, 200, 429]
        limited = client.get("/v1/tasks")
        assert limited.json()["code"] == "rate_limited"
        assert int(limited.headers["retry-after"]) >= 1
    with server.client(server.mint("default", Role.VIEWER)) as other:
        assert other.get("/v1/tasks").status_code == 200  # buckets are per token


def test_a_body_over_the_limit_is_413_declared_or_streamed(server: LiveServer) -> None:
    with server.client(server.mint("default", Role.ADMIN)) as client:
        big = "# padding\n" * 500
        declared = client.post(
            "/v1/resources", content=big, headers={"Content-Type": "application/yaml"}
        )
        assert (declared.status_code, declared.json()["code"]) == (413, "payload_too_large")

        def chunks() -> Iterator[bytes]:
            for _ in range(50):
                yield b"# padding\n" * 10

        streamed = client.post(
            "/v1/resources", content=chunks(), headers={"Content-Type": "application/yaml"}
        )
        assert streamed.status_code == 413


def test_an_unexpected_error_is_a_generic_500_without_a_trace(server: LiveServer) -> None:
    with server.client(server.mint("default", Role.VIEWER)) as client:
        response = client.get("/v1/sessions")
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == "internal_error"
    assert "secret detail" not in response.text and "Traceback" not in response.text
    assert "RuntimeError" not in response.text


def test_the_rate_limiter_refills_at_its_rate_and_forgets_idle_tokens() -> None:
    limiter = RateLimiter(rate=2.0, burst=2)
    assert [limiter.acquire("a", now=0.0) for _ in range(2)] == [None, None]
    wait = limiter.acquire("a", now=0.0)
    assert wait == pytest.approx(0.5)
    assert limiter.acquire("a", now=0.5) is None
    assert RateLimiter(rate=0, burst=1).acquire("a") is None  # 0 turns it off
    limiter.acquire("b", now=0.5)
    limiter.acquire("c", now=1000.0)  # a sweep: a and b are full again, forgotten
    assert set(limiter._buckets) == {"c"}
