"""Property-based tests of Corral's hand-written algorithms, each against its stated
invariant: label selectors, the JSON depth scan, chunking, the SSE format and its parser,
keyset pages, and the int8 first pass of the vector scan."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.api import EventOut
from corral.client.wire import SseParser
from corral.core.chunking import chunk_text
from corral.core.events import Event, TextDeltaData, ToolResultData
from corral.core.limits import json_too_deep_at
from corral.core.selectors import Op, Requirement, Selector, parse_selector
from corral.server.sse import format_event
from corral.store.sql import keyset, vector_scan

PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --------------------------------------------------------------------------- selectors

# a key or value: printable text without the selector's own characters, not blank at its ends
_words = st.text(
    st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp"), blacklist_characters=",=!"),
    min_size=1,
    max_size=12,
).filter(str.isprintable)
_requirements = st.builds(
    Requirement,
    _words,
    st.sampled_from(list(Op)),
    _words,
).map(lambda r: r if r.op in (Op.EQUALS, Op.NOT_EQUALS) else Requirement(r.key, r.op))


@PROPERTY
@given(st.lists(_requirements, min_size=1, max_size=8))
def test_a_selector_parses_back_from_its_text(requirements: list[Requirement]) -> None:
    selector = Selector(tuple(requirements))
    assert parse_selector(str(selector)) == selector


@PROPERTY
@given(
    st.lists(_requirements, min_size=1, max_size=6),
    st.dictionaries(_words, _words, max_size=6),
)
def test_a_selector_matches_exactly_the_labels_meeting_every_requirement(
    requirements: list[Requirement], labels: dict[str, str]
) -> None:
    def holds(r: Requirement) -> bool:
        if r.op is Op.EQUALS:
            return r.key in labels and labels[r.key] == r.value
        if r.op is Op.NOT_EQUALS:
            return r.key not in labels or labels[r.key] != r.value
        return (r.key in labels) == (r.op is Op.EXISTS)

    selector = parse_selector(str(Selector(tuple(requirements))))
    assert selector.matches(labels) == all(holds(r) for r in requirements)


# --------------------------------------------------------------------------- JSON depth

# strings full of what a depth scan could mistake for structure
_tricky = st.text(st.sampled_from(list('[]{}"\\ ,:ab\n')), max_size=8)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | _tricky,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_tricky, inner, max_size=3),
    max_leaves=30,
)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@PROPERTY
@given(_json, st.integers(min_value=0, max_value=8))
def test_the_depth_scan_agrees_with_the_parsed_documents_depth(value: Any, limit: int) -> None:
    text = json.dumps(value)
    assert (json_too_deep_at(text, limit) is None) == (_depth(value) <= limit)
    assert json.loads(text) == value


# --------------------------------------------------------------------------- chunking

_text_words = st.lists(
    st.text(st.characters(whitelist_categories=("Ll", "Lu", "Nd")), min_size=1, max_size=9),
    min_size=0,
    max_size=80,
)


@PROPERTY
@given(
    _text_words,
    st.lists(st.sampled_from([" ", "\n", "  ", "\n\n", "\t"]), min_size=80, max_size=80),
    st.integers(min_value=10, max_value=200),
    st.data(),
)
def test_chunks_are_bounded_ordered_word_aligned_and_cover_every_word(
    words: list[str], gaps: list[str], size: int, data: st.DataObject
) -> None:
    overlap = data.draw(st.integers(min_value=0, max_value=size - 1))
    text = "".join(w + g for w, g in zip(words, gaps, strict=False))
    chunks = chunk_text(text, size=size, overlap=overlap)
    assert bool(chunks) == bool(text.strip())
    position = 0
    covered = ""
    for chunk in chunks:
        assert 0 < len(chunk) <= size and chunk == chunk.strip()
        start = text.find(chunk, position)
        assert start >= position, "chunks come in the text's order"
        assert start == 0 or text[start - 1].isspace(), "no chunk starts inside a word"
        position = start + 1
        covered += " " + chunk
    assert set(text.split()) <= set(covered.split())


# --------------------------------------------------------------------------- SSE

_events = st.builds(
    Event,
    st.just("run_1"),
    st.integers(min_value=1, max_value=10**9),
    st.one_of(
        st.builds(TextDeltaData, text=st.text(max_size=40)),
        st.builds(
            ToolResultData,
            step=st.integers(min_value=1, max_value=99),
            call_id=st.text(min_size=1, max_size=8),
            tool=st.text(min_size=1, max_size=8),
            output=st.text(max_size=40),
            error=st.none(),
        ),
    ),
    st.floats(min_value=0, max_value=4e9, allow_nan=False),
)


@PROPERTY
@given(st.lists(_events, min_size=1, max_size=5))
def test_events_survive_the_sse_format_and_its_parser(events: list[Event]) -> None:
    text = "retry: 1000\n" + "".join(format_event(e) for e in events) + ": keep-alive\n"
    parser = SseParser()
    messages = [m for line in text.split("\n") if (m := parser.feed(line)) is not None]
    assert parser.retry_seconds == 1.0
    assert [(m.event, m.id) for m in messages] == [(e.type.value, str(e.seq)) for e in events]
    for message, event in zip(messages, events, strict=True):
        assert EventOut.model_validate_json(message.data).payload() == event.data


# --------------------------------------------------------------------------- keyset pages


@PROPERTY
@given(
    st.sets(st.tuples(st.integers(0, 5), st.text(max_size=3)), max_size=40),
    st.integers(min_value=1, max_value=7),
    st.booleans(),
)
def test_keyset_pages_list_every_row_once_in_order(
    rows: set[tuple[int, str]], limit: int, descending: bool
) -> None:
    table = sa.Table("t", sa.MetaData(), sa.Column("a", sa.Integer), sa.Column("b", sa.String))
    engine = sa.create_engine("sqlite://")
    table.metadata.create_all(engine)
    columns = [table.c.a, table.c.b]
    seen: list[tuple[int, str]] = []
    with engine.begin() as conn:
        if rows:
            conn.execute(table.insert(), [{"a": a, "b": b} for a, b in rows])
        position = None
        while True:
            query = keyset.page(
                sa.select(table), columns, limit=limit, position=position, descending=descending
            )
            found = [(r.a, r.b) for r in conn.execute(query)]
            seen += found
            if len(found) < limit:
                break
            position = found[-1]
    assert seen == sorted(rows, reverse=descending)


# --------------------------------------------------------------------------- vectors


@pytest.mark.skipif(vector_scan.simsimd is None, reason="the int8 pass needs simsimd")
@PROPERTY
@given(
    st.integers(min_value=1, max_value=200),
    st.integers(min_value=1, max_value=64),
    st.integers(min_value=1, max_value=20),
    st.integers(min_value=0, max_value=2**31),
)
def test_the_int8_pass_keeps_every_row_of_the_exact_float32_top(
    count: int, width: int, limit: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((count, width)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    query = rng.standard_normal(width).astype(np.float32)
    query /= np.linalg.norm(query)
    limit = min(limit, count)
    rows = vector_scan.candidates(vector_scan.quantise(vectors), query, limit, None)
    exact = vector_scan.exact(vectors, query)
    top = vector_scan.best(np.arange(count, dtype=np.int64), exact, limit)
    if rows is not None:  # None: too many candidates, every row is scored exactly
        assert set(top.tolist()) <= set(rows.tolist())
