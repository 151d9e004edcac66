"""Scoped agent tokens: a tool program calls its agent's linked agents over the API.

A real ``corral serve`` (:class:`LiveServer`) runs agent ``boss`` (links: ``adder``),
whose ``exec`` tool is a real program (``tool_programs/link_caller.py``) that calls
the API with the ``CORRAL_URL`` and ``CORRAL_AGENT_TOKEN`` planted in its environment.
Tokens the tests mint themselves are signed with the server's key (the same
``CORRAL_HOME``) through :class:`AgentTokenSigner`'s clock seam.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from corral.client import Client
from corral.core.errors import AuthError, NotFoundError, ToolError
from corral.core.settings import Settings
from corral.resources.isolation import IsolationSpec
from corral.resources.kinds import ExecToolSpec, ToolSpecModel
from corral.runtime.agent_tokens import AgentTokenError, AgentTokenIssuer, AgentTokenSigner
from corral.tools import exec as exec_tool
from corral.tools.base import ToolContext
from sandboxing import require_bwrap, sandbox_host
from server_harness import LiveServer, apply, wait_for

TESTS = Path(__file__).parent
CALLER = TESTS / "tool_programs" / "link_caller.py"


def call(arguments: dict[str, Any]) -> str:
    return f"{{tool_calls: [{{name: link_caller, arguments: {json.dumps(arguments)}}}]}}"


BOSS_SCRIPT = [
    call({"action": "list"}),
    call({"action": "info", "agent": "adder"}),
    call({"action": "exec", "agent": "adder", "input": "2 + 3?"}),
    call({"action": "exec", "agent": "stranger", "input": "hi"}),
    call({"action": "info", "agent": "stranger"}),
    call({"action": "raw", "method": "GET", "path": "/v1/tasks"}),
    call({"action": "raw", "method": "GET", "path": "/v1/resources"}),
    call({"action": "leak"}),
    call({"action": "leak-fail"}),
    "{text: done}",
]


def documents() -> str:
    script = "\n".join(f"    - {turn}" for turn in BOSS_SCRIPT)
    return f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: boss-model}}
spec:
  provider: scripted
  script:
{script}
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: plain-model}}
spec:
  provider: scripted
  script:
    - text: "5"
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: link_caller}}
spec:
  type: exec
  parameters: {{type: object}}
  exec:
    command: ["{sys.executable}", "{CALLER}"]
    # it calls the API over the loopback: outside the sandbox (which has no network)
    isolation: {{mode: none}}
  timeout_seconds: 60
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: adder}}
spec:
  model: plain-model
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: stranger}}
spec:
  model: plain-model
---
apiVersion: corral/v1
kind: ToolPermission
metadata: {{name: only-adder}}
spec: {{tools: ["agent:adder"], effect: allow}}
---
apiVersion: corral/v1
kind: AgentRole
metadata: {{name: adder-caller}}
spec: {{permissions: [only-adder]}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: guarded}}
spec:
  model: plain-model
  roles: [adder-caller]
  links: [adder, stranger]
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: waiter-model}}
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
metadata: {{name: waiter}}
spec:
  model: waiter-model
  tools: [echo]
  links: [adder, costly, napper]
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: napper}}
spec:
  model: waiter-model
  tools: [echo]
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: costly-model}}
spec:
  provider: scripted
  script:
    - {{text: pricey, input_tokens: 50}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: costly}}
spec:
  model: costly-model
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: spender-model}}
spec:
  provider: scripted
  script:
    - {call({"action": "exec", "agent": "costly", "input": "spend"})}
    - {{text: over, input_tokens: 60}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: spender}}
spec:
  model: spender-model
  tools: [link_caller]
  links: [costly]
  limits: {{max_tokens: 100}}
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: relay-model}}
spec:
  provider: scripted
  script:
    - {call({"action": "exec", "agent": "napper", "input": "nap", "wait": False})}
    - {call({"action": "exec", "agent": "napper", "input": "nap", "wait": False})}
    - {{text: relayed}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: relay}}
spec:
  model: relay-model
  tools: [link_caller]
  links: [napper]
  limits: {{max_tokens: 100}}
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: dozer-model}}
spec:
  provider: scripted
  script:
    - {{tool_calls: [{{name: echo, arguments: {{text: "z", seconds: 1}}}}]}}
    - {{text: rested, input_tokens: 10}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: dozer}}
spec:
  model: dozer-model
  tools: [echo]
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: leaver-model}}
spec:
  provider: scripted
  script:
    - {call({"action": "exec", "agent": "dozer", "input": "doze", "wait": False})}
    - {{tool_calls: [{{name: echo, arguments: {{text: "later", seconds: 6}}}}]}}
    - {{text: left}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: leaver}}
spec:
  model: leaver-model
  tools: [link_caller, echo]
  links: [dozer]
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: quitter-model}}
spec:
  provider: scripted
  script:
    - {call({"action": "exec", "agent": "napper", "input": "nap", "wait": False})}
    - {{text: bye}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: quitter}}
spec:
  model: quitter-model
  tools: [link_caller]
  links: [napper]
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: keeper-model}}
spec:
  provider: scripted
  script:
    - {call({"action": "save"})}
    - {call({"action": "exec-kept", "agent": "adder", "input": "1 + 1?"})}
    - {{text: kept}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: keeper}}
spec:
  model: keeper-model
  tools: [link_caller]
  links: [adder]
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: boss}}
spec:
  model: boss-model
  tools: [link_caller]
  links:
    - {{agent: adder, description: "adds numbers"}}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("home"), workers=4) as live:
        with live.client(live.admin) as admin:
            apply(admin, documents())
        yield live


@pytest.fixture(scope="module")
def boss_run(server: LiveServer) -> dict[str, Any]:
    """The boss run, finished, with the results of its tool calls in order, and every log
    record of the process (the server's thread included) while it ran."""
    records = _Records()
    root = logging.getLogger()
    level = root.level
    root.addHandler(records)
    root.setLevel(logging.DEBUG)
    try:
        with server.client(server.admin) as admin:
            response = admin.post(
                "/v1/agents/boss/prompt", json={"input": "go", "timeout_seconds": 120}
            )
            assert response.status_code == 200, response.text
            run = response.json()
            events = admin.get(f"/v1/runs/{run['id']}/events", params={"limit": 500}).json()
    finally:
        root.removeHandler(records)
        root.setLevel(level)
    results = [e for e in events["items"] if e["type"] == "tool.result"]
    run["logs"] = records.lines
    run["results"] = [r["data"] for r in results]
    run["events"] = events["items"]
    return run


class _Records(logging.Handler):
    """Every log record, formatted with its exception."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(name)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def result(run: dict[str, Any], index: int) -> Any:
    data = run["results"][index]
    assert data["error"] is None, data
    return json.loads(data["output"])


def signer(server: LiveServer, now: float | None = None) -> AgentTokenSigner:
    return AgentTokenSigner.from_settings(
        server.settings, now=(lambda: now) if now is not None else time.time
    )


def test_the_run_succeeds_and_its_tool_program_lists_its_links(boss_run: dict[str, Any]) -> None:
    assert boss_run["state"] == "succeeded", boss_run
    listed = result(boss_run, 0)
    assert listed == {
        "status": 200,
        "body": {"items": [{"agent": "adder", "description": "adds numbers"}], "next_cursor": None},
    }
    info = result(boss_run, 1)
    assert info["status"] == 200 and info["body"]["agent"] == "adder"
    assert info["body"]["description"] == "adds numbers"


def test_exec_starts_a_child_of_the_calling_run_and_answers_its_result(
    server: LiveServer, boss_run: dict[str, Any]
) -> None:
    executed = result(boss_run, 2)
    assert executed["status"] == 200, executed
    child = executed["body"]
    assert child["agent"] == "adder" and child["state"] == "succeeded"
    assert child["output"] == "5"
    with server.client(server.admin) as admin:
        children = admin.get(f"/v1/tasks/{boss_run['id']}/children").json()["items"]
    assert [c["id"] for c in children] == [child["id"]]
    # its spend is the caller's, journaled once its call was done (no call answers with it)
    finished = [e["data"] for e in boss_run["events"] if e["type"] == "child.finish"]
    assert [(f["run_id"], f.get("call_id"), f["state"]) for f in finished] == [
        (child["id"], None, "succeeded")
    ]
    assert boss_run["usage"]["requests"] == len(BOSS_SCRIPT) + 1


def test_a_childs_spend_started_over_the_api_counts_against_the_callers_budget(
    server: LiveServer,
) -> None:
    with server.client(server.admin) as admin:
        response = admin.post(
            "/v1/agents/spender/prompt", json={"input": "go", "timeout_seconds": 120}
        )
        assert response.status_code == 200, response.text
        run = response.json()
        events = admin.get(f"/v1/runs/{run['id']}/events", params={"limit": 500}).json()
        (child,) = admin.get(f"/v1/tasks/{run['id']}/children").json()["items"]
    assert (child["agent"], child["state"], child["output"]) == ("costly", "succeeded", "pricey")
    assert run["state"] == "failed"
    assert (run["error"]["code"], run["error"]["limit"]) == ("budget_exceeded", "max_tokens")
    # the child's 50 (within the 100 the token said spender had left), and spender's next
    # turn's 60 would pass its 100 only with the child's counted: that turn is not made
    assert run["usage"]["input_tokens"] == 50
    kinds = [e["type"] for e in events["items"]]
    # the call's result (the child's answer, as the program got it), then the charge
    assert kinds.index("tool.result") < kinds.index("child.finish") < kinds.index("error")
    (result_event,) = [e["data"] for e in events["items"] if e["type"] == "tool.result"]
    assert json.loads(result_event["output"])["body"]["output"] == "pricey"


def test_an_agent_not_linked_is_404_as_if_it_did_not_exist(boss_run: dict[str, Any]) -> None:
    for index in (3, 4):
        refused = result(boss_run, index)
        assert refused["status"] == 404, refused
        assert refused["body"]["code"] == "not_found"


def test_the_agent_token_is_refused_on_other_routes(boss_run: dict[str, Any]) -> None:
    for index in (5, 6):
        refused = result(boss_run, index)
        assert refused["status"] == 403, refused
        assert refused["body"]["code"] == "agent_token_not_allowed"


def test_the_token_never_shows_in_output_events_or_logs(
    server: LiveServer, boss_run: dict[str, Any], capfd: pytest.CaptureFixture[str]
) -> None:
    leaked = result(boss_run, 7)
    assert leaked == {"token": "[REDACTED:agent_token]"}
    failed = boss_run["results"][8]["error"]  # the token on stderr, in a failure's reason
    assert "[REDACTED:agent_token]" in failed["reason"], failed
    assert "[REDACTED:agent_token]" in failed["details"]["stderr"]
    everything = json.dumps(boss_run["events"]) + json.dumps(boss_run["output"])
    # every agent token is a JWT of the same header: none is in the run's record
    assert "eyJ" not in everything
    with server.client(server.admin) as admin:
        for run in admin.get("/v1/tasks", params={"limit": 100}).json()["items"]:
            events = admin.get(f"/v1/runs/{run['id']}/events", params={"limit": 500}).text
            assert "eyJ" not in events and "eyJ" not in json.dumps(run)
    assert boss_run["logs"], "no log record was seen: the check below would prove nothing"
    assert not [line for line in boss_run["logs"] if "eyJ" in line]
    out, err = capfd.readouterr()
    assert "eyJ" not in out + err


def links_client(server: LiveServer, token: str) -> httpx.Client:
    return server.client(token)


def test_a_token_for_an_agent_not_linked_is_404(
    server: LiveServer, boss_run: dict[str, Any]
) -> None:
    token = signer(server).mint(
        namespace="default", agent="boss", run_id=boss_run["id"], links=["adder"]
    )
    with links_client(server, token) as client:
        assert client.get("/v1/links/stranger").status_code == 404
        response = client.post("/v1/links/stranger/exec", json={"input": "hi", "wait": False})
        assert response.status_code == 404 and response.json()["code"] == "not_found"
        # the links are the token's AND the agent's: a token naming more gains nothing
    wider = signer(server).mint(
        namespace="default", agent="boss", run_id=boss_run["id"], links=["adder", "stranger"]
    )
    with links_client(server, wider) as client:
        assert [i["agent"] for i in client.get("/v1/links").json()["items"]] == ["adder"]
        assert client.get("/v1/links/stranger").status_code == 404


def test_a_token_of_another_namespace_reaches_nothing(
    server: LiveServer, boss_run: dict[str, Any]
) -> None:
    token = signer(server).mint(
        namespace="beta", agent="boss", run_id=boss_run["id"], links=["adder"]
    )
    with links_client(server, token) as client:
        assert client.get("/v1/links").status_code == 404
        response = client.post("/v1/links/adder/exec", json={"input": "hi", "wait": False})
        assert response.status_code == 404
        assert "default" not in response.text


def test_exec_for_a_finished_run_is_409(server: LiveServer, boss_run: dict[str, Any]) -> None:
    token = signer(server).mint(
        namespace="default", agent="boss", run_id=boss_run["id"], links=["adder"]
    )
    with links_client(server, token) as client:
        response = client.post("/v1/links/adder/exec", json={"input": "late"})
    assert response.status_code == 409 and response.json()["code"] == "conflict"


def test_an_expired_token_is_401_token_expired(server: LiveServer) -> None:
    an_hour_ago = time.time() - 3600
    token = signer(server, now=an_hour_ago).mint(
        namespace="default", agent="boss", run_id="r-x", links=["adder"]
    )
    with links_client(server, token) as client:
        response = client.get("/v1/links")
    assert response.status_code == 401
    assert response.json()["code"] == "token_expired"
    assert "WWW-Authenticate" in response.headers


@pytest.mark.parametrize("how", ["signature", "payload", "garbage", "other key", "alg none"])
def test_a_tampered_token_is_401_token_invalid(server: LiveServer, how: str) -> None:
    good = signer(server).mint(namespace="default", agent="boss", run_id="r-x", links=["adder"])
    header, payload, signature = good.split(".")
    if how == "signature":
        token = (
            f"{header}.{payload}.{signature[:-4]}{'AAAA' if signature[-4:] != 'AAAA' else 'BBBB'}"
        )
    elif how == "payload":
        claims = json.loads(_b64decode(payload))
        claims["links"] = ["adder", "stranger"]
        token = f"{header}.{_b64encode(json.dumps(claims).encode())}.{signature}"
    elif how == "garbage":
        token = "eyJ.\u00e9\u00e9.x"
    elif how == "other key":
        other = AgentTokenSigner(lambda: ["another deployment's key"])
        token = other.mint(namespace="default", agent="boss", run_id="r-x", links=["adder"])
    else:
        none_header = _b64encode(b'{"alg":"none","typ":"JWT"}')
        token = f"{none_header}.{payload}."
    response = httpx.get(
        f"{server.url}/v1/links",
        headers={"Authorization": f"Bearer {token}".encode()},
        timeout=30,
    )
    assert response.status_code == 401, response.text
    assert response.json()["code"] == "token_invalid"


def test_an_api_token_on_links_is_403(server: LiveServer) -> None:
    with server.client(server.admin) as admin:
        response = admin.get("/v1/links")
    assert response.status_code == 403
    assert response.json()["code"] == "agent_token_required"


def test_no_token_on_links_is_401(server: LiveServer) -> None:
    response = httpx.get(f"{server.url}/v1/links", timeout=30)
    assert response.status_code == 401 and response.json()["code"] == "unauthenticated"


def test_keys_rotate_like_the_secret_key() -> None:
    old = AgentTokenSigner(lambda: ["old key"])
    token = old.mint(namespace="default", agent="boss", run_id="r-1", links=["adder"])
    rotated = AgentTokenSigner(lambda: ["new key", "old key"])
    claims = rotated.verify(token)
    assert (claims.namespace, claims.agent, claims.run_id, claims.links) == (
        "default",
        "boss",
        "r-1",
        ("adder",),
    )
    fresh = rotated.mint(namespace="default", agent="boss", run_id="r-1", links=[])
    assert AgentTokenSigner(lambda: ["new key"]).verify(fresh).run_id == "r-1"
    with pytest.raises(AgentTokenError) as dropped:
        AgentTokenSigner(lambda: ["new key"]).verify(token)
    assert dropped.value.code == "token_invalid"


def _b64decode(text: str) -> bytes:
    import base64

    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _b64encode(data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def test_a_linked_agent_its_roles_deny_is_403_and_not_listed(server: LiveServer) -> None:
    token = signer(server).mint(
        namespace="default", agent="guarded", run_id="r-x", links=["adder", "stranger"]
    )
    with server.client(token) as client:
        assert [i["agent"] for i in client.get("/v1/links").json()["items"]] == ["adder"]
        assert client.get("/v1/links/adder").status_code == 200
        denied = client.get("/v1/links/stranger")
        assert denied.status_code == 403 and denied.json()["code"] == "permission_denied"
        denied = client.post("/v1/links/stranger/exec", json={"input": "hi", "wait": False})
        assert denied.status_code == 403 and denied.json()["code"] == "permission_denied"


def running_waiter(
    server: LiveServer, admin: httpx.Client, links: list[str], **left: Any
) -> tuple[dict[str, Any], str]:
    """A task of ``waiter`` (its tool call sleeps), once it runs, and an agent token of it
    for ``links`` (``left``: the budget claims, ``cost_left`` / ``tokens_left``)."""
    parent: dict[str, Any] = admin.post(
        "/v1/tasks", json={"agent": "waiter", "input": "sleep"}
    ).json()
    wait_for(
        lambda: admin.get(f"/v1/tasks/{parent['id']}").json()["state"] == "running",
        message="the waiter to run",
    )
    token = signer(server).mint(
        namespace="default", agent="waiter", run_id=parent["id"], links=links, **left
    )
    return parent, token


def test_exec_without_waiting_is_202_and_a_retried_request_finds_its_child(
    server: LiveServer,
) -> None:
    with server.client(server.admin) as admin:
        parent, token = running_waiter(server, admin, ["adder"])
        with server.client(token) as client:
            body = {"input": "1 + 1?", "wait": False}
            key = {"Idempotency-Key": "call-7"}
            first = client.post("/v1/links/adder/exec", json=body, headers=key)
            again = client.post("/v1/links/adder/exec", json=body, headers=key)
            assert first.status_code == 202 and again.status_code in (200, 202)
            assert first.json()["id"] == again.json()["id"]
            assert first.headers["Location"] == f"/v1/tasks/{first.json()['id']}"
            waited = client.post("/v1/links/adder/exec", json={"input": "2 + 2?"})
            assert waited.status_code == 200 and waited.json()["state"] == "succeeded"
            # the parent is the token's, whatever the body says
            forged = client.post(
                "/v1/links/adder/exec", json={"input": "x", "parent_run_id": "r-other"}
            )
            assert forged.status_code == 422
        children = admin.get(f"/v1/tasks/{parent['id']}/children").json()["items"]
        assert sorted(c["id"] for c in children) == sorted(
            [first.json()["id"], waited.json()["id"]]
        )
        assert {c["parent_run_id"] for c in children} == {parent["id"]}
        admin.post(f"/v1/tasks/{parent['id']}/cancel")


def test_a_child_started_over_the_api_is_capped_at_what_its_caller_had_left(
    server: LiveServer,
) -> None:
    # The token of a call carries what its run had left of its limits then; a child the
    # token starts gets that as its own cap, as an agents_exec child does: costly's one
    # turn (50 tokens) would pass the 20 left, and is not made.
    with server.client(server.admin) as admin:
        parent, token = running_waiter(server, admin, ["costly"], tokens_left=20)
        with server.client(token) as client:
            child = client.post("/v1/links/costly/exec", json={"input": "spend"}).json()
        admin.post(f"/v1/tasks/{parent['id']}/cancel")
    assert child["state"] == "failed", child
    assert (child["error"]["code"], child["error"]["limit"]) == ("budget_exceeded", "max_tokens")
    assert child["usage"]["input_tokens"] == 0


def test_the_children_of_one_token_share_what_it_carries(server: LiveServer) -> None:
    # One call's token carries 120 tokens: costly's children (50 each) get what the
    # earlier ones left - 120, 70, then 20, which its one turn would pass (so it is not
    # made). A fourth gets the 20 left too, and fails alike; no child spent past it.
    with server.client(server.admin) as admin:
        parent, token = running_waiter(server, admin, ["costly"], tokens_left=120, call="1:0")
        with server.client(token) as client:
            key = {"Idempotency-Key": "first"}
            children = [
                client.post(
                    "/v1/links/costly/exec",
                    json={"input": f"spend {n}"},
                    headers=key if n == 0 else {},
                ).json()
                for n in range(3)
            ]
            fourth = client.post("/v1/links/costly/exec", json={"input": "spend 3"})
            again = client.post("/v1/links/costly/exec", json={"input": "spend 0"}, headers=key)
        listed = admin.get(f"/v1/tasks/{parent['id']}/children").json()["items"]
        admin.post(f"/v1/tasks/{parent['id']}/cancel")
    assert [c["state"] for c in children] == ["succeeded", "succeeded", "failed"], children
    assert children[2]["error"]["limit"] == "max_tokens"
    assert [c["max_tokens"] for c in children] == [120, 70, 20]
    assert [c["usage"]["input_tokens"] for c in children] == [50, 50, 0]
    assert fourth.status_code == 200, fourth.text
    assert (fourth.json()["max_tokens"], fourth.json()["state"]) == (20, "failed")
    assert fourth.json()["usage"]["input_tokens"] == 0
    assert again.status_code == 200 and again.json()["id"] == children[0]["id"]
    assert len(listed) == 4


def test_children_one_token_starts_at_once_never_get_more_than_it_carries(
    server: LiveServer,
) -> None:
    # Six children of one token started at once, each running on (napper sleeps): the
    # first submitted holds all 120 tokens until it ends, the others are refused (409
    # budget_exceeded) - not given 120 each. Another call's token has its own 120.
    with server.client(server.admin) as admin:
        parent, token = running_waiter(server, admin, ["napper"], tokens_left=120, call="1:0")
        _, other = running_waiter(server, admin, ["napper"], tokens_left=120, call="1:1")

        def start(token: str) -> dict[str, Any]:
            with server.client(token) as client:
                body = {"input": "nap", "wait": False}
                response = client.post("/v1/links/napper/exec", json=body)
                assert response.status_code in (202, 409), response.text
                return response.json()

        started: list[dict[str, Any]] = []

        async def all_at_once() -> None:
            async with anyio.create_task_group() as group:
                for _ in range(6):
                    group.start_soon(anyio.to_thread.run_sync, lambda: started.append(start(token)))

        anyio.run(all_at_once)
        apart = start(other)
        admin.post(f"/v1/tasks/{parent['id']}/cancel")
        assert [c["max_tokens"] for c in started if "id" in c] == [120]
        assert [c["code"] for c in started if "id" not in c] == ["budget_exceeded"] * 5
        assert apart["max_tokens"] == 120
        for child in [*started, apart]:
            if "id" in child:
                admin.post(f"/v1/tasks/{child['id']}/cancel")


def test_a_child_a_program_left_running_holds_its_cap_in_the_runs_next_steps(
    server: LiveServer,
) -> None:
    # relay (max_tokens 100) starts a napper child in one step without waiting for it
    # (it sleeps on, holding its cap of 100): the next step's token has nothing left to
    # carry, so its child is refused - not capped at 100 again
    with server.client(server.admin) as admin:
        response = admin.post("/v1/agents/relay/prompt", json={"input": "go"})
        assert response.status_code == 200, response.text
        run = response.json()
        events = admin.get(f"/v1/runs/{run['id']}/events", params={"limit": 500}).json()
        children = admin.get(f"/v1/tasks/{run['id']}/children").json()["items"]
        for child in children:
            admin.post(f"/v1/tasks/{child['id']}/cancel")
    results = [
        json.loads(e["data"]["output"]) for e in events["items"] if e["type"] == "tool.result"
    ]
    assert results[0]["status"] == 202 and results[0]["body"]["max_tokens"] == 100
    assert results[1]["status"] == 409, results[1]
    assert results[1]["body"]["code"] == "budget_exceeded"
    assert [c["max_tokens"] for c in children] == [100]


def test_a_child_a_program_left_running_is_charged_once_it_ended(server: LiveServer) -> None:
    # leaver starts a dozer child without waiting (it ends a second or so later, having
    # used 10 tokens), then its next call (no token) sleeps 6s: the child's spend is
    # charged to leaver when that step is done, not lost for ending after its own step
    with server.client(server.admin) as admin:
        response = admin.post("/v1/agents/leaver/prompt", json={"input": "go"})
        assert response.status_code == 200, response.text
        run = response.json()
        events = admin.get(f"/v1/runs/{run['id']}/events", params={"limit": 500}).json()
        (child,) = admin.get(f"/v1/tasks/{run['id']}/children").json()["items"]
    assert child["state"] == "succeeded"
    finished = [e for e in events["items"] if e["type"] == "child.finish"]
    assert [(e["data"]["step"], e["data"]["run_id"]) for e in finished] == [(2, child["id"])]
    assert run["usage"]["input_tokens"] == 10


def test_a_runs_end_cancels_the_children_its_programs_left_running(server: LiveServer) -> None:
    # quitter starts a napper child without waiting (it would sleep 30 s), then answers:
    # nothing would charge what the child spends after its parent ended, so it is cancelled
    with server.client(server.admin) as admin:
        response = admin.post("/v1/agents/quitter/prompt", json={"input": "go"})
        assert response.status_code == 200, response.text
        run = response.json()
        assert run["state"] == "succeeded", run
        (child,) = admin.get(f"/v1/tasks/{run['id']}/children").json()["items"]
        wait_for(
            lambda: admin.get(f"/v1/tasks/{child['id']}").json()["state"] == "cancelled",
            message="the child left running to be cancelled",
        )


def test_a_token_kept_past_its_call_starts_no_child(server: LiveServer) -> None:
    # keeper's first call keeps its token in the workspace; its second call's program
    # uses that token: its call has ended (the run is a step further), so no child starts
    with server.client(server.admin) as admin:
        response = admin.post("/v1/agents/keeper/prompt", json={"input": "go"})
        assert response.status_code == 200, response.text
        run = response.json()
        events = admin.get(f"/v1/runs/{run['id']}/events", params={"limit": 500}).json()
        children = admin.get(f"/v1/tasks/{run['id']}/children").json()["items"]
    results = [
        json.loads(e["data"]["output"]) for e in events["items"] if e["type"] == "tool.result"
    ]
    assert results[0] == {"saved": True}
    assert results[1]["status"] == 401, results[1]
    assert results[1]["body"]["code"] == "token_expired"
    assert "has ended" in results[1]["body"]["detail"]
    assert children == []


def test_a_token_of_an_earlier_step_is_refused_one_of_the_current_step_is_not(
    server: LiveServer,
) -> None:
    # the waiter's run is in its step 1: a token naming step 0 (minted at the journal's
    # start) belongs to a call that ended; one naming step 1 to a call still running
    with server.client(server.admin) as admin:
        parent, ended = running_waiter(server, admin, ["adder"], call="0:0", seq=0)
        current = signer(server).mint(
            namespace="default",
            agent="waiter",
            run_id=parent["id"],
            links=["adder"],
            call="1:0",
            seq=0,
        )
        with server.client(ended) as client:
            refused = client.post("/v1/links/adder/exec", json={"input": "hi", "wait": False})
        with server.client(current) as client:
            started = client.post("/v1/links/adder/exec", json={"input": "hi", "wait": False})
        admin.post(f"/v1/tasks/{parent['id']}/cancel")
    assert (refused.status_code, refused.json()["code"]) == (401, "token_expired")
    assert started.status_code == 202, started.text


@pytest.mark.parametrize(
    "left",
    [
        {"tokens_left": -1},
        {"tokens_left": 1.5},
        {"cost_left": float("nan")},
        {"call": "1:2:3"},
        {"call": "../x"},
        {"call": "1:" + "9" * 40},
        {"seq": -1},
        {"seq": "12"},
    ],
)
def test_a_token_whose_budget_claim_is_not_a_budget_is_401_token_invalid(
    server: LiveServer, left: dict[str, Any]
) -> None:
    token = signer(server).mint(
        namespace="default", agent="boss", run_id="r-x", links=["adder"], **left
    )
    with links_client(server, token) as client:
        response = client.get("/v1/links")
    assert response.status_code == 401, response.text
    assert response.json()["code"] == "token_invalid"


@pytest.mark.parametrize("network", [True, False])
def test_a_sandboxed_program_reaches_the_api_only_with_network(
    server: LiveServer, tmp_path: Path, network: bool
) -> None:
    host = sandbox_host(tmp_path / "home")
    require_bwrap(host)
    spec = ToolSpecModel(
        type="exec",
        parameters={"type": "object"},
        exec=ExecToolSpec(
            command=[sys.executable, str(CALLER)],
            isolation=IsolationSpec(mode="sandbox", network=network),
        ),
    )
    tool = exec_tool.create("link_caller", spec, {}, sandbox_host=host)
    token = signer(server).mint(namespace="default", agent="boss", run_id="r-x", links=["adder"])
    workspace = tmp_path / "home" / "work" / "agents" / "default" / "boss"
    workspace.mkdir(parents=True)
    ctx = ToolContext(
        run_id="r-x",
        agent="boss",
        namespace="default",
        call_id="call-1",
        idempotency_key="r-x:1:0",
        workspace=workspace,
        environment={"CORRAL_URL": server.url, "CORRAL_AGENT_TOKEN": token},
    )
    if network:
        answer = anyio.run(tool.call, {"action": "list"}, ctx)
        assert answer["status"] == 200
        assert [i["agent"] for i in answer["body"]["items"]] == ["adder"]
    else:  # the sandbox's own loopback: nothing listens there
        with pytest.raises(ToolError) as refused:
            anyio.run(tool.call, {"action": "list"}, ctx)
        assert "Connection refused" in refused.value.info.reason


def test_the_url_is_planted_only_when_known() -> None:
    signer_ = AgentTokenSigner(lambda: ["a key"])
    known = AgentTokenIssuer(signer_, lambda: "http://corral.internal:8080")
    env = known.environment(namespace="default", agent="boss", run_id="r-1", links=["adder"])
    assert env["CORRAL_URL"] == "http://corral.internal:8080"
    assert signer_.verify(env["CORRAL_AGENT_TOKEN"]).links == ("adder",)
    unknown = AgentTokenIssuer(signer_, lambda: None)  # embedded `corral run`, no public URL
    env = unknown.environment(namespace="default", agent="boss", run_id="r-1", links=[])
    assert set(env) == {"CORRAL_AGENT_TOKEN"}


def test_corral_public_url_is_read_without_its_trailing_slash(tmp_path: Path) -> None:
    environ = {"CORRAL_HOME": str(tmp_path), "CORRAL_PUBLIC_URL": "https://corral.example/"}
    assert Settings.from_env(environ).public_url == "https://corral.example"
    assert Settings.from_env({"CORRAL_HOME": str(tmp_path)}).public_url is None


def test_the_python_client_calls_linked_agents_with_an_agent_token(server: LiveServer) -> None:
    with server.client(server.admin) as admin:
        parent, token = running_waiter(server, admin, ["adder"])
        try:
            with Client(server.url, token) as client:
                assert [link.agent for link in client.links().items] == ["adder"]
                assert client.link_info("adder").agent == "adder"
                child = client.link_exec("adder", "3 + 4?", idempotency_key="k-1")
                assert child.state == "succeeded" and child.output == "5"
                assert child.parent_run_id == parent["id"]
                again = client.link_exec("adder", "3 + 4?", idempotency_key="k-1", wait=False)
                assert again.id == child.id
                with pytest.raises(NotFoundError) as missing:
                    client.link_info("stranger")
                assert missing.value.code == "not_found"
                with pytest.raises(AuthError) as refused:
                    client.list_tasks()
                assert refused.value.code == "agent_token_not_allowed"
        finally:
            admin.post(f"/v1/tasks/{parent['id']}/cancel")
