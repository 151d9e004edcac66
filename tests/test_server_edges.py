"""Edges of the HTTP layer a hostile client pushes on: metric labels it could multiply,
a chunked body past the limit, and token guessing.

Each runs against a real ``corral serve`` (uvicorn on a random port, over real HTTP).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from corral.core.settings import Settings
from corral.core.tokens import ApiToken, Role
from corral.resources.secrets import SecretCipher
from corral.store import Store
from corral.store.sql import SqlStore
from server_harness import LiveServer

# ----------------------------------------------------------------------------- metrics


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("home"), workers=0, max_body_bytes=2048) as live:
        yield live


def scrape(client: httpx.Client) -> tuple[int, set[tuple[str, str, str]]]:
    """The number of series /metrics exposes, and the label sets of the request counter."""
    response = client.get("/metrics")
    assert response.status_code == 200
    series = 0
    requests: set[tuple[str, str, str]] = set()
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            series += 1
            if sample.name == "corral_http_requests_total":
                labels = sample.labels
                requests.add((labels["method"], labels["route"], labels["status"]))
    return series, requests


def hostile_requests(client: httpx.Client, round_: int) -> None:
    """334 made-up methods on made-up paths, 333 on a real route, 333 real ids."""
    for i in range(1000):
        kind = i % 3
        if kind == 0:
            method, path = f"Q{round_}X{i}" + "Q" * (i % 50), f"/no/such/{round_}/{i}"
        elif kind == 1:
            method, path = f"m{round_}-{i}".lower(), "/healthz"
        else:
            method, path = "GET", f"/v1/tasks/no-such-task-{round_}-{i}"
        response = client.request(method, path)
        assert response.status_code in (401, 404, 405), (method, path, response.status_code)


def test_metrics_label_values_come_from_fixed_sets_whatever_the_requests(
    server: LiveServer,
) -> None:
    with server.client() as client:
        hostile_requests(client, 0)  # every kind of label set exists from here on
        scrape(client)
        before, _ = scrape(client)
        hostile_requests(client, 1)
        after, requests = scrape(client)
    assert after == before
    assert requests == {
        ("other", "unmatched", "404"),
        ("other", "/healthz", "405"),
        ("GET", "/v1/tasks/{task_id}", "401"),
        ("GET", "/metrics", "200"),
    }


# ----------------------------------------------------------------------------- body limit


def test_a_chunked_json_body_over_the_limit_is_413_not_400(server: LiveServer) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"agent": "a", "input": "'
        for _ in range(50):
            yield b"x" * 100
        yield b'"}'

    token = server.mint("default", Role.OPERATOR)
    with server.client(token) as client:
        response = client.post(
            "/v1/tasks", content=chunks(), headers={"Content-Type": "application/json"}
        )
        assert response.request.headers["transfer-encoding"] == "chunked"
        assert response.status_code == 413
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["code"] == "payload_too_large"
        assert "2048 bytes" in response.json()["detail"]

    with server.client(token) as client:  # a body under the limit still goes through
        small = client.post(
            "/v1/tasks",
            content=iter([b'{"agent": "none", ', b'"input": "x"}']),
            headers={"Content-Type": "application/json"},
        )
        assert small.status_code == 422, small.text  # no agent "none": past the body limit


# ----------------------------------------------------------------------------- auth failures


class CountingStore(SqlStore):
    """A store that counts the token lookups the server makes."""

    lookups = 0

    async def get_token(self, token_id: str) -> ApiToken | None:
        CountingStore.lookups += 1
        return await super().get_token(token_id)


async def open_counting(settings: Settings) -> Store:
    return await CountingStore.open(settings.db_url, cipher=SecretCipher.from_settings(settings))


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(
        tmp_path_factory.mktemp("home"),
        workers=0,
        rate_limit=100.0,
        rate_burst=100,
        auth_failure_rate=0.01,  # one failure refilled per 100 s: none within the test
        auth_failure_burst=3,
        open_store_with=open_counting,
    )
    with live:
        yield live


def from_address(server: LiveServer, address: str, token: str | None = None) -> httpx.Client:
    """A client whose connections come from ``address`` (any of 127.0.0.0/8 on Linux)."""
    return server.client(token, transport=httpx.HTTPTransport(local_address=address))


def test_failed_authentication_is_rate_limited_per_address_before_any_lookup(
    guarded: LiveServer,
) -> None:
    guessed = "corral_" + "0" * 12 + "_" + "x" * 32
    with from_address(guarded, "127.0.0.1", guessed) as client:
        assert [client.get("/v1/tasks").status_code for _ in range(3)] == [401, 401, 401]
        lookups = CountingStore.lookups
        limited = [client.get("/v1/tasks") for _ in range(20)]
        assert {r.status_code for r in limited} == {429}
        assert CountingStore.lookups == lookups  # refused before the store is asked
        body = limited[0].json()
        assert body["code"] == "rate_limited"
        assert "failed authentications" in body["detail"]
        assert int(limited[0].headers["retry-after"]) >= 90
        # no token at all guesses nothing: 401 even now, the address's lock aside
        assert client.get("/v1/tasks", headers={"Authorization": ""}).status_code == 401

    with from_address(guarded, "127.0.0.2", guessed) as other:
        assert other.get("/v1/tasks").status_code == 401  # another address has its own bucket


def test_successful_requests_never_count_as_failures_of_their_address(
    guarded: LiveServer,
) -> None:
    good = guarded.mint("default", Role.VIEWER)
    with from_address(guarded, "127.0.0.3") as client:
        ok = [
            client.get("/v1/tasks", headers={"Authorization": f"Bearer {good}"}) for _ in range(10)
        ]
        assert [r.status_code for r in ok] == [200] * 10
        bad = [client.get("/v1/tasks", headers={"Authorization": "Bearer nope"}) for _ in range(4)]
        assert [r.status_code for r in bad] == [401, 401, 401, 429]
        # past its failures the address waits, whatever it sends: a right guess does not
        # lift the lock early
        assert (
            client.get("/v1/tasks", headers={"Authorization": f"Bearer {good}"}).status_code == 429
        )


def test_a_request_without_a_token_is_401_and_never_counts_as_a_failed_authentication(
    guarded: LiveServer,
) -> None:
    """A client that sends no Authorization header (or one that is not a bearer token) is
    told to send one; it guessed nothing, so its address is not locked out for it."""
    good = guarded.mint("default", Role.VIEWER)
    with from_address(guarded, "127.0.0.4") as client:
        lookups = CountingStore.lookups
        answers = [client.get("/v1/tasks") for _ in range(10)]
        answers += [client.get("/v1/links") for _ in range(5)]
        answers += [client.get("/v1/tasks", headers={"Authorization": "Basic dTpw"})]
        answers += [client.get("/v1/tasks", headers={"Authorization": "Bearer"})]
        assert [a.status_code for a in answers] == [401] * len(answers), [a.text for a in answers]
        assert all(a.headers["www-authenticate"].startswith("Bearer") for a in answers)
        assert CountingStore.lookups == lookups
        ok = client.get("/v1/tasks", headers={"Authorization": f"Bearer {good}"})
        assert ok.status_code == 200, ok.text


# ----------------------------------------------------------------------------- cursors


def forged(value: object) -> str:
    """A cursor in the server's encoding (base64url JSON) of a position it never issued."""
    text = value if isinstance(value, str) else json.dumps(value)
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


