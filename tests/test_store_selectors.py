"""Label selectors, listings across namespaces and dry runs in the store, on every backend
(the ``store`` fixture of ``test_store``: SQLite both paths, PostgreSQL)."""

from __future__ import annotations

import pytest

from corral.core.selectors import InvalidSelectorError, parse_selector
from corral.resources.loader import load_text
from corral.store import ApplyAction, Store
from test_store import cipher_fixture, keys, store_fixture, store_url_fixture  # noqa: F401


def labelled(name: str, labels: str, namespace: str = "default") -> str:
    return (
        f"apiVersion: corral/v1\nkind: ModelEndpoint\n"
        f"metadata: {{name: {name}, namespace: {namespace}, labels: {labels}}}\n"
        "spec: {provider: scripted, script: [{text: hi}]}\n"
    )


DOCS = "---\n".join(
    [
        labelled("a", "{team: web, tier: front}"),
        labelled("b", "{team: db}"),
        labelled("c", "{}"),
        # keys a JSON path cannot name, and unicode
        labelled("d", '{"équipe": "café", "a.b": "x", "q\\"uote": "1", "empty": ""}'),
    ]
)


def names(items: list[object]) -> list[str]:
    return [item.resource.name for item in items]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("team=web", ["a"]),
        ("team==web", ["a"]),
        ("team!=web", ["b", "c", "d"]),  # absent counts as "not web", as in kubectl
        ("team", ["a", "b"]),
        ("!team", ["c", "d"]),
        ("team=web,tier=front", ["a"]),
        ("team=web,tier!=front", []),
        ("équipe=café", ["d"]),
        ("a.b=x", ["d"]),
        ('q"uote=1', ["d"]),
        ("empty=", ["d"]),
        ("empty", ["d"]),
        ("team=nobody", []),
    ],
)
async def test_a_label_selector_filters_in_the_store(
    store: Store, selector: str, expected: list[str]
) -> None:
    await store.apply(load_text(DOCS))
    found = await store.list_resources(
        "default", "ModelEndpoint", selector=parse_selector(selector)
    )
    assert names(found) == expected
    # the store's answer is what the selector says of each resource's labels
    every = await store.list_resources("default")
    chosen = parse_selector(selector)
    assert names([r for r in every if chosen.matches(r.resource.metadata.labels)]) == expected


async def test_selected_pages_follow_the_keyset(store: Store) -> None:
    await store.apply(load_text(DOCS))
    selector = parse_selector("!tier")
    first = await store.list_resources("default", selector=selector, limit=2)
    assert names(first) == ["b", "c"]
    rest = await store.list_resources(
        "default", selector=selector, after=("ModelEndpoint", "c"), limit=2
    )
    assert names(rest) == ["d"]


async def test_every_namespace_is_listed_by_namespace_kind_and_name(store: Store) -> None:
    await store.apply(load_text(labelled("x", "{team: web}", "zeta")))
    await store.apply(load_text(labelled("y", "{team: db}", "alpha")))
    await store.apply(load_text(labelled("z", "{team: web}", "alpha")))
    assert keys(await store.list_resources(None)) == [
        ("alpha", "ModelEndpoint", "y"),
        ("alpha", "ModelEndpoint", "z"),
        ("zeta", "ModelEndpoint", "x"),
    ]
    web = await store.list_resources(None, selector=parse_selector("team=web"))
    assert keys(web) == [("alpha", "ModelEndpoint", "z"), ("zeta", "ModelEndpoint", "x")]
    page = await store.list_resources(None, after=("alpha", "ModelEndpoint", "z"))
    assert keys(page) == [("zeta", "ModelEndpoint", "x")]


async def test_a_dry_run_apply_says_what_would_happen_and_writes_nothing(store: Store) -> None:
    base = labelled("a", "{team: web}")
    planned = await store.apply(load_text(base), dry_run=True)
    assert [(o.action, o.generation) for o in planned] == [(ApplyAction.CREATED, 1)]
    assert await store.list_resources("default") == []
    await store.apply(load_text(base))
    before = await store.list_resources("default")
    changed = base.replace("team: web", "team: db")
    for text, action, generation in [
        (base, ApplyAction.UNCHANGED, 1),
        (changed, ApplyAction.CONFIGURED, 2),
    ]:
        [outcome] = await store.apply(load_text(text), dry_run=True)
        assert (outcome.action, outcome.generation) == (action, generation)
    assert await store.list_resources("default") == before


async def test_a_dry_run_apply_checks_references(store: Store) -> None:
    from corral.core.errors import ResourceError

    agent = "apiVersion: corral/v1\nkind: Agent\nmetadata: {name: x}\nspec: {model: missing}\n"
    with pytest.raises(ResourceError, match="ModelEndpoint 'missing' not found"):
        await store.apply(load_text(agent), dry_run=True)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty label selector"),
        ("=web", "empty key"),
        ("team=a=b", "contains '='"),
        ("team,,tier", "empty key"),
        ("!", "empty key"),
        ("team!", "contains '!'"),
        ("te\x00am", "control character"),
        ("x" * 2000, "too long"),
        (",".join(f"k{i}" for i in range(30)), "at most 20"),
        ("team=\ud800", "not valid Unicode"),
    ],
)
def test_a_malformed_selector_is_refused_with_a_reason(text: str, reason: str) -> None:
    with pytest.raises(InvalidSelectorError, match=reason):
        parse_selector(text)
