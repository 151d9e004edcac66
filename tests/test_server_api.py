"""The HTTP API over real HTTP: submit, follow, approve, cancel, prompt, prompt-object, events.

One ``corral serve`` (uvicorn on a random port, embedded worker) serves the whole
module; each test applies its own agent, so runs never mix.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx

from server_harness import LiveServer, apply, echo_turn, resources, sse_messages, wait_for

SSE = {"Accept": "text/event-stream"}


def follow(client: httpx.Client, run_id: str, **headers: str) -> list[dict[str, str]]:
    """Every message of the run's event stream, until the server ends it."""
    with client.stream("GET", f"/v1/runs/{run_id}/events", headers={**SSE, **headers}) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        return [m for m in sse_messages(resp.iter_lines()) if "event" in m]


def seqs(messages: list[dict[str, str]]) -> list[int]:
    return [int(m["id"]) for m in messages if "id" in m]


def task(client: httpx.Client, run_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/tasks/{run_id}")
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


def test_submit_then_follow_the_stream_to_the_end(client: httpx.Client) -> None:
    apply(client, resources("follow-me", [echo_turn("hi", 0.05), "{text: done}"]))

    submitted = client.post("/v1/tasks", json={"agent": "follow-me", "input": "go"})
    assert submitted.status_code == 201
    run_id = submitted.json()["id"]
    assert submitted.headers["location"] == f"/v1/tasks/{run_id}"

    messages = follow(client, run_id)
    events = messages[:-1]
    assert seqs(events) == list(range(1, len(events) + 1))
    types = [m["event"] for m in events]
    assert types[0] == "run.start" and types[-1] == "run.finish"
    assert {"tool.call", "tool.result", "message.create"} <= set(types)
    assert json.loads(events[3]["data"])["run_id"] == run_id
    assert messages[-1]["event"] == "end"
    assert json.loads(messages[-1]["data"]) == {"state": "succeeded"}

    record = task(client, run_id)
    assert (record["state"], record["output"], record["steps"]) == ("succeeded", "done", 2)
    assert [m["role"] for m in record["messages"]] == ["user", "assistant", "tool", "assistant"]


def test_the_same_idempotency_key_returns_the_first_task(client: httpx.Client) -> None:
    apply(client, resources("once", ["{text: done}"]))
    body = {"agent": "once", "input": "x", "idempotency_key": "k-1", "delay_seconds": 3600}
    first = client.post("/v1/tasks", json=body)
    again = client.post("/v1/tasks", json=body)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]


def test_prompt_waits_for_the_answer(client: httpx.Client) -> None:
    apply(client, resources("asker", [echo_turn("42"), "{text: 'the answer is 42'}"]))
    response = client.post("/v1/agents/asker/prompt", json={"input": "what is it?"})
    assert response.status_code == 200
    body = response.json()
    assert (body["state"], body["output"]) == ("succeeded", "the answer is 42")
    assert body["usage"]["requests"] == 2


def test_prompt_object_returns_json_that_matches_the_schema(client: httpx.Client) -> None:
    apply(client, resources("structured", ["{text: '{\"sum\": 5}'}"]))
    schema = {"type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"]}
    response = client.post(
        "/v1/agents/structured/prompt-object", json={"input": "2 + 3?", "schema": schema}
    )
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["output"]) == ("succeeded", {"sum": 5})

    # Without a schema of its own the agent needs one in the request; a broken one is refused.
    missing = client.post("/v1/agents/structured/prompt-object", json={"input": "2 + 3?"})
    broken = client.post(
        "/v1/agents/structured/prompt-object", json={"input": "x", "schema": {"type": 5}}
    )
    assert (missing.status_code, broken.status_code) == (422, 422)
    assert missing.json()["errors"][0]["field"] == "body.schema"
    assert broken.json()["errors"][0]["field"] == "body.schema"


def test_a_prompt_past_its_timeout_answers_202_and_the_run_goes_on(
    client: httpx.Client,
) -> None:
    apply(client, resources("slow", [echo_turn("zzz", 1.5), "{text: woke}"]))
    response = client.post("/v1/agents/slow/prompt", json={"input": "x", "timeout_seconds": 0.3})
    assert response.status_code == 202
    run_id = response.json()["id"]
    assert response.json()["state"] in ("queued", "running")
    assert follow(client, run_id)[-1]["data"] == '{"state": "succeeded"}'


