"""Labels on runs in every store backend of ``store_url`` (the SQLite fast path, SQLite
through SQLAlchemy, PostgreSQL): stored with the run, read back as given, and selected
in the query by a JSON path that both dialects compile from one statement."""

from __future__ import annotations

import pytest

from corral.core.runs import RunRecord, RunState
from corral.core.selectors import InvalidSelectorError, parse_selector
from corral.store import Store
from test_store import cipher_fixture, store_fixture, store_url_fixture

__all__ = ["cipher_fixture", "store_fixture", "store_url_fixture"]

RUNS = {
    "run_a": {"team": "ml", "équipe": "café", "env": "prod"},
    "run_b": {"team": "web", "env": "prod", "app.example.com/name": "v1.2-b_3"},
    "run_c": {"team": "ml"},
    "run_d": {},
    "run_e": {"世界": "こんにちは", "k": ""},
}


async def _runs(store: Store) -> None:
    for index, (run_id, labels) in enumerate(RUNS.items()):
        record = RunRecord(id=run_id, namespace="default", agent="a", input="hi", labels=labels)
        record.created_at = 1000.0 + index
        await store.submit_run(record)
    await store.submit_run(
        RunRecord(id="run_x", namespace="other", agent="a", input="hi", labels={"team": "ml"})
    )


async def _picked(store: Store, selector: str, **options: object) -> list[str]:
    found = await store.list_runs("default", selector=parse_selector(selector), **options)  # type: ignore[arg-type]
    return sorted(r.id for r in found)


async def test_labels_are_stored_with_a_run_and_read_back_as_given(store: Store) -> None:
    await _runs(store)
    for run_id, labels in RUNS.items():
        found = await store.get_run(run_id)
        assert found is not None and found.labels == labels
    # a save of the record (a worker's) keeps them
    record = await store.get_run("run_a")
    assert record is not None
    record.state = RunState.SUCCEEDED
    await store.save_run(record)
    again = await store.get_run("run_a")
    assert again is not None and again.labels == RUNS["run_a"]


async def test_a_selector_picks_runs_by_their_labels_in_the_query(store: Store) -> None:
    await _runs(store)
    assert await _picked(store, "team=ml") == ["run_a", "run_c"]
    assert await _picked(store, "team==ml,env=prod") == ["run_a"]
    assert await _picked(store, "team!=ml") == ["run_b", "run_d", "run_e"]  # absent counts
    assert await _picked(store, "env") == ["run_a", "run_b"]
    assert await _picked(store, "!env") == ["run_c", "run_d", "run_e"]
    assert await _picked(store, "équipe=café") == ["run_a"]
    assert await _picked(store, "世界=こんにちは") == ["run_e"]
    assert await _picked(store, "k=") == ["run_e"]  # an empty value is a value
    assert await _picked(store, "app.example.com/name=v1.2-b_3") == ["run_b"]
    assert await _picked(store, "app.example.com/name") == ["run_b"]
    assert await _picked(store, "team=nobody") == []
    # with the other filters and the limit, in the one query (newest first)
    assert await _picked(store, "team=ml", limit=1) == ["run_c"]
    assert await _picked(store, "env=prod", states=[RunState.QUEUED]) == ["run_a", "run_b"]
    assert await _picked(store, "env=prod", states=[RunState.RUNNING]) == []


async def test_keys_and_values_a_query_could_trip_on_are_selected_as_text(store: Store) -> None:
    hostile = {'te"am': "x'--", "$.k": "v", "a.b/c": "d e", "nom d'équipe": "café crème"}
    await store.submit_run(
        RunRecord(id="run_h", namespace="default", agent="a", input="hi", labels=hostile)
    )
    await _runs(store)
    for key, value in hostile.items():
        assert await _picked(store, f"{key}={value}") == ["run_h"]
        assert await _picked(store, key) == ["run_h"]
    assert await _picked(store, 'te"am=x') == []


@pytest.mark.parametrize(
    "selector", ["team=ml,", "=ml", "!", ",".join(f"k{i}=v" for i in range(21)), "k=" + "v" * 1025]
)
def test_a_malformed_selector_is_refused_before_any_query(selector: str) -> None:
    with pytest.raises(InvalidSelectorError):
        parse_selector(selector)
