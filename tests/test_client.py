"""The Python client (sync and async) against a real ``corral serve`` over real HTTP.

One server (uvicorn on a random port, embedded worker) serves the module; each
test applies its own agents. The forced disconnects come through an httpx
transport that cuts the first event stream after a few events: the designed
seam of the client (``transport=``), with the real server behind it.
"""

from __future__ import annotations

import inspect
import json
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from corral.api import EventOut
from corral.client import AsyncClient, Client
from corral.client.calls import Call
from corral.client.methods import Methods, iterates, sends
from corral.core.errors import (
    ApiConnectionError,
    AuthError,
    ConflictError,
    NotFoundError,
    RateLimitedError,
    ResourceError,
    UserError,
)
from server_harness import LiveServer, echo_turn, resources, wait_for


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("home")) as live:
        yield live


@pytest.fixture
def client(server: LiveServer) -> Iterator[Client]:
    with Client(server.url, server.admin) as c:
        yield c


def seqs(events: list[EventOut]) -> list[int]:
    return [e.seq for e in events]


# --------------------------------------------------------------------------- sync


def test_resources_apply_list_get_delete(client: Client) -> None:
    applied = client.apply(resources("res", ["{text: x}"]))
    assert [(o.kind, o.name, o.action) for o in applied.outcomes] == [
        ("ModelEndpoint", "res-model", "created"),
        ("Tool", "echo", applied.outcomes[1].action),
        ("Agent", "res", "created"),
    ]
    again = client.apply(resources("res", ["{text: x}"]))
    assert again.outcomes[-1].action == "unchanged"
    # one JSON document, and a list of them
    secret = {"apiVersion": "corral/v1", "kind": "Secret", "metadata": {"name": "k"}}
    assert (
        client.apply({**secret, "spec": {"value": "hush-hush-123"}}).outcomes[0].action == "created"
    )
    listed = client.apply([{**secret, "spec": {"from_env": "K"}}])
    assert listed.outcomes[0].action == "configured"

    agent = client.get_resource("agents", "res")
    assert (agent.kind, agent.spec.model, agent.status.generation) == ("Agent", "res-model", 1)
    page = client.list_resources(limit=1)
    assert len(page.items) == 1 and page.next_cursor is not None
    every = [(r.kind, r.metadata.name) for r in client.iter_resources(page_size=1)]
    assert {("Agent", "res"), ("Secret", "k"), ("Tool", "echo")} <= set(every)
    assert [r.metadata.name for r in client.list_resources("agents").items] == ["res"]

    with pytest.raises(ConflictError):
        client.delete_resource("modelendpoint", "res-model")  # the agent references it
    client.delete_resource("agent", "res")
    with pytest.raises(NotFoundError):
        client.get_resource("agent", "res")


def test_tasks_submit_list_page_get_cancel_and_events(client: Client) -> None:
    client.apply(resources("worker-a", [echo_turn("hi", 0.05), "{text: done}"]))
    submitted = client.submit("worker-a", "go")
    assert submitted.created and submitted.task.agent == "worker-a"
    run_id = submitted.task.id

    followed = list(client.follow(run_id))
    assert seqs(followed) == list(range(1, len(followed) + 1))
    assert followed[0].type == "run.start" and followed[-1].type == "run.finish"
    detail = client.get_task(run_id)
    assert (detail.state, detail.output, detail.steps) == ("succeeded", "done", 2)
    assert [m.role for m in detail.messages] == ["user", "assistant", "tool", "assistant"]

    # stored events as pages with a cursor: the same events
    first = client.events(run_id, limit=2)
    assert seqs(first.items) == [1, 2] and first.next_cursor is not None
    rest = client.events(run_id, cursor=first.next_cursor)
    assert rest.next_cursor is None
    assert seqs(first.items + rest.items) == seqs(followed)
    assert seqs(client.events(run_id, after=3).items)[0] == 4

    # idempotency, delay, filters, pagination, cancel
    body: dict[str, Any] = {"idempotency_key": "c-1", "delay_seconds": 3600, "priority": 5}
    later = client.submit("worker-a", "later", **body)
    same = client.submit("worker-a", "later", **body)
    assert later.created and not same.created and same.task.id == later.task.id
    queued = client.list_tasks(state="queued", agent="worker-a")
    assert [t.id for t in queued.items] == [later.task.id]
    everything = [t.id for t in client.iter_tasks(agent="worker-a", page_size=1)]
    assert everything == [later.task.id, run_id]  # newest first, across two pages
    both = client.list_tasks(state=["queued", "succeeded"], agent="worker-a", limit=1)
    assert len(both.items) == 1 and both.next_cursor is not None
    cancelled = client.cancel_task(later.task.id)
    assert cancelled.state == "cancelled"
    with pytest.raises(NotFoundError):
        client.get_task("run_nope")