def test_approve_over_the_api_resumes_the_run(client: httpx.Client) -> None:
    apply(client, resources("careful", [echo_turn("ok"), "{text: approved}"], approval="always"))
    waiting = client.post("/v1/agents/careful/prompt", json={"input": "do it"})
    assert (waiting.status_code, waiting.json()["state"]) == (200, "waiting_approval")
    run_id = waiting.json()["id"]

    listed = client.get("/v1/approvals", params={"state": "pending", "run_id": run_id}).json()
    [approval] = listed["items"]
    assert (approval["tool"], approval["state"]) == ("echo", "pending")

    decided = client.post(f"/v1/approvals/{approval['id']}/approve", json={"reason": "fine"})
    assert decided.status_code == 200
    assert decided.json()["state"] == "approved"
    assert decided.json()["decided_by"].startswith("token:tok_")
    again = client.post(f"/v1/approvals/{approval['id']}/approve")
    assert (again.status_code, again.json()["code"]) == (409, "conflict")

    messages = follow(client, run_id)
    assert "approval.resolved" in [m["event"] for m in messages]
    assert task(client, run_id)["output"] == "approved"


def test_reject_tells_the_model_and_the_run_goes_on(client: httpx.Client) -> None:
    apply(client, resources("vetoed", [echo_turn("no"), "{text: understood}"], approval="always"))
    run_id = client.post("/v1/agents/vetoed/prompt", json={"input": "x"}).json()["id"]
    [approval] = client.get("/v1/approvals", params={"run_id": run_id}).json()["items"]
    rejected = client.post(f"/v1/approvals/{approval['id']}/reject", json={"reason": "not now"})
    assert rejected.json()["state"] == "rejected"
    follow(client, run_id)
    record = task(client, run_id)
    tool_message = next(m for m in record["messages"] if m["role"] == "tool")
    assert tool_message["is_error"] and "not now" in tool_message["content"]


def test_cancel_a_queued_and_a_running_task(client: httpx.Client) -> None:
    apply(client, resources("cancelable", [echo_turn("long", 8), "{text: never}"]))
    later = client.post(
        "/v1/tasks", json={"agent": "cancelable", "input": "x", "delay_seconds": 3600}
    ).json()
    cancelled = client.post(f"/v1/tasks/{later['id']}/cancel")
    assert (cancelled.status_code, cancelled.json()["state"]) == (200, "cancelled")
    assert follow(client, later["id"])[-1]["data"] == '{"state": "cancelled"}'

    running = client.post("/v1/tasks", json={"agent": "cancelable", "input": "x"}).json()
    wait_for(lambda: task(client, running["id"])["state"] == "running", message="running")
    asked = client.post(f"/v1/tasks/{running['id']}/cancel").json()
    assert asked["cancel_requested"] is True
    messages = follow(client, running["id"])
    assert messages[-1]["data"] == '{"state": "cancelled"}'
    assert task(client, running["id"])["state"] == "cancelled"


def test_events_as_json_pages_with_a_cursor(client: httpx.Client) -> None:
    apply(client, resources("paged", [echo_turn("a"), echo_turn("b"), "{text: done}"]))
    run_id = client.post("/v1/agents/paged/prompt", json={"input": "x"}).json()["id"]
    seen: list[int] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 4} | ({"cursor": cursor} if cursor else {})
        page = client.get(f"/v1/runs/{run_id}/events", params=params).json()
        seen += [e["seq"] for e in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(range(1, len(seen) + 1)) and len(seen) > 8
    after = client.get(f"/v1/runs/{run_id}/events", params={"after": len(seen) - 2}).json()
    assert [e["seq"] for e in after["items"]] == [len(seen) - 1, len(seen)]


def test_tasks_list_filters_and_pages_newest_first(client: httpx.Client) -> None:
    apply(client, resources("listed", ["{text: done}"]))
    ids = [
        client.post(
            "/v1/tasks", json={"agent": "listed", "input": str(i), "delay_seconds": 3600}
        ).json()["id"]
        for i in range(5)
    ]
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"agent": "listed", "state": ["queued"], "limit": 2}
        page = client.get("/v1/tasks", params=params | ({"cursor": cursor} if cursor else {}))
        assert page.status_code == 200
        seen += [t["id"] for t in page.json()["items"]]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    bad = client.get("/v1/tasks", params={"cursor": "bm90LWEtY3Vyc29y"})
    assert (bad.status_code, bad.json()["errors"][0]["field"]) == (422, "query.cursor")


