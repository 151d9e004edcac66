"""Hostile use of linked agents and agent tokens against a real server: links to deleted
agents, depth exhaustion, sessions that are not the linked agent's, tokens in query
strings or naming what they may not. Every answer is a stable code, never a 500."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.resources.secrets import SecretCipher
from corral.runtime.agent_tokens import AgentTokenSigner
from server_harness import LiveServer, apply, wait_for

TESTS = Path(__file__).parent

DOCUMENTS = f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: plain-model}}
spec:
  provider: scripted
  script:
    - text: "5"
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: sleepy-model}}
spec:
  provider: scripted
  script:
    - {{tool_calls: [{{name: echo, arguments: {{text: "zzz", seconds: 30}}}}]}}
    - text: woke
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: echo}}
spec:
  type: python
  python: {{function: "server_tools:slow_echo", path: "{TESTS}"}}
  timeout_seconds: 60
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: victim}}
spec: {{model: plain-model}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: adder}}
spec: {{model: plain-model}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: sleeper}}
spec:
  model: sleepy-model
  tools: [echo]
  links: [victim, adder]
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: shallow}}
spec:
  model: sleepy-model
  tools: [echo]
  links: [adder]
  limits: {{max_depth: 0}}
"""

SLEEPER_UNLINKED = """
apiVersion: corral/v1
kind: Agent
metadata: {name: sleeper}
spec:
  model: sleepy-model
  tools: [echo]
  links: [adder]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("home"), workers=4) as live:
        with live.client(live.admin) as admin:
            apply(admin, DOCUMENTS)
        yield live


def signer(server: LiveServer) -> AgentTokenSigner:
    return AgentTokenSigner.from_settings(server.settings)


def running(admin: httpx.Client, agent: str) -> dict[str, Any]:
    run: dict[str, Any] = admin.post("/v1/tasks", json={"agent": agent, "input": "sleep"}).json()
    wait_for(
        lambda: admin.get(f"/v1/tasks/{run['id']}").json()["state"] == "running",
        message=f"{agent} to run",
    )
    return run


def test_a_link_to_a_deleted_agent_is_404_never_500(server: LiveServer) -> None:
    with server.client(server.admin) as admin:
        parent = running(admin, "sleeper")
        token = signer(server).mint(
            namespace="default", agent="sleeper", run_id=parent["id"], links=["victim", "adder"]
        )
        # a linked agent cannot be deleted from under its callers
        refused = admin.delete("/v1/resources/Agent/victim")
        assert refused.status_code == 409 and refused.json()["code"] == "conflict"
        # unlinked, then deleted, while the caller's token still names it
        apply(admin, SLEEPER_UNLINKED)
        assert admin.delete("/v1/resources/Agent/victim").status_code in (200, 204)
        with server.client(token) as client:
            for answer in (
                client.get("/v1/links/victim"),
                client.post("/v1/links/victim/exec", json={"input": "hi", "wait": False}),
            ):
                assert answer.status_code == 404, answer.text
                assert answer.json()["code"] == "not_found"
            assert client.get("/v1/links").status_code == 200
            # and the process goes on serving the links that remain
            done = client.post("/v1/links/adder/exec", json={"input": "2+3", "timeout_seconds": 30})
            assert done.status_code == 200 and done.json()["output"] == "5"
        admin.post(f"/v1/tasks/{parent['id']}/cancel")


def test_depth_exhaustion_is_409_budget_exceeded(server: LiveServer) -> None:
    with server.client(server.admin) as admin:
        parent = running(admin, "shallow")
        token = signer(server).mint(
            namespace="default", agent="shallow", run_id=parent["id"], links=["adder"]
        )
        with server.client(token) as client:
            refused = client.post("/v1/links/adder/exec", json={"input": "x", "wait": False})
        assert refused.status_code == 409, refused.text
        assert refused.json()["code"] == "budget_exceeded" and "max_depth" in refused.text
        assert admin.get(f"/v1/tasks/{parent['id']}/children").json()["items"] == []
        admin.post(f"/v1/tasks/{parent['id']}/cancel")


def test_a_session_that_is_not_the_linked_agents_is_refused(server: LiveServer) -> None:
    with server.client(server.admin) as admin:
        # a session of the calling agent itself, and a made-up one
        parent = running(admin, "sleeper")
        own_session = admin.get(f"/v1/tasks/{parent['id']}").json().get("session")
        token = signer(server).mint(
            namespace="default", agent="sleeper", run_id=parent["id"], links=["adder"]
        )
        with server.client(token) as client:
            for session in [own_session, "s" * 300, "../../etc", "\u202e\u0000"]:
                if session is None:
                    continue
                answer = client.post(
                    "/v1/links/adder/exec", json={"input": "x", "session": session, "wait": False}
                )
                assert answer.status_code in (404, 409, 422), (session, answer.text)
                assert answer.json()["code"] in ("invalid_request", "not_found", "conflict")
        admin.post(f"/v1/tasks/{parent['id']}/cancel")


def test_a_token_in_the_query_string_is_not_taken_and_never_logged(
    server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    token = signer(server).mint(namespace="default", agent="sleeper", run_id="r-x", links=[])
    caplog.set_level(logging.DEBUG)
    for params in ({"token": token}, {"access_token": token}):
        answer = httpx.get(f"{server.url}/v1/links", params=params, timeout=30)
        assert answer.status_code == 401 and token not in answer.text
    # and a garbage token of the agent-token shape, huge, is 401, not a 500
    huge = "eyJ" + "A" * 100_000 + ".x.y"
    answer = httpx.get(
        f"{server.url}/v1/links", headers={"Authorization": f"Bearer {huge}"}, timeout=30
    )
    assert answer.status_code in (400, 401, 431), answer.status_code
    # the server's own records (this test's HTTP client logs what it sends)
    server_lines = [r.getMessage() for r in caplog.records if not r.name.startswith("http")]
    assert not [line for line in server_lines if token in line]


def test_a_token_for_the_future_or_with_claims_of_the_wrong_type_is_401(
    server: LiveServer,
) -> None:
    import jwt

    key = signer(server)._signing_keys()[0]
    now = int(time.time())
    base = {"iss": "corral", "aud": "corral:links", "iat": now, "exp": now + 60}
    good = {"ns": "default", "agent": "sleeper", "run": "r-x", "links": ["adder"]}
    for claims in (
        {**base, **good, "iat": now + 3600},  # minted in the future
        {**base, **good, "links": "adder"},  # not a list
        {**base, **good, "links": [1]},
        {**base, **good, "ns": ""},
        {**base, **good, "agent": ["sleeper"]},
        {**base, **good, "exp": "tomorrow"},
        {**base, **good, "aud": "corral:api"},
        {**{k: v for k, v in base.items() if k != "exp"}, **good},
    ):
        token = jwt.encode(claims, key, algorithm="HS256")
        answer = httpx.get(
            f"{server.url}/v1/links", headers={"Authorization": f"Bearer {token}"}, timeout=30
        )
        assert answer.status_code == 401, (claims, answer.text)
        assert answer.json()["code"] in ("token_invalid", "token_expired")
    # none of it stopped the server
    assert httpx.get(f"{server.url}/healthz", timeout=30).status_code in (200, 204)


def test_callers_racing_to_create_the_secret_key_all_get_the_one_key(tmp_path: Path) -> None:
    """A server and a worker (or a server and a test) on one home both mint or verify agent
    tokens the first time together: the one that loses the race to create secret.key must
    read the winner's key, never an empty file (was: ConfigurationError 'is empty')."""
    for attempt in range(40):
        key_file = tmp_path / f"home{attempt}" / "secret.key"
        start = threading.Barrier(8)
        keys: list[str] = []
        errors: list[BaseException] = []

        def race(
            key_file: Path = key_file,
            start: threading.Barrier = start,
            keys: list[str] = keys,
            errors: list[BaseException] = errors,
        ) -> None:
            start.wait()
            try:
                keys.append(SecretCipher(key_file=key_file).keys()[0])
            except BaseException as exc:
                errors.append(exc)

        racers = [threading.Thread(target=race) for _ in range(8)]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join(30)
        assert not errors, errors
        assert len(set(keys)) == 1 and keys[0] == key_file.read_text().strip()


