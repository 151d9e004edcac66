"""The ``http`` memory backend beyond the conformance suite: what it sends (auth, the
idempotency key, the contract version), the SSRF guard, a service that hangs, dies,
redirects or lies (a stable code each, never a traceback, never the secret), and the
backend behind the agent tools and the API.

The service is real (``tests/memory_service.py``: uvicorn on 127.0.0.1).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from backends import Backend, backend_fixture, deployment_fixture
from corral.core.errors import ResourceError, ToolError
from corral.core.events import EventType
from corral.core.memory import MemoryBackendError, MemoryEntry, MemoryInputError, MemoryPlace
from corral.core.redaction import Redactor
from corral.core.runs import RunState
from corral.core.settings import Settings
from corral.resources.kinds import STORED
from corral.resources.loader import load_text
from corral.resources.memory import MemorySpec
from corral.store import Store
from corral.tools.base import ToolContext
from corral.tools.memory import MemoryBinding, MemoryTool
from corral.tools.memory_backend import open_memory_backend
from corral.tools.memory_http import HttpMemoryBackend
from memory_service import MemoryService, memory_service
from nats_servers import nats_prefix_fixture, nats_server_url_fixture
from server_harness import LiveServer, apply

__all__ = [
    "backend_fixture",
    "deployment_fixture",
    "nats_prefix_fixture",
    "nats_server_url_fixture",
]

TOKEN = "svc-token-0123456789abcdef"
NOTES = MemoryPlace("default", "notes")


@pytest.fixture
def service(tmp_path: Path) -> Iterator[MemoryService]:
    with memory_service(tmp_path / "service.db", token=TOKEN) as running:
        yield running


def http_spec(url: str, **http: Any) -> MemorySpec:
    return MemorySpec(
        backend="http",
        http={
            "url": url,
            "allow_private": True,
            "auth": {"type": "bearer", "secret": "svc"},
            **http,
        },
    )


def backend_of(service: MemoryService, **http: Any) -> HttpMemoryBackend:
    backend = open_memory_backend("notes", http_spec(service.url, **http), None, {"svc": TOKEN})  # type: ignore[arg-type]
    assert isinstance(backend, HttpMemoryBackend)
    return backend


def entry(key: str, text: str, **extra: Any) -> MemoryEntry:
    return MemoryEntry("default", "notes", "", key, text, **extra)


async def test_a_write_carries_the_auth_the_version_and_its_idempotency_key(
    service: MemoryService,
) -> None:
    backend = backend_of(service)
    try:
        await backend.write(entry("k", "hello there", idempotency_key="run_1:1:0:abc"))
        await backend.write(entry("k2", "no key of its own"))
    finally:
        await backend.aclose()
    first, second = service.requests
    assert first.path == "write" and first.body["version"] == 1
    assert first.headers["authorization"] == f"Bearer {TOKEN}"
    assert first.headers["idempotency-key"] == "run_1:1:0:abc"
    assert first.body["place"] == {"namespace": "default", "memory": "notes", "scope_key": ""}
    assert "idempotency-key" not in second.headers


async def test_a_wrong_token_is_refused_and_the_message_holds_no_secret(
    service: MemoryService,
) -> None:
    backend = open_memory_backend(
        "notes",
        http_spec(service.url),
        None,
        {"svc": "wrong-token-abcdef123456"},  # type: ignore[arg-type]
    )
    try:
        with pytest.raises(MemoryBackendError) as raised:
            await backend.read(NOTES, "k")
    finally:
        await backend.aclose()
    assert raised.value.code == "memory_backend_refused" and not raised.value.retryable
    assert "HTTP 401" in raised.value.message
    assert "wrong-token" not in raised.value.message


@pytest.mark.parametrize(
    ("misbehave", "code", "said"),
    [
        ("not_json", "memory_backend_bad_answer", "not JSON"),
        ("deep", "memory_backend_bad_answer", "not JSON"),
        ("wrong_shape", "memory_backend_bad_answer", "entry"),
        ("wrong_version", "memory_backend_bad_answer", "contract version"),
        ("huge", "memory_backend_bad_answer", "larger than"),
        ("redirect", "memory_backend_bad_answer", "redirect, not followed"),
        ("fail", "memory_backend_unavailable", "HTTP 500"),
        ("die", "memory_backend_unavailable", "RemoteProtocolError"),
        ("refuse", "memory_backend_refused", "HTTP 403"),
        ("foreign_key", "memory_backend_bad_answer", "answered key"),
    ],
)
async def test_a_service_that_lies_fails_with_a_stable_code_and_no_secret(
    service: MemoryService, misbehave: str, code: str, said: str
) -> None:
    backend = backend_of(service)
    try:
        await backend.write(entry("k", "some words"))
        service.misbehave = misbehave
        with pytest.raises(MemoryBackendError) as raised:
            await backend.read(NOTES, "k")
    finally:
        await backend.aclose()
    error = raised.value
    assert error.code == code, error.message
    assert said in error.message
    assert TOKEN not in error.message and TOKEN not in json.dumps(error.to_dict())
    assert "\x1b" not in error.message
    assert error.retryable is (code == "memory_backend_unavailable")


async def test_more_results_than_asked_or_out_of_order_are_refused(
    service: MemoryService,
) -> None:
    backend = backend_of(service)
    try:
        for key in ("a", "b", "c"):
            await backend.write(entry(key, "common words"))
        service.misbehave = "too_many"
        with pytest.raises(MemoryBackendError, match="hits for top_k"):
            await backend.search(NOTES, "common", top_k=2)
        with pytest.raises(MemoryBackendError, match=r"for a limit of|ascending"):
            await backend.list_entries(NOTES, limit=3)
    finally:
        await backend.aclose()


@pytest.mark.parametrize("misbehave", ["hang", "trickle"])
async def test_a_service_that_hangs_times_out_within_the_memorys_timeout(
    service: MemoryService, misbehave: str
) -> None:
    backend = backend_of(service, timeout_seconds=0.5)
    service.misbehave = misbehave
    try:
        with anyio.fail_after(10):  # the backend's own timeout ends it, far sooner
            with pytest.raises(MemoryBackendError) as raised:
                await backend.read(NOTES, "k")
    finally:
        await backend.aclose()
    assert raised.value.code == "memory_backend_timeout" and raised.value.retryable


async def test_a_service_that_is_gone_is_unavailable(tmp_path: Path) -> None:
    with memory_service(tmp_path / "service.db", token=TOKEN) as gone:
        url = gone.url
    backend = open_memory_backend("notes", http_spec(url), None, {"svc": TOKEN})  # type: ignore[arg-type]
    try:
        with pytest.raises(MemoryBackendError) as raised:
            await backend.search(NOTES, "anything")
    finally:
        await backend.aclose()
    assert raised.value.code == "memory_backend_unavailable" and raised.value.retryable


async def test_the_ssrf_guard_blocks_a_private_service_without_allow_private(
    service: MemoryService,
) -> None:
    # a url apply would refuse, as a spec read back from an older store may hold it
    spec = MemorySpec.model_validate(
        {"backend": "http", "http": {"url": service.url}}, context=STORED
    )
    backend = open_memory_backend("notes", spec, None, {})  # type: ignore[arg-type]
    try:
        with pytest.raises(MemoryBackendError) as raised:
            await backend.read(NOTES, "k")
    finally:
        await backend.aclose()
    assert raised.value.code == "memory_backend_blocked"
    assert service.requests == []


async def test_input_the_service_refuses_is_the_callers_error(service: MemoryService) -> None:
    backend = backend_of(service)
    try:
        with pytest.raises(MemoryInputError, match="NUL"):
            await backend.search(NOTES, "x", filters={"k": "a\x00b"})
        service.misbehave = "invalid_input"
        with pytest.raises(MemoryInputError, match="memory 'notes': too sad") as raised:
            await backend.search(NOTES, "anything")
        assert not isinstance(raised.value, MemoryBackendError)
    finally:
        await backend.aclose()


async def test_apply_refuses_an_http_memory_without_a_safe_url(env: tuple[Store, Settings]) -> None:
    store, _ = env

    def memory(spec: dict[str, Any]) -> str:
        return json.dumps(
            {"apiVersion": "corral/v1", "kind": "Memory", "metadata": {"name": "m"}, "spec": spec}
        )

    for spec, reason in [
        ({"backend": "http"}, "needs an 'http' block"),
        ({"backend": "http", "http": {"url": "http://127.0.0.1:9/m"}}, "loopback|private"),
        ({"backend": "http", "http": {"url": "http://user:pw@example.com/m"}}, "credentials"),
        ({"backend": "http", "http": {"url": "ftp://example.com/m"}}, "only http and https"),
        ({"http": {"url": "https://example.com/m"}}, "for backend 'http' only"),
        (
            {"backend": "http", "http": {"url": "https://example.com", "auth": {"type": "bearer"}}},
            "secret",
        ),
    ]:
        with pytest.raises(ResourceError, match=reason):
            await store.apply(load_text(memory(spec), "m.yaml"))
    # the auth secret is a reference apply checks
    with pytest.raises(ResourceError, match="Secret 'svc' not found"):
        await store.apply(
            load_text(
                memory(
                    {
                        "backend": "http",
                        "http": {
                            "url": "https://example.com",
                            "auth": {"type": "bearer", "secret": "svc"},
                        },
                    }
                ),
                "m.yaml",
            )
        )


async def test_a_memory_tool_says_a_backend_failure_as_a_tool_error(
    service: MemoryService,
) -> None:
    spec = http_spec(service.url)
    backend = backend_of(service)
    tool = MemoryTool(
        "search",
        [MemoryBinding("notes", spec, "read", backend)],
        None,
        lambda: Redactor(),  # type: ignore[arg-type]
    )
    ctx = ToolContext("run_1", "reader", "default", "call_1", "run_1:1:0", Path("."))
    service.misbehave = "fail"
    try:
        with pytest.raises(ToolError) as raised:
            await tool.call({"query": "anything"}, ctx)
    finally:
        await backend.aclose()
    assert raised.value.info.code == "unavailable" and raised.value.retryable
    assert raised.value.info.details == {"memory_backend": "memory_backend_unavailable"}
    assert TOKEN not in raised.value.info.reason


def _doc(kind: str, name: str, spec: dict[str, Any]) -> str:
    return json.dumps(
        {"apiVersion": "corral/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}
    )


async def test_agents_write_and_search_an_http_memory_and_a_replay_writes_once(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMORY_SERVICE_TOKEN", TOKEN)
    store = backend.store
    with memory_service(tmp_path / "service.db", token=TOKEN) as svc:
        http = {"url": svc.url, "allow_private": True, "auth": {"type": "bearer", "secret": "svc"}}
        write = {
            "name": "memory_write",
            "arguments": {"text": "The code word is mango", "key": "cw"},
        }
        search = {"name": "memory_search", "arguments": {"query": "code word"}}
        await store.apply(
            load_text(
                "\n---\n".join(
                    [
                        _doc("Secret", "svc", {"from_env": "MEMORY_SERVICE_TOKEN"}),
                        _doc("Memory", "notes", {"backend": "http", "http": http}),
                        _doc(
                            "ModelEndpoint",
                            "w",
                            {
                                "provider": "scripted",
                                "script": [{"tool_calls": [write]}, {"text": "ok"}],
                            },
                        ),
                        _doc(
                            "ModelEndpoint",
                            "r",
                            {
                                "provider": "scripted",
                                "script": [{"tool_calls": [search]}, {"text": "ok"}],
                            },
                        ),
                        _doc(
                            "Agent",
                            "writer",
                            {"model": "w", "memory": [{"ref": "notes", "access": "write"}]},
                        ),
                        _doc("Agent", "reader", {"model": "r", "memory": [{"ref": "notes"}]}),
                    ]
                ),
                "t.yaml",
            )
        )
        wrote, _ = await backend.submit("writer", "remember")
        await backend.drain()
        searched, _ = await backend.submit("reader", "look")
        await backend.drain()
        for run in (wrote, searched):
            stored = await store.get_run(run.id)
            assert stored is not None and stored.state is RunState.SUCCEEDED, stored
        events = await store.list_events(searched.id)
        [result] = [e for e in events if e.type is EventType.TOOL_RESULT]
        [hit] = json.loads(result.data.output)["results"]
        assert hit["key"] == "cw" and hit["preview"] == "The code word is mango"
        assert [e for e in events if e.type is EventType.MEMORY_SEARCH]
        writes = [r for r in svc.requests if r.path == "write"]
        assert len(writes) == 1 and writes[0].headers["idempotency-key"]
        # the write replayed with its key (a resumed run) writes nothing new
        replay = backend_of(svc)
        try:
            again, written = await replay.write(
                entry(
                    "other", "different text", idempotency_key=writes[0].headers["idempotency-key"]
                )
            )
        finally:
            await replay.aclose()
        assert (again.key, written) == ("cw", False)
    # the store itself holds nothing: the entries are the service's
    assert await store.list_memory(MemoryPlace("default", "notes")) == []


def test_the_api_serves_an_http_memory_and_says_its_failures_as_502_or_503(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMORY_SERVICE_TOKEN", TOKEN)
    with (
        memory_service(tmp_path / "service.db", token=TOKEN) as svc,
        LiveServer(tmp_path / "home") as server,
        server.client(server.admin) as client,
    ):
        http = {"url": svc.url, "allow_private": True, "auth": {"type": "bearer", "secret": "svc"}}
        apply(
            client,
            _doc("Secret", "svc", {"from_env": "MEMORY_SERVICE_TOKEN"})
            + "\n---\n"
            + _doc("Memory", "remote", {"backend": "http", "http": http}),
        )
        base = "/v1/memories/remote"
        written = client.post(f"{base}/entries", json={"text": "tea at five", "key": "tea"})
        assert written.status_code == 201, written.text
        assert client.get(f"{base}/entries/tea").json()["text"] == "tea at five"
        found = client.post(f"{base}/search", json={"query": "tea"}).json()["items"]
        assert [h["key"] for h in found] == ["tea"]
        stats = client.get(base).json()
        assert stats["entries"] == 1 and stats["index"].startswith("http: ")
        ingested = client.post(f"{base}/ingest", json={"text": "A long text. " * 200})
        assert ingested.status_code == 200 and ingested.json()["chunks"] > 1
        for misbehave, status, code in [
            ("fail", 503, "memory_backend_unavailable"),
            ("not_json", 502, "memory_backend_bad_answer"),
            ("redirect", 502, "memory_backend_bad_answer"),
        ]:
            svc.misbehave = misbehave
            answer = client.get(f"{base}/entries/tea")
            assert answer.status_code == status, answer.text
            assert answer.json()["code"] == code
            assert TOKEN not in answer.text
        svc.misbehave = None
        assert client.get(f"{base}/entries/tea").status_code == 200
        # a secret the server cannot read: the request says so, the server goes on
        unset = {**http, "auth": {"type": "bearer", "secret": "unset"}}
        apply(
            client,
            _doc("Secret", "unset", {"from_env": "MEMORY_SERVICE_TOKEN_NOT_SET"})
            + "\n---\n"
            + _doc("Memory", "unset", {"backend": "http", "http": unset}),
        )
        answer = client.post("/v1/memories/unset/search", json={"query": "tea"})
        assert answer.status_code == 502 and answer.json()["code"] == "memory_backend_unconfigured"
        assert "MEMORY_SERVICE_TOKEN_NOT_SET" in answer.json()["detail"]
        assert client.get(f"{base}/entries/tea").status_code == 200