def test_a_follower_that_reconnects_with_last_event_id_misses_nothing(
    client: httpx.Client,
) -> None:
    turns = [echo_turn(str(i), 0.15) for i in range(4)] + ["{text: done}"]
    apply(client, resources("reconnect", turns))
    run_id = client.post("/v1/tasks", json={"agent": "reconnect", "input": "x"}).json()["id"]

    received: list[dict[str, str]] = []
    for _ in range(20):  # disconnect after every few events until the stream ends
        last = received[-1]["id"] if received else None
        headers = {**SSE, **({"Last-Event-ID": last} if last else {})}
        with client.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as resp:
            ended = False
            for message in sse_messages(resp.iter_lines()):
                if message.get("event") == "end":
                    ended = True
                    break
                if "id" in message:
                    received.append(message)
                    if len(received) % 4 == 0:
                        break  # hang up mid-stream
        if ended:
            break
    numbers = seqs(received)
    assert numbers == list(range(1, len(numbers) + 1)), "an event missed or seen twice"
    assert received[-1]["event"] == "run.finish"


async def test_a_hundred_followers_of_one_run_all_see_the_whole_ordered_stream(
    server: LiveServer,
) -> None:
    with server.client(server.admin) as c:
        turns = [echo_turn(str(i), 0.1) for i in range(3)] + ["{text: done}"]
        apply(c, resources("crowd", turns))
        run_id = c.post(
            "/v1/tasks", json={"agent": "crowd", "input": "x", "delay_seconds": 1}
        ).json()["id"]

    assert server.server is not None
    reads_before = server.server.context.fan_out.reads
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
    async with server.async_client(server.admin, limits=limits) as ac:

        async def follower(into: list[list[int]]) -> None:
            async with ac.stream("GET", f"/v1/runs/{run_id}/events", headers=SSE) as resp:
                assert resp.status_code == 200
                lines: list[str] = [line async for line in resp.aiter_lines()]
            into.append(seqs([m for m in sse_messages(iter(lines)) if "event" in m]))

        streams: list[list[int]] = []
        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                for _ in range(100):
                    group.start_soon(follower, streams)
    assert len(streams) == 100
    expected = list(range(1, len(streams[0]) + 1))
    assert len(expected) > 10
    assert all(s == expected for s in streams)
    # The followers woken by one commit share the store read that follows it.
    assert server.server is not None
    reads = server.server.context.fan_out.reads - reads_before
    assert reads < 100 * len(expected) / 4


def test_metrics_count_runs_tokens_and_tool_calls(client: httpx.Client) -> None:
    apply(client, resources("metered", [echo_turn("m"), "{text: done}"]))
    assert client.post("/v1/agents/metered/prompt", json={"input": "x"}).status_code == 200
    text = httpx.get(f"{client.base_url}/metrics").text
    values = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert values['corral_runs{state="succeeded"}'] >= 1
    assert values['corral_tool_calls_total{outcome="ok"}'] >= 1
    assert values['corral_model_tokens_total{direction="input"}'] >= 0
    assert values["corral_model_latency_seconds_count"] >= 2
    assert "corral_queue_depth" in values
    assert any(
        k.startswith('corral_http_requests_total{method="POST",route="/v1/agents/{name}/prompt"')
        for k in values
    )


def test_health_and_readiness(server: LiveServer) -> None:
    assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{server.url}/readyz")
    assert (ready.status_code, ready.json()["status"]) == (200, "ready")


def test_apply_rejects_bad_documents_with_the_field_path_and_stores_nothing(
    client: httpx.Client,
) -> None:
    text = resources("broken", ["{text: x}"], extra="  limits: {max_steps: 0}\n")
    response = client.post(
        "/v1/resources", content=text, headers={"Content-Type": "application/yaml"}
    )
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    [problem] = response.json()["errors"]
    assert problem["field"] == "spec.limits.max_steps" and problem["line"] > 1
    assert client.get("/v1/resources/agent/broken").status_code == 404
    assert client.get("/v1/resources/modelendpoint/broken-model").status_code == 404

    documents = [
        {
            "apiVersion": "corral/v1",
            "kind": "Secret",
            "metadata": {"name": "ok"},
            "spec": {"value": "x-secret-value"},
        },
        {
            "apiVersion": "corral/v1",
            "kind": "Agent",
            "metadata": {"name": "a"},
            "spec": {"model": 3},
        },
    ]
    as_json = client.post("/v1/resources", json=documents)
    assert as_json.status_code == 422
    assert {(p["document"], p["field"]) for p in as_json.json()["errors"]} == {(1, "spec.model")}

    other = client.post(
        "/v1/resources",
        json={
            "apiVersion": "corral/v1",
            "kind": "Secret",
            "metadata": {"name": "s", "namespace": "elsewhere"},
            "spec": {"value": "x-secret-value"},
        },
    )
    assert other.status_code == 422
    assert other.json()["errors"][0]["field"] == "metadata.namespace"

    wrong_type = client.post("/v1/resources", content="x", headers={"Content-Type": "text/plain"})
    assert (wrong_type.status_code, wrong_type.json()["code"]) == (415, "unsupported_media_type")
    not_json = client.post(
        "/v1/resources", content="{", headers={"Content-Type": "application/json"}
    )
    assert (not_json.status_code, not_json.json()["code"]) == (400, "invalid_json")