def test_prompt_and_prompt_object(client: Client) -> None:
    client.apply(resources("asker", [echo_turn("42"), "{text: 'the answer is 42'}"]))
    answered = client.prompt("asker", "what is it?")
    assert (answered.state, answered.output) == ("succeeded", "the answer is 42")

    client.apply(resources("structured", ["{text: '{\"sum\": 5}'}"]))
    schema = {"type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"]}
    shaped = client.prompt_object("structured", "2 + 3?", schema=schema)
    assert (shaped.state, shaped.output) == ("succeeded", {"sum": 5})
    with pytest.raises(ResourceError) as missing:
        client.prompt_object("structured", "2 + 3?")
    assert missing.value.problems[0][0].field == "body.schema"
    assert missing.value.code == "invalid_request"

    client.apply(resources("slowpoke", [echo_turn("zzz", 1.0), "{text: woke}"]))
    still = client.prompt("slowpoke", "x", timeout_seconds=0.2)
    assert still.state in ("queued", "running")
    assert list(client.follow(still.id))[-1].type == "run.finish"


def test_approvals_list_get_approve_reject(client: Client) -> None:
    client.apply(resources("careful", [echo_turn("ok"), "{text: approved}"], approval="always"))
    waiting = client.prompt("careful", "do it")
    assert waiting.state == "waiting_approval"
    [approval] = client.list_approvals(state="pending", run_id=waiting.id).items
    assert client.get_approval(approval.id).tool == "echo"
    decided = client.approve(approval.id, reason="fine")
    assert (decided.state, decided.decision_reason) == ("approved", "fine")
    with pytest.raises(ConflictError):
        client.approve(approval.id)
    assert list(client.follow(waiting.id))[-1].type == "run.finish"
    assert client.get_task(waiting.id).output == "approved"

    client.apply(resources("vetoed", [echo_turn("no"), "{text: understood}"], approval="always"))
    vetoed = client.prompt("vetoed", "x")
    [pending] = list(client.iter_approvals(run_id=vetoed.id, page_size=1))
    assert client.reject(pending.id, reason="not now").state == "rejected"
    list(client.follow(vetoed.id))
    tool_message = next(m for m in client.get_task(vetoed.id).messages if m.role == "tool")
    assert tool_message.is_error and "not now" in tool_message.content


def test_sessions_list_get_messages_delete(client: Client) -> None:
    client.apply(resources("chatty", ["{text: one}", "{text: two}"]))
    for text in ("first", "second"):
        assert client.prompt("chatty", text, session="s-client").state == "succeeded"
    assert client.get_session("s-client").agent == "chatty"
    assert "s-client" in [s.id for s in client.list_sessions(agent="chatty").items]
    assert "s-client" in [s.id for s in client.iter_sessions(page_size=1)]
    page = client.session_messages("s-client", limit=3)
    assert page.next_cursor is not None
    contents = [m.message.content for m in client.iter_session_messages("s-client", page_size=3)]
    assert contents == ["first", "one", "second", "two"]
    assert len(client.session_messages("s-client", include_hidden=True).items) == 4
    client.delete_session("s-client")
    with pytest.raises(NotFoundError):
        client.get_session("s-client")


