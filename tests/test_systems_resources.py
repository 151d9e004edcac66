"""The AgentSystem kind at apply: each problem of a graph refused with the field it is
about (file, line and field path; the CLI's exit 2, the API's 422), hostile graphs
refused cleanly, and references to its Agents held like any other reference."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from corral.core.errors import DocumentTooComplexError, ResourceError
from corral.core.settings import Settings
from corral.resources.loader import load_text
from corral.resources.systems import MAX_SYSTEM_NODES
from corral.store import Store

AGENTS = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: m}
spec: {provider: scripted, script: [{text: hi}]}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: a}
spec: {model: m}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: b}
spec: {model: m}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: c}
spec: {model: m}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: typed}
spec: {model: m, output_schema: {type: object, properties: {next: {type: string}}}}
"""


def system_doc(spec: dict[str, Any]) -> str:
    return yaml.safe_dump(
        {"apiVersion": "corral/v1", "kind": "AgentSystem", "metadata": {"name": "s"}, "spec": spec}
    )


async def refused(store: Store, spec: dict[str, Any]) -> str:
    """Apply the system (after the agents) and return the error's text."""
    await store.apply(load_text(AGENTS, "agents.yaml"))
    with pytest.raises(ResourceError) as caught:
        await store.apply(load_text(system_doc(spec), "system.yaml"))
    assert await store.get_resource("default", "AgentSystem", "s") is None
    return str(caught.value)


@pytest.fixture
def store(env: tuple[Store, Settings]) -> Store:
    return env[0]


async def test_a_valid_graph_is_stored_with_its_defaults(store: Store) -> None:
    await store.apply(load_text(AGENTS, "agents.yaml"))
    spec = {"entry": "a", "graph": {"a": {"next": ["b", "c"]}, "b": {}, "c": {}}, "output": "b"}
    (outcome,) = await store.apply(load_text(system_doc(spec), "system.yaml"))
    assert outcome.action.value == "created"
    stored = await store.get_resource("default", "AgentSystem", "s")
    assert stored is not None
    document = stored.resource.to_document()["spec"]
    assert document["limits"]["max_messages"] == 100 and "max_hops" not in document["limits"]


async def test_an_unreachable_agent_is_refused_naming_its_node(store: Store) -> None:
    text = await refused(store, {"entry": "a", "graph": {"a": {"next": ["b"]}, "c": {}}})
    assert "system.yaml" in text and "'spec.graph.c'" in text
    assert "cannot be reached from the entry 'a'" in text


async def test_a_cycle_without_max_hops_is_refused_naming_the_limit(store: Store) -> None:
    text = await refused(
        store, {"entry": "a", "graph": {"a": {"next": ["b"]}, "b": {"next": ["a"]}}, "output": "b"}
    )
    assert "'spec.limits.max_hops'" in text and "cycle" in text


async def test_a_join_with_one_input_is_refused_naming_the_join(store: Store) -> None:
    text = await refused(
        store, {"entry": "a", "graph": {"a": {"next": ["b"]}, "b": {"join": "all"}}}
    )
    assert "'spec.graph.b.join'" in text and "at least two inputs" in text


async def test_several_inputs_without_a_join_are_refused(store: Store) -> None:
    text = await refused(
        store,
        {"entry": "a", "graph": {"a": {"next": ["b", "c"]}, "b": {"next": ["c"]}}},
    )
    assert "'spec.graph'" in text and "several inputs" in text


async def test_route_by_output_needs_an_output_schema(store: Store) -> None:
    text = await refused(
        store,
        {"entry": "a", "graph": {"a": {"next": ["b", "c"], "route": "by_output"}}, "output": "b"},
    )
    assert "'spec.graph.a.route'" in text and "output_schema" in text
    # with one it is accepted
    spec = {"entry": "typed", "graph": {"typed": {"next": ["b", "c"], "route": "by_output"}}}
    await store.apply(load_text(system_doc({**spec, "output": "b"}), "system.yaml"))


async def test_an_unknown_agent_is_a_missing_reference(store: Store) -> None:
    text = await refused(store, {"entry": "ghost", "graph": {}})
    assert "'spec.entry'" in text and "Agent 'ghost' not found" in text


async def test_no_single_sink_needs_an_output(store: Store) -> None:
    text = await refused(store, {"entry": "a", "graph": {"a": {"next": ["b", "c"]}}})
    assert "'spec.output'" in text
    text = await refused(store, {"entry": "a", "graph": {}, "output": "b"})
    assert "'spec.output'" in text and "not a node" in text


async def test_a_ten_thousand_node_graph_is_refused_cleanly(store: Store) -> None:
    graph = {f"n{i}": {"next": [f"n{i + 1}"]} for i in range(10_000)}
    text = await refused(store, {"entry": "n0", "graph": graph})
    assert "'spec.graph'" in text and f"at most {MAX_SYSTEM_NODES}" in text


async def test_a_deeply_nested_graph_stops_at_the_parsing_limit(store: Store) -> None:
    nested = "{x: " * 5000 + "1" + "}" * 5000
    with pytest.raises(DocumentTooComplexError):
        load_text(
            "apiVersion: corral/v1\nkind: AgentSystem\nmetadata: {name: s}\n"
            f"spec:\n  entry: a\n  graph:\n    a: {{next: [b]}}\n    b: {nested}\n",
            "deep.yaml",
        )


async def test_unicode_and_malformed_names_are_refused_naming_the_field(store: Store) -> None:
    text = await refused(store, {"entry": "a", "graph": {"a": {"next": ["研究者"]}}})
    assert "'spec.graph.a.next[0]'" in text
    text = await refused(store, {"entry": "a", "graph": {"a": {"next": ["b"]}, "Ωmega": {}}})
    assert "Ωmega" in text


async def test_limits_out_of_range_are_refused(store: Store) -> None:
    spec = {"entry": "a", "graph": {}, "limits": {"max_hops": 0, "max_messages": 10**9}}
    text = await refused(store, spec)
    assert "'spec.limits.max_hops'" in text and "'spec.limits.max_messages'" in text