def test_resources_list_get_delete_and_conflicts(client: httpx.Client) -> None:
    apply(client, resources("kept", ["{text: x}"]))
    apply(client, resources("also-kept", ["{text: x}"]))  # a second agent: a second page
    agent = client.get("/v1/resources/agents/kept").json()
    assert (agent["kind"], agent["metadata"]["name"], agent["status"]["generation"]) == (
        "Agent",
        "kept",
        1,
    )
    listed = client.get("/v1/resources", params={"kind": "Agent", "limit": 1}).json()
    assert len(listed["items"]) == 1 and listed["next_cursor"]
    referenced = client.delete("/v1/resources/modelendpoint/kept-model")
    assert (referenced.status_code, referenced.json()["code"]) == (409, "conflict")
    assert client.delete("/v1/resources/agent/kept").status_code == 204
    assert client.get("/v1/resources/agent/kept").status_code == 404
    unknown = client.get("/v1/resources/widgets/kept")
    assert (unknown.status_code, unknown.json()["errors"][0]["field"]) == (422, "path.kind")

    secret = {
        "apiVersion": "corral/v1",
        "kind": "Secret",
        "metadata": {"name": "pw"},
        "spec": {"value": "hunter2-plaintext"},
    }
    assert client.post("/v1/resources", json=secret).status_code == 200
    shown = client.get("/v1/resources/secret/pw").text
    assert "hunter2" not in shown and "redacted" in shown


def test_resources_that_link_each_other_are_deleted_together(
    client: httpx.Client, server: LiveServer
) -> None:
    apply(client, resources("ping", ["{text: x}"]))
    apply(client, resources("pong", ["{text: x}"], extra="  links: [ping]"))
    apply(client, resources("ping", ["{text: x}"], extra="  links: [pong]"))
    alone = client.delete("/v1/resources/agent/ping")
    assert (alone.status_code, alone.json()["code"]) == (409, "conflict")
    assert "Agent 'pong' (spec.links[0])" in alone.json()["detail"]

    def delete(*items: dict[str, object]) -> httpx.Response:
        return client.post("/v1/resources/delete", json={"items": list(items)})

    # hostile bodies: stable 422s naming the field, nothing deleted
    for body, field in [
        ({"items": []}, "body.items"),
        ({"items": [{"kind": "agent", "name": "ping"}] * 101}, "body.items"),
        ({"items": [{"kind": "widget", "name": "ping"}]}, "body.items[0].kind"),
        ({"items": [{"kind": "agent", "name": "../ping"}]}, "body.items[0].name"),
        ({"items": [{"kind": "agent", "name": "ping", "force": True}]}, "body.items[0].force"),
        ({"items": "ping"}, "body.items"),
    ]:
        refused = client.post("/v1/resources/delete", json=body)
        assert refused.status_code == 422, (body, refused.text)
        assert refused.json()["errors"][0]["field"] == field, refused.text
    missing = delete({"kind": "agent", "name": "ping"}, {"kind": "agent", "name": "gone"})
    assert (missing.status_code, missing.json()["code"]) == (404, "not_found")
    # an agent not in the group (pong) links ping: it holds the group back, all or none
    held = delete(
        {"kind": "agent", "name": "ping"}, {"kind": "modelendpoint", "name": "ping-model"}
    )
    assert held.status_code == 409 and "Agent 'pong'" in held.json()["detail"]
    assert client.get("/v1/resources/modelendpoint/ping-model").status_code == 200
    assert client.get("/v1/resources/agent/ping").status_code == 200
    # a namespace's admin deletes no NamespacePolicy, not even with others
    other = server.mint("elsewhere", "admin")
    with server.client(other) as foreign:
        policy = foreign.post(
            "/v1/resources/delete", json={"items": [{"kind": "namespacepolicy", "name": "p"}]}
        )
        assert policy.status_code == 403
        # nor another namespace's agents: they are not found in its own
        theirs = foreign.post(
            "/v1/resources/delete", json={"items": [{"kind": "agent", "name": "ping"}]}
        )
        assert theirs.status_code == 404
    both = delete({"kind": "Agent", "name": "ping"}, {"kind": "agents", "name": "pong"})
    assert both.status_code == 204, both.text
    assert client.get("/v1/resources/agent/ping").status_code == 404
    assert client.get("/v1/resources/agent/pong").status_code == 404