def test_memories_write_list_read_search_delete(client: Client) -> None:
    memory = {"apiVersion": "corral/v1", "kind": "Memory", "metadata": {"name": "c-notes"}}
    client.apply({**memory, "spec": {}})
    written = client.write_memory("c-notes", "tea at five", key="a/1", metadata={"t": "x"})
    assert (written.key, written.metadata) == ("a/1", {"t": "x"})
    client.write_memory("c-notes", "coffee at nine", key="a/2")
    assert client.memory_entries("c-notes", limit=1).next_cursor is not None
    assert [e.key for e in client.iter_memory_entries("c-notes", page_size=1)] == ["a/1", "a/2"]
    assert client.read_memory("c-notes", "a/1").text == "tea at five"
    hits = client.search_memory("c-notes", "TEA OR NEAR(", filter={"t": "x"}).items
    assert [h.key for h in hits] == ["a/1"]
    client.delete_memory("c-notes", "a/1")
    with pytest.raises(NotFoundError) as entry:
        client.read_memory("c-notes", "a/1")
    assert entry.value.code == "memory_entry_not_found"
    with pytest.raises(NotFoundError) as memory_missing:
        client.read_memory("c-nowhere", "a/1")
    assert memory_missing.value.code == "not_found"
    done = client.ingest_memory("c-notes", "A long text. " * 200, source="doc.txt")
    assert done.key_prefix == "doc.txt" and done.chunks == done.written > 1
    assert client.ingest_memory("c-notes", "A long text. " * 200, source="doc.txt").written == 0


def test_tokens_health_and_readiness(server: LiveServer, client: Client) -> None:
    assert client.health().status == "ok"
    assert client.ready().status == "ready"
    created = client.create_token("viewer", name="dashboard")
    assert created.token.startswith("corral_") and created.namespace == "default"
    assert created.id in [t.id for t in client.list_tokens().items]
    assert client.get_token(created.id).name == "dashboard"
    with Client(server.url, created.token) as viewer:
        assert viewer.list_tasks(limit=1) is not None
        with pytest.raises(AuthError) as forbidden:
            viewer.submit("asker", "x")
        assert (forbidden.value.status, forbidden.value.code) == (403, "forbidden")
        assert client.revoke_token(created.id).revoked_at is not None
        with pytest.raises(AuthError) as revoked:
            viewer.list_tasks()
        assert revoked.value.status == 401 and "revoked" in revoked.value.message


# --------------------------------------------------------------------------- errors