def test_a_program_passing_its_own_token_to_a_linked_agent_stores_it_redacted(
    server: LiveServer,
) -> None:
    """A tool program (the model writes what it runs) sends its CORRAL_AGENT_TOKEN as the
    child's input: the child run's input and events are readable by any viewer, who could
    start runs with it while the caller runs. It is stored redacted."""
    with server.client(server.admin) as admin:
        parent = running(admin, "sleeper")
        token = signer(server).mint(
            namespace="default", agent="sleeper", run_id=parent["id"], links=["adder"]
        )
        with server.client(token) as client:
            child = client.post(
                "/v1/links/adder/exec", json={"input": f"use {token} please", "wait": False}
            )
        assert child.status_code == 202, child.text
        assert token not in child.text
        child_id = child.json()["id"]
        wait_for(
            lambda: admin.get(f"/v1/tasks/{child_id}").json()["state"] == "succeeded",
            message="the child to finish",
        )
        record = admin.get(f"/v1/tasks/{child_id}").text
        events = admin.get(f"/v1/runs/{child_id}/events", params={"limit": 500}).text
        assert token not in record + events
        assert "[REDACTED:agent_token]" in record + events
        admin.post(f"/v1/tasks/{parent['id']}/cancel")


def test_a_storm_of_retries_with_one_idempotency_key_starts_one_child(server: LiveServer) -> None:
    async def storm(token: str) -> list[httpx.Response]:
        async with server.async_client(token) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        "/v1/links/adder/exec",
                        json={"input": "1 + 1?", "wait": False},
                        headers={"Idempotency-Key": "retry-me"},
                    )
                    for _ in range(20)
                )
            )

    with server.client(server.admin) as admin:
        parent = running(admin, "sleeper")
        token = signer(server).mint(
            namespace="default", agent="sleeper", run_id=parent["id"], links=["adder"]
        )
        answers = asyncio.run(storm(token))
        assert {a.status_code for a in answers} <= {200, 202}, [a.text for a in answers]
        assert len({a.json()["id"] for a in answers}) == 1
        children = admin.get(f"/v1/tasks/{parent['id']}/children").json()["items"]
        assert len(children) == 1
        admin.post(f"/v1/tasks/{parent['id']}/cancel")


