"""Model-facing tool names: valid for every provider, readable, deterministic, unique per agent."""

from __future__ import annotations

import re

import pytest

from corral.tools.naming import model_tool_name, model_tool_names

VALID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@pytest.mark.parametrize(
    ("ref", "name"),
    [
        ("add", "add"),
        ("get-weather", "get-weather"),
        ("web.search", "web_search"),
        ("mcp:files/read", "files__read"),
        ("mcp:git/log.graph", "git__log_graph"),
    ],
)
def test_refs_map_to_readable_names(ref: str, name: str) -> None:
    assert model_tool_name(ref) == name


def test_long_refs_are_cut_with_a_hash_and_stay_distinct() -> None:
    first = model_tool_name("mcp:server/" + "x" * 80 + "a")
    second = model_tool_name("mcp:server/" + "x" * 80 + "b")
    assert VALID.match(first) and VALID.match(second)
    assert first != second
    assert first == model_tool_name("mcp:server/" + "x" * 80 + "a")  # deterministic


def test_a_ref_of_only_invalid_characters_still_gets_a_valid_name() -> None:
    assert VALID.match(model_tool_name("mcp:ü/ß"))


def test_colliding_refs_of_one_agent_get_distinct_names() -> None:
    names = model_tool_names(["a.b", "a_b", "mcp:files/read", "add"])
    assert names["add"] == "add" and names["mcp:files/read"] == "files__read"
    assert names["a.b"] != names["a_b"]
    assert all(VALID.match(n) for n in names.values())
    assert names == model_tool_names(["add", "a_b", "mcp:files/read", "a.b"])  # order-free