def test_problems_become_the_library_errors(server: LiveServer, client: Client) -> None:
    broken = resources("broken", ["{text: x}"], extra="  limits: {max_steps: 0}\n")
    with pytest.raises(ResourceError) as invalid:
        client.apply(broken)
    [(location, reason)] = invalid.value.problems
    assert location.field == "spec.limits.max_steps" and location.line is not None
    assert "greater than or equal to 1" in reason
    assert invalid.value.code == "invalid_resource"

    document = {"apiVersion": "corral/v1", "kind": "Agent", "metadata": {"name": "a"}}
    with pytest.raises(ResourceError) as in_json:
        client.apply([{**document, "spec": {"model": 3}}])
    assert in_json.value.problems[0][0].field == "spec.model"
    assert in_json.value.problems[0][0].file == "document 0"

    with pytest.raises(ResourceError) as unknown:
        client.submit("no-such-agent", "x")
    assert unknown.value.code == "unknown_agent"
    assert unknown.value.problems[0][0].field == "body.agent"

    bad_json: Call[None] = Call(
        "POST",
        "/v1/resources",
        lambda r: None,
        content="{",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(UserError) as bad:
        client.send(bad_json)
    assert type(bad.value) is UserError and bad.value.code == "invalid_json"

    with (
        Client(server.url, "corral_nope_nope") as stranger,
        pytest.raises(AuthError) as unauthenticated,
    ):
        stranger.list_tasks()
    assert unauthenticated.value.status == 401


def test_a_rate_limited_call_carries_retry_after(tmp_path: Any) -> None:
    with (
        LiveServer(tmp_path, workers=0, rate_limit=0.5, rate_burst=1) as live,
        Client(live.url, live.admin) as c,
    ):
        c.list_tasks()
        with pytest.raises(RateLimitedError) as limited:
            c.list_tasks()
    assert limited.value.status == 429
    assert limited.value.retry_after is not None and limited.value.retry_after >= 1


def test_an_unreachable_server_is_one_error_naming_the_url() -> None:
    url = free_url()
    with Client(url, "t") as c, pytest.raises(ApiConnectionError) as down:
        c.list_tasks()
    assert url in down.value.message and down.value.url == url


def test_follow_gives_up_after_its_reconnects_and_never_retries_a_404(client: Client) -> None:
    url = free_url()
    with Client(url, "t") as down, pytest.raises(ApiConnectionError) as unreachable:
        list(down.follow("run_x", max_reconnects=2, reconnect_seconds=0.01))
    assert url in unreachable.value.message
    with pytest.raises(NotFoundError):
        list(client.follow("run_nope", reconnect_seconds=30))  # at once, no waiting


def test_both_clients_show_each_method_with_the_signature_and_docstring_of_its_call() -> None:
    url = free_url()
    awaiting = AsyncClient(url)  # never sends: nothing to close
    with Client(url) as blocking:
        for name, method in vars(Methods).items():
            if not isinstance(method, sends | iterates):
                continue
            shown = inspect.signature(getattr(blocking, name))
            awaited = inspect.signature(getattr(awaiting, name))
            built = inspect.signature(method.build)
            assert shown == awaited == built.replace(return_annotation=shown.empty), name
            assert getattr(blocking, name).__doc__ == method.build.__doc__, name
            coroutine = inspect.iscoroutinefunction(getattr(awaiting, name))
            assert coroutine == isinstance(method, sends), name


def test_url_and_token_come_from_the_environment(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CORRAL_URL", raising=False)
    with pytest.raises(UserError, match="CORRAL_URL"):
        Client()
    monkeypatch.setenv("CORRAL_URL", server.url + "/")
    monkeypatch.setenv("CORRAL_TOKEN", server.admin)
    with Client() as c:
        assert c.base_url == server.url
        assert c.list_tasks(limit=1).items is not None


# --------------------------------------------------------------------------- reconnects


class _Cut:
    """Decides where the first event stream dies: after ``events`` whole events and
    half of the next one, so the client must drop the half and resume after the last
    whole one. Records the ``Last-Event-ID`` of every stream request."""

    def __init__(self, events: int) -> None:
        self.events = events
        self.cut_done = False
        self.last_event_ids: list[str | None] = []

    def wants(self, request: httpx.Request) -> bool:
        if "text/event-stream" not in request.headers.get("accept", ""):
            return False
        self.last_event_ids.append(request.headers.get("last-event-id"))
        if self.cut_done:
            return False
        self.cut_done = True
        return True

    def split(self, buffer: bytes) -> bytes | None:
        """The bytes to deliver before dying, once ``buffer`` holds one event past the cut."""
        messages = buffer.split(b"\n\n")[:-1]  # the last piece is not complete yet
        end = 0
        seen = 0
        for message in messages:
            if b"\nid: " in b"\n" + message:  # an event (the first also has retry:)
                if seen == self.events:  # event N+1: deliver half of it
                    return buffer[: end + len(message) // 2]
                seen += 1
            end += len(message) + 2
        return None


class _CutStream(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, cut: _Cut) -> None:
        self.inner, self.cut = inner, cut

    def __iter__(self) -> Iterator[bytes]:
        buffer = b""
        for chunk in self.inner:
            buffer += chunk
            head = self.cut.split(buffer)
            if head is not None:
                yield head
                raise httpx.ReadError("connection dropped by the test")
        yield buffer

    def close(self) -> None:
        self.inner.close()


class _CuttingTransport(httpx.BaseTransport):
    def __init__(self, cut: _Cut) -> None:
        self.inner = httpx.HTTPTransport()
        self.cut = cut

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if not self.cut.wants(request):
            return response
        assert isinstance(response.stream, httpx.SyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_CutStream(response.stream, self.cut),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self.inner.close()


class _AsyncCutStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, cut: _Cut) -> None:
        self.inner, self.cut = inner, cut

    async def __aiter__(self) -> AsyncIterator[bytes]:
        buffer = b""
        async for chunk in self.inner:
            buffer += chunk
            head = self.cut.split(buffer)
            if head is not None:
                yield head
                raise httpx.ReadError("connection dropped by the test")
        yield buffer

    async def aclose(self) -> None:
        await self.inner.aclose()


class _AsyncCuttingTransport(httpx.AsyncBaseTransport):
    def __init__(self, cut: _Cut) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.cut = cut

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if not self.cut.wants(request):
            return response
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_AsyncCutStream(response.stream, self.cut),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_follow_resumes_after_a_dropped_stream_without_loss_or_duplicates(
    server: LiveServer, client: Client
) -> None:
    client.apply(resources("dropped", [echo_turn("a", 0.2), echo_turn("b", 0.2), "{text: ok}"]))
    run_id = client.submit("dropped", "go").task.id
    cut = _Cut(events=3)
    with Client(server.url, server.admin, transport=_CuttingTransport(cut)) as flaky:
        followed = list(flaky.follow(run_id, reconnect_seconds=0.05))
    assert cut.cut_done and cut.last_event_ids[:2] == ["0", "3"]
    stored = client.events(run_id, limit=500).items
    assert seqs(followed) == seqs(stored) == list(range(1, len(stored) + 1))
    assert [e.model_dump() for e in followed] == [e.model_dump() for e in stored]


async def test_async_follow_resumes_after_a_dropped_stream(server: LiveServer) -> None:
    cut = _Cut(events=2)
    async with AsyncClient(server.url, server.admin) as plain:
        turns = [echo_turn("a", 0.2), echo_turn("b", 0.2), "{text: ok}"]
        await plain.apply(resources("dropped-async", turns))
        run_id = (await plain.submit("dropped-async", "go")).task.id
        transport = _AsyncCuttingTransport(cut)
        async with AsyncClient(server.url, server.admin, transport=transport) as flaky:
            followed = [e async for e in flaky.follow(run_id, reconnect_seconds=0.05)]
        stored = (await plain.events(run_id, limit=500)).items
    assert cut.cut_done and cut.last_event_ids[:2] == ["0", "2"]
    assert seqs(followed) == seqs(stored) == list(range(1, len(stored) + 1))


# --------------------------------------------------------------------------- async


async def test_async_client_covers_the_api(server: LiveServer) -> None:
    async with AsyncClient(server.url, server.admin) as c:
        assert (await c.health()).status == "ok"
        assert (await c.ready()).status == "ready"
        await c.apply(resources("async-a", [echo_turn("hi"), "{text: done}"]))
        assert (await c.get_resource("agent", "async-a")).metadata.name == "async-a"
        names = [r.metadata.name async for r in c.iter_resources("agent", page_size=1)]
        assert "async-a" in names
        assert len((await c.list_resources("tool")).items) >= 1

        submitted = await c.submit("async-a", "go", idempotency_key="a-1")
        again = await c.submit("async-a", "go", idempotency_key="a-1")
        assert submitted.created and not again.created
        events = [e async for e in c.follow(submitted.task.id)]
        assert events[-1].type == "run.finish"
        page = await c.events(submitted.task.id)
        assert seqs(page.items) == seqs(events) and page.next_cursor is None
        assert (await c.get_task(submitted.task.id)).output == "done"
        mine = [t.id async for t in c.iter_tasks(agent="async-a", page_size=1)]
        assert mine == [submitted.task.id]
        assert (await c.list_tasks(state="succeeded", agent="async-a")).items[0].output == "done"
        later = await c.submit("async-a", "x", delay_seconds=3600)
        assert (await c.cancel_task(later.task.id)).state == "cancelled"

        await c.apply(resources("async-b", [echo_turn("1"), "{text: 'yes'}"], approval="always"))
        waiting = await c.prompt("async-b", "x", session="s-async")
        [approval] = (await c.list_approvals(run_id=waiting.id)).items
        assert (await c.get_approval(approval.id)).state == "pending"
        assert (await c.approve(approval.id)).state == "approved"
        [e async for e in c.follow(waiting.id)]
        await c.apply(resources("async-c", [echo_turn("2"), "{text: 'no'}"], approval="always"))
        vetoed = await c.prompt("async-c", "x")
        [other] = [a async for a in c.iter_approvals(run_id=vetoed.id)]
        assert (await c.reject(other.id, "no")).state == "rejected"

        await c.apply(resources("async-d", ["{text: '{\"n\": 1}'}"]))
        shaped = await c.prompt_object("async-d", "x", schema={"type": "object"})
        assert shaped.output == {"n": 1}

        assert (await c.get_session("s-async")).agent == "async-b"
        assert "s-async" in [s.id for s in (await c.list_sessions()).items]
        assert "s-async" in [s.id async for s in c.iter_sessions()]
        messages = await c.session_messages("s-async")
        assert messages.items[0].message.content == "x"
        assert [m.seq async for m in c.iter_session_messages("s-async", page_size=1)]
        await c.delete_session("s-async")
        with pytest.raises(NotFoundError):
            await c.get_session("s-async")

        token = await c.create_token("operator", name="ci")
        assert (await c.get_token(token.id)).role == "operator"
        assert token.id in [t.id for t in (await c.list_tokens()).items]
        assert (await c.revoke_token(token.id)).revoked_at is not None

        with pytest.raises(ConflictError):
            await c.delete_resource("modelendpoint", "async-a-model")
        await c.delete_resource("agent", "async-a")
        with pytest.raises(NotFoundError):
            await c.get_task("run_nope")
        with pytest.raises(ResourceError):
            await c.apply(json.loads('[{"apiVersion": "corral/v1", "kind": "Agent"}]'))


# --------------------------------------------------------------------------- helpers


def free_url() -> str:
    """A URL on which nothing listens (a port bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_memories_of_a_system_run_are_named_by_its_id(client: Client) -> None:
    from test_server_memory import CREW

    client.apply(CREW)
    task = client.submit_system("crew-team", "scout").task
    ended = wait_for(
        lambda: client.get_task(task.id).state in ("succeeded", "failed"), message="the run"
    )
    assert ended and client.get_task(task.id).state == "succeeded"
    scoped = {"system_run": task.id}
    assert [e.key for e in client.iter_memory_entries("crew", **scoped)] == ["otters"]
    assert client.read_memory("crew", "otters", **scoped).scope_key == task.id
    client.write_memory("crew", "a heron", key="heron", **scoped)
    assert [h.key for h in client.search_memory("crew", "heron", **scoped).items] == ["heron"]
    assert client.ingest_memory("crew", "the weir. " * 3, source="w", **scoped).written == 1
    client.delete_memory("crew", "heron", **scoped)
    assert client.memory_entries("crew", **scoped).items[0].key == "otters"
    with pytest.raises(UserError) as missing:
        client.memory_entries("crew")
    assert missing.value.code == "invalid_memory_input"
    with pytest.raises(NotFoundError):
        client.memory_entries("crew", system_run="run_unknown")