def test_a_linked_call_continues_only_sessions_of_its_own_run_tree(server: LiveServer) -> None:
    """A tool program names a session of the linked agent: another user's would hand it
    that user's earlier messages. Refused 403 session_not_allowed, nothing started; a
    session the caller's tree opened goes on."""
    with server.client(server.admin) as admin:
        theirs = admin.post(
            "/v1/agents/adder/prompt", json={"input": "my secret plan", "session": "their-talk"}
        )
        assert theirs.status_code == 200 and theirs.json()["state"] == "succeeded", theirs.text
        parent = running(admin, "sleeper")
        token = signer(server).mint(
            namespace="default", agent="sleeper", run_id=parent["id"], links=["adder"]
        )
        with server.client(token) as client:
            refused = client.post(
                "/v1/links/adder/exec", json={"input": "what did I say?", "session": "their-talk"}
            )
            assert refused.status_code == 403, refused.text
            assert refused.json()["code"] == "session_not_allowed"
            assert "my secret plan" not in refused.text
            assert admin.get(f"/v1/tasks/{parent['id']}/children").json()["items"] == []
            # a session its tree opens, continued by a later call of the same run
            answers = [
                client.post(
                    "/v1/links/adder/exec",
                    json={"input": text, "session": "our-talk", "timeout_seconds": 30},
                )
                for text in ("first", "second")
            ]
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
        first, second = (a.json() for a in answers)
        assert first["state"] == "succeeded" and second["session_id"] == "our-talk"
        # the second saw the first's turn: the one-turn scripted model is asked for a second
        assert "asked for turn 2" in second["error"]["message"], second
        said = admin.get("/v1/sessions/their-talk/messages").json()["items"]
        assert len(said) == 2  # the user's turn and its answer, nothing added
        admin.post(f"/v1/tasks/{parent['id']}/cancel")


def test_a_program_passing_its_token_encoded_to_a_linked_agent_stores_no_form_of_it(
    server: LiveServer,
) -> None:
    """The token in a child's input is redacted in every form redaction knows, not only as
    is: base64 (at each alignment), base64url, hex, percent-encoded, JSON-escaped twice,
    in upper case."""
    import base64
    import json
    import urllib.parse

    with server.client(server.admin) as admin:
        parent = running(admin, "sleeper")
        token = signer(server).mint(
            namespace="default", agent="sleeper", run_id=parent["id"], links=["adder"]
        )
        raw = token.encode()
        forms = {
            "base64": base64.b64encode(raw).decode(),
            "base64 inside": base64.b64encode(b"t:" + raw).decode(),
            "base64url": base64.urlsafe_b64encode(b"x" + raw).decode(),
            "hex": raw.hex(),
            "percent": urllib.parse.quote(token, safe=""),
            "json twice": json.dumps(json.dumps(token)),
            "upper": token.upper(),
        }
        with server.client(token) as client:
            child = client.post(
                "/v1/links/adder/exec",
                json={"input": json.dumps(forms), "timeout_seconds": 30},
            )
        assert child.status_code == 200, child.text
        child_id = child.json()["id"]
        record = admin.get(f"/v1/tasks/{child_id}").text
        events = admin.get(f"/v1/runs/{child_id}/events", params={"limit": 500}).text
        stored = admin.get(f"/v1/tasks/{child_id}").json()["input"]
        assert stored.count("[REDACTED:agent_token]") == len(forms), stored
        for name, form in forms.items():
            # a middle part of the form: what any of its encodings shows
            middle = form[len(form) // 3 : len(form) // 3 + 24]
            assert middle not in child.text + record + events, name
        admin.post(f"/v1/tasks/{parent['id']}/cancel")