def test_sessions_over_the_api(client: httpx.Client) -> None:
    apply(client, resources("chatty", ["{text: one}", "{text: two}"]))
    for text in ("first", "second"):
        response = client.post(
            "/v1/agents/chatty/prompt", json={"input": text, "session": "s-api-1"}
        )
        assert response.json()["state"] == "succeeded"
    assert client.get("/v1/sessions/s-api-1").json()["agent"] == "chatty"
    assert "s-api-1" in [s["id"] for s in client.get("/v1/sessions").json()["items"]]
    page = client.get("/v1/sessions/s-api-1/messages", params={"limit": 3}).json()
    rest = client.get(
        "/v1/sessions/s-api-1/messages", params={"cursor": page["next_cursor"]}
    ).json()
    contents = [m["message"]["content"] for m in page["items"] + rest["items"]]
    assert contents == ["first", "one", "second", "two"]
    assert client.delete("/v1/sessions/s-api-1").status_code == 204
    assert client.get("/v1/sessions/s-api-1").status_code == 404


def test_a_session_is_not_deleted_while_a_run_of_it_is_unfinished(client: httpx.Client) -> None:
    apply(client, resources("busy", [echo_turn("zzz", 5.0), "{text: done}", "{text: later}"]))
    running = client.post("/v1/tasks", json={"agent": "busy", "input": "x", "session": "s-busy"})
    run_id = running.json()["id"]
    wait_for(lambda: task(client, run_id)["state"] == "running", message="the run to start")
    refused = client.delete("/v1/sessions/s-busy")
    assert (refused.status_code, refused.json()["code"]) == (409, "conflict")
    assert f"its run {run_id} is running" in refused.json()["detail"]
    wait_for(lambda: task(client, run_id)["state"] == "succeeded", message="the run to end")
    # The run kept its session: its turn was stored there.
    texts = [
        m["message"]["content"] for m in client.get("/v1/sessions/s-busy/messages").json()["items"]
    ]
    assert texts[0] == "x" and texts[-1] == "done"

    body = {"agent": "busy", "input": "y", "session": "s-busy", "delay_seconds": 3600}
    queued = client.post("/v1/tasks", json=body).json()["id"]
    refused = client.delete("/v1/sessions/s-busy")
    assert refused.status_code == 409 and f"its run {queued} is queued" in refused.text
    assert client.post(f"/v1/tasks/{queued}/cancel").json()["state"] == "cancelled"
    assert client.delete("/v1/sessions/s-busy").status_code == 204


def test_tokens_over_the_api(server: LiveServer, client: httpx.Client) -> None:
    created = client.post("/v1/tokens", json={"role": "viewer", "name": "dashboard"})
    assert created.status_code == 201
    body = created.json()
    assert body["namespace"] == "default" and body["token"].startswith("corral_")
    with server.client(body["token"]) as viewer:
        assert viewer.get("/v1/tasks").status_code == 200
        assert viewer.post("/v1/tasks", json={"agent": "x", "input": "y"}).status_code == 403
        listed = client.get("/v1/tokens").json()["items"]
        assert body["id"] in [t["id"] for t in listed]
        assert all("token" not in t and "secret_hash" not in t for t in listed)
        revoked = client.post(f"/v1/tokens/{body['id']}/revoke")
        assert revoked.json()["revoked_at"] is not None
        refused = viewer.get("/v1/tasks")
        assert refused.status_code == 401 and "revoked" in refused.json()["detail"]


def test_unauthenticated_calls_get_401_with_a_challenge(server: LiveServer) -> None:
    for headers in ({}, {"Authorization": "Bearer nonsense"}, {"Authorization": "Basic eDp5"}):
        response = httpx.get(f"{server.url}/v1/tasks", headers=headers)
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
    forged = server.admin[:-1] + ("1" if server.admin.endswith("0") else "0")
    assert (
        httpx.get(
            f"{server.url}/v1/tasks", headers={"Authorization": f"Bearer {forged}"}
        ).status_code
        == 401
    )
