"""The published schema says exactly what the server does: 405s, parameters, resource specs.

Checked over real HTTP against a real ``corral serve``: every path's 405 names every
method the path serves; no parameter is published as nullable or allows an empty
cursor; kinds are an enumeration; a resource document's ``spec`` is the strict schema
of its ``kind``, for apply and for get/list alike. And an admin token cannot revoke
itself by accident.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, get_args

import httpx
import jsonschema
import pytest

from corral.api import KIND_NAMES, AgentOut, ResourceOut
from corral.client import Client
from corral.core.errors import ConflictError
from corral.core.tokens import Role, parse_token
from corral.resources.kinds import KINDS, SPEC_TYPES
from server_harness import LiveServer, apply, echo_turn, resources

METHODS = {"get", "post", "put", "patch", "delete"}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("home"), workers=0) as server:
        with server.client(server.admin) as client:
            apply(client, resources("helper", [echo_turn("x"), "{text: done}"]))
        yield server


@pytest.fixture(scope="module")
def schema(live: LiveServer) -> dict[str, Any]:
    document: dict[str, Any] = httpx.get(f"{live.url}/openapi.json", timeout=60).json()
    return document


def _concrete(path: str) -> str:
    """A URL of ``path`` with a valid value in each parameter (routing is all that counts)."""
    return re.sub(r"\{kind\}", "Agent", re.sub(r"\{[a-z_]+\}", "x1", path))


def test_a_405_allows_every_method_the_path_serves(
    live: LiveServer, schema: dict[str, Any]
) -> None:
    checked = 0
    for path, operations in schema["paths"].items():
        served = {m.upper() for m in operations if m in METHODS}
        for method in sorted(METHODS - {m.lower() for m in served}):
            response = httpx.request(method, f"{live.url}{_concrete(path)}")
            assert response.status_code == 405, (method, path, response.text)
            allowed = {m.strip() for m in response.headers["allow"].split(",")}
            assert allowed == served, (method, path, response.headers["allow"])
            assert response.json()["code"] == "method_not_allowed"
            checked += 1
    # /v1/tasks, /v1/resources, /v1/resources/{kind}/{name}, /v1/sessions/{id}, /v1/tokens
    # serve two methods each: the case Starlette got wrong
    assert checked > 60


def _parameters(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                yield f"{method} {path} {parameter['in']}.{parameter['name']}", parameter


def test_no_parameter_is_published_as_nullable_and_no_cursor_as_empty(
    live: LiveServer, schema: dict[str, Any]
) -> None:
    cursors = 0
    for where, parameter in _parameters(schema):
        assert "null" not in str(parameter["schema"]), where
        if parameter["name"] == "cursor":
            cursors += 1
            assert parameter["schema"]["minLength"] == 1, where
            assert not re.fullmatch(parameter["schema"]["pattern"], ""), where
    assert cursors == 9
    with live.client(live.admin) as client:
        for query in ("?cursor=", "?cursor=null"):
            refused = client.get(f"/v1/tasks{query}")
            assert refused.status_code == 422, refused.text
        task = client.post("/v1/tasks", json={"agent": "helper", "input": "x"}).json()["id"]
        events = f"/v1/runs/{task}/events"
        assert client.get(events, headers={"Last-Event-ID": "null"}).status_code == 422
        assert client.get(events, headers={"Last-Event-ID": "0"}).status_code == 200


def test_kinds_are_an_enumeration_the_server_keeps_to(
    live: LiveServer, schema: dict[str, Any]
) -> None:
    kinds = [p for w, p in _parameters(schema) if p["name"] == "kind"]
    assert len(kinds) == 3
    for parameter in kinds:
        assert parameter["schema"]["enum"] == list(KIND_NAMES)
    assert {"Agent", "agent", "agents", "McpServer", "mcpservers"} <= set(KIND_NAMES)
    with live.client(live.admin) as client:
        for name in KIND_NAMES:
            assert client.get("/v1/resources", params={"kind": name}).status_code == 200
        for name in ("AGENT", "Agents", "agentes", "widget", ""):
            refused = client.get("/v1/resources", params={"kind": name})
            assert refused.status_code == 422, (name, refused.text)
            assert refused.json()["errors"][0]["field"] == "query.kind"
            assert client.get(f"/v1/resources/{name or 'x'}/helper").status_code in (404, 422)
        assert client.get("/v1/resources/agents/helper").status_code == 200


def _validator(schema: dict[str, Any], sub: dict[str, Any]) -> jsonschema.Draft202012Validator:
    """A validator of ``sub``, a part of the OpenAPI document (its ``#/components`` refs too)."""
    return jsonschema.Draft202012Validator({**sub, "components": schema["components"]})


def _apply_schema(schema: dict[str, Any]) -> dict[str, Any]:
    body = schema["paths"]["/v1/resources"]["post"]["requestBody"]["content"]
    found: dict[str, Any] = body["application/json"]["schema"]
    return found


def test_each_kind_publishes_its_strict_spec_discriminated_by_kind(
    live: LiveServer, schema: dict[str, Any]
) -> None:
    components = schema["components"]["schemas"]
    [one, many] = _apply_schema(schema)["anyOf"]
    assert one["discriminator"]["propertyName"] == "kind"
    assert set(one["discriminator"]["mapping"]) == set(KINDS) == set(SPEC_TYPES)
    assert many["type"] == "array"
    for kind, reference in one["discriminator"]["mapping"].items():
        document = components[reference.rsplit("/", 1)[1]]
        assert document["properties"]["kind"]["const"] == kind
        spec = components[document["properties"]["spec"]["$ref"].rsplit("/", 1)[1]]
        assert spec["additionalProperties"] is False, kind
        assert set(spec["properties"]) == set(SPEC_TYPES[kind].model_fields), kind
    # The responses: the same specs, by kind.
    page = components["ResourcePage"]["properties"]["items"]["items"]
    assert set(page["discriminator"]["mapping"]) == set(KINDS)
    assert len(get_args(get_args(ResourceOut)[0])) == len(KINDS)


def test_the_published_apply_schema_refuses_what_the_server_refuses(
    live: LiveServer, schema: dict[str, Any]
) -> None:
    validator = _validator(schema, _apply_schema(schema))
    good = {
        "apiVersion": "corral/v1",
        "kind": "Secret",
        "metadata": {"name": "pw"},
        "spec": {"from_env": "PW"},
    }
    bad = [
        {**good, "spec": {"from_env": "PW", "bogus": 1}},  # a spec is strict
        {**good, "kind": "Agent"},  # an Agent's spec needs `model`
        {**good, "kind": "Widget"},
        {**good, "metadata": {"name": "pw", "namespace": None}},
        {**good, "extra": 1},
    ]
    assert validator.is_valid(good) and validator.is_valid([good, good])
    with live.client(live.admin) as client:
        assert client.post("/v1/resources", json=good).status_code == 200
        for document in bad:
            assert not validator.is_valid(document), document
            refused = client.post("/v1/resources", json=document)
            assert refused.status_code == 422, (document, refused.text)
        # YAML still goes through the loader, with the line of each problem.
        yaml = "apiVersion: corral/v1\nkind: Secret\nmetadata: {name: pw}\nspec:\n  bogus: 1\n"
        refused = client.post(
            "/v1/resources", content=yaml, headers={"Content-Type": "application/yaml"}
        )
        assert refused.status_code == 422
        assert {(e["field"], e["line"]) for e in refused.json()["errors"]} >= {("spec.bogus", 5)}


def test_stored_resources_answer_with_their_kind_s_spec(
    live: LiveServer, schema: dict[str, Any]
) -> None:
    validator = _validator(schema, {"$ref": "#/components/schemas/ResourcePage"})
    with live.client(live.admin) as client:
        page = client.get("/v1/resources").json()
        assert {item["kind"] for item in page["items"]} >= {"Agent", "Tool", "ModelEndpoint"}
        validator.validate(page)
    with Client(live.url, token=live.admin) as typed:
        agent = typed.get_resource("agent", "helper")
        assert isinstance(agent, AgentOut) and agent.spec.model == "helper-model"


def _id(token: str) -> str:
    parsed = parse_token(token)
    assert parsed is not None
    return parsed[0]


def test_a_token_never_revokes_itself_another_admin_token_does(live: LiveServer) -> None:
    """A client exploring the API (schemathesis with no configuration) cannot lock itself
    out: the token of the request is refused 409 own_token, ``force=true`` or not."""
    own = live.mint("default", Role.ADMIN)
    own_id = _id(own)
    with live.client(own) as client:
        for params in ({}, {"force": "true"}):
            refused = client.post(f"/v1/tokens/{own_id}/revoke", params=params)
            assert refused.status_code == 409 and refused.json()["code"] == "own_token"
            assert "another admin token" in refused.json()["detail"]
        assert client.get(f"/v1/tokens/{own_id}").json()["revoked_at"] is None
    with Client(live.url, token=own) as typed:
        with pytest.raises(ConflictError) as conflict:
            typed.revoke_token(own_id)
        assert conflict.value.code == "own_token"
        other = live.mint("default", Role.ADMIN)
        assert typed.revoke_token(_id(other)).revoked_at is not None
    with Client(live.url, token=live.mint("default", Role.ADMIN)) as another:
        assert another.revoke_token(own_id).revoked_at is not None
    with live.client(own) as client:
        assert client.get("/v1/tasks").status_code == 401


#: labels and whether the server takes them (the rule of core/labels.py)
LABELS = [
    ({"a": "b"}, True),
    ({"équipe": "café", "empty": ""}, True),
    ({"rocket": "🚀", "words": "a b", "k" * 63: "v" * 63}, True),
    ({f"k{n}": "v" for n in range(32)}, True),
    ({"": "v"}, False),
    ({"a,b": "c"}, False),
    ({"k": "x=y"}, False),
    ({"k!": "v"}, False),
    ({"k": "zero\u200bwidth"}, False),  # a format character
    ({"k": "bell\x07"}, False),
    ({"k": "nbsp\u00a0x"}, False),  # a space separator other than the space
    ({"k": "private\ue000"}, False),
    ({"k": "tag\U000e0041"}, False),
    ({" k": "v"}, False),
    ({"k": "v "}, False),
    ({"k\n": "v"}, False),
    ({"k": "v\n"}, False),
    ({"k" * 64: "v"}, False),
    ({"k": "v" * 64}, False),
    ({f"k{n}": "v" for n in range(33)}, False),
]


def test_the_published_labels_schema_says_what_the_server_takes(
    live: LiveServer, schema: dict[str, Any]
) -> None:
    """Key length and characters, values, at most 32: JSON Schema (``propertyNames``,
    ``maxProperties``, ``maxLength``, patterns), not prose only, and the same as the server."""
    body = schema["paths"]["/v1/tasks"]["post"]["requestBody"]["content"]["application/json"]
    task = _validator(schema, body["schema"])
    published = schema["components"]["schemas"]["SubmitTask"]["properties"]["labels"]
    assert published["maxProperties"] == 32
    assert published["propertyNames"]["maxLength"] == 63
    assert published["additionalProperties"]["maxLength"] == 63
    with live.client(live.admin) as client:
        for labels, taken in LABELS:
            request = {"agent": "helper", "input": "x", "labels": labels}
            assert task.is_valid(request) is taken, labels
            answer = client.post("/v1/tasks", json=request)
            assert answer.status_code == (201 if taken else 422), (labels, answer.text)
