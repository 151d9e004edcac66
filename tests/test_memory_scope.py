"""Whose entries (``core/memory.MemoryScope``): one value from the CLI's options, the
API's query and bodies and the client's keyword arguments down to the place a Memory
keeps the entries at, with the same names on the wire as ever."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from cli_harness import invoke
from corral.api.memory import SCOPE_HELP, MemorySearchRequest
from corral.client import calls
from corral.core.memory import MemoryInputError, MemoryPlace, MemoryScope
from server_harness import apply

DIARY = """
apiVersion: corral/v1
kind: Memory
metadata: {name: scope-diary}
spec: {scope: agent}
"""


def test_a_scope_sends_only_the_names_given_and_reads_back_as_the_same_scope() -> None:
    scope = MemoryScope(agent="alice", system_run="run_1")
    assert scope.query() == [("agent", "alice"), ("system_run", "run_1")]
    assert scope.fields() == {"agent": "alice", "system_run": "run_1"}
    assert MemoryScope(**scope.fields()) == scope
    assert MemoryScope().query() == [] and MemoryScope().fields() == {}
    # an empty name is sent (and refused by the server), not dropped as if not given
    assert MemoryScope(session="").query() == [("session", "")]


def test_the_owner_of_the_memorys_scope_keys_its_place_and_the_others_are_ignored() -> None:
    scope = MemoryScope("alice", "sess_1", "run_1")
    assert scope.place_in("ns", "m", "agent") == MemoryPlace("ns", "m", "alice")
    assert scope.place_in("ns", "m", "session") == MemoryPlace("ns", "m", "sess_1")
    assert scope.place_in("ns", "m", "system_run") == MemoryPlace("ns", "m", "run_1")
    assert scope.place_in("ns", "m", "namespace") == MemoryPlace("ns", "m")


@pytest.mark.parametrize(
    ("kind", "scope", "why"),
    [
        ("agent", MemoryScope(session="sess_1", system_run="run_1"), "kept per agent"),
        ("agent", MemoryScope(agent=""), "kept per agent, and no agent was given"),
        ("session", MemoryScope(agent="alice"), r"this run has no session"),
        ("system_run", MemoryScope(session="s"), r"not part of an agent system's run"),
        ("galaxy", MemoryScope("alice", "s", "r"), "unknown scope 'galaxy'"),
    ],
)
def test_a_scope_without_the_owner_its_memory_is_kept_by_is_refused(
    kind: str, scope: MemoryScope, why: str
) -> None:
    with pytest.raises(MemoryInputError, match=why):
        scope.place_in("ns", "m", kind)


def test_the_client_sends_the_scope_under_the_names_it_always_had() -> None:
    odd = "a&agent=b"  # one value, however it looks: httpx encodes it
    read = calls.read_memory("m", "k", agent=odd, system_run="run_1")
    assert read.params == [("agent", odd), ("system_run", "run_1")]
    listed = calls.memory_entries("m", prefix="p", session="sess_1", limit=5)
    assert listed.params[:2] == [("prefix", "p"), ("session", "sess_1")]
    assert calls.delete_memory("m", "k").params == []
    write = calls.write_memory("m", "t", agent="alice")
    assert write.json == {"text": "t", "agent": "alice"}
    search = calls.search_memory("m", "q", session="s")
    assert search.json is not None and search.json["session"] == "s"
    assert "agent" not in search.json and "system_run" not in search.json


def test_a_body_names_whose_entries_by_its_flat_fields() -> None:
    body = MemorySearchRequest.model_validate({"query": "q", "agent": "alice"})
    assert body.scope == MemoryScope(agent="alice")
    assert "scope" not in body.model_dump()  # not a field: the wire is unchanged


def test_every_memory_command_takes_the_scope_options_in_one_place(tmp_path: Path) -> None:
    env = {"CORRAL_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    for command in ("write", "read", "search", "list", "delete", "ingest"):
        shown = invoke(("memory", command, "--help"), env)
        assert shown.returncode == 0, shown.stderr
        found = [shown.stdout.find(option) for option in ("--agent", "--session", "--system-run")]
        assert -1 not in found and found == sorted(found), (command, shown.stdout)
    missing = invoke(("memory", "list", "notes", "--agent"), env)
    assert missing.returncode == 2 and "--agent" in missing.stderr


def test_a_route_reads_the_scope_from_its_query_and_refuses_a_bad_one(
    client: httpx.Client,
) -> None:
    apply(client, DIARY)
    base = "/v1/memories/scope-diary/entries"
    written = client.post(base, json={"text": "alice's day", "key": "d", "agent": "alice"})
    assert written.status_code == 201 and written.json()["scope_key"] == "alice"
    read = client.get(f"{base}/d", params={"agent": "alice"})
    assert read.status_code == 200 and read.json()["text"] == "alice's day"
    listed = client.get(base, params={"agent": "bob"}).json()
    assert listed["items"] == []
    for params in ({"agent": "Not A Name!"}, {"system_run": ""}, {"agent": "x" * 2_000}):
        refused = client.get(f"{base}/d", params=params)
        assert refused.status_code == 422, (params, refused.text)
        assert refused.json()["code"] == "invalid_request"
        assert f"query.{next(iter(params))}" in refused.text
    assert client.delete(f"{base}/d", params={"agent": "bob"}).status_code == 404
    assert client.delete(f"{base}/d", params={"agent": "alice"}).status_code == 204


def test_the_schema_publishes_the_scope_query_parameters_as_before(client: httpx.Client) -> None:
    schema = client.get("/openapi.json").json()
    listing = schema["paths"]["/v1/memories/{name}/entries"]["get"]["parameters"]
    query = {p["name"]: p for p in listing if p["in"] == "query"}
    assert {"prefix", "agent", "session", "system_run", "limit", "cursor"} <= set(query)
    for name, help in SCOPE_HELP.items():
        assert query[name]["description"] == help and not query[name].get("required")