FORGED_CURSORS = {
    "not base64 JSON": "bm90LWEtY3Vyc29y",
    "not a list": forged({"a": 1}),
    "too short": forged([1.0]),
    "a boolean": forged([True, "x"]),
    "an out-of-range number": forged('[1e999, "x"]'),
    "an integer past a float": forged(f'[{10**400}, "x"]'),
    "NaN": forged('[NaN, "x"]'),
    "NUL in the id": forged([1.0, "a\u0000b"]),
    "a lone surrogate": forged('[1.0, "\\ud800"]'),
}
#: Each keyset list, a position it issues and one of another list (a foreign cursor).
LISTS = {
    "/v1/approvals": ([1.0, "x"], ["Agent", "x"]),
    "/v1/sessions": ([1.0, "x"], ["Agent", "x"]),
    "/v1/tokens": ([1.0, "x"], ["Agent", "x"]),
    "/v1/tasks": ([1.0, "x"], ["Agent", "x"]),
    "/v1/resources": (["Agent", "x"], [1.0, "x"]),
}


@pytest.mark.parametrize("path", sorted(LISTS))
def test_a_forged_cursor_is_a_422_naming_it_never_a_500(server: LiveServer, path: str) -> None:
    issued, foreign = LISTS[path]
    cursors = FORGED_CURSORS | {"a cursor of another list": forged(foreign)}
    with server.client(server.admin) as client:
        assert client.get(path, params={"cursor": forged(issued)}).status_code == 200
        for why, cursor in cursors.items():
            response = client.get(path, params={"cursor": cursor})
            assert response.status_code == 422, why
            body = response.json()
            assert (body["code"], body["errors"][0]["field"]) == ("invalid_request", "query.cursor")


def test_tokens_page_through_more_than_a_page(server: LiveServer) -> None:
    with server.client(server.admin) as client:
        made = {client.post("/v1/tokens", json={"role": "viewer"}).json()["id"] for _ in range(3)}
        seen: list[str] = []
        cursor = None
        while True:
            params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
            page = client.get("/v1/tokens", params=params).json()
            seen += [t["id"] for t in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
    assert len(seen) == len(set(seen)) and made <= set(seen)


def test_json_apply_keeps_characters_beyond_the_bmp_and_refuses_lone_surrogates(
    server: LiveServer,
) -> None:
    # JSON escapes 👋 as a surrogate pair; the documents must not reach YAML as two halves
    text = "héllo 👋 世界 \U0010ffff \\ud83d literally"
    document = {
        "apiVersion": "corral/v1",
        "kind": "ModelEndpoint",
        "metadata": {"name": "wave", "labels": {"émoji": "👋"}},
        "spec": {"provider": "scripted", "script": [{"text": text}]},
    }
    with server.client(server.admin) as client:
        applied = client.post("/v1/resources", json=document)
        assert applied.status_code == 200, applied.text
        stored = client.get("/v1/resources/ModelEndpoint/wave").json()
        assert stored["spec"]["script"][0]["text"] == text
        assert stored["metadata"]["labels"] == {"émoji": "👋"}
        lone = json.dumps(document).replace("\\ud83d\\udc4b", "\\ud83d")
        refused = client.post(
            "/v1/resources", content=lone, headers={"Content-Type": "application/json"}
        )
        assert refused.status_code == 422, refused.text
        assert "lone surrogate" in refused.text
