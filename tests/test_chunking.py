"""The chunker (corral.core.chunking): boundaries, overlap, unicode, caps."""

from __future__ import annotations

import itertools
import unicodedata

import pytest

from corral.core.chunking import MAX_INGEST_CHARS, chunk_text
from corral.core.memory import MemoryInputError


def _words(text: str) -> set[str]:
    return set(text.split())


def test_empty_and_blank_texts_have_no_chunks() -> None:
    assert chunk_text("") == []
    assert chunk_text(" \n\n\t ") == []


def test_a_short_text_is_one_chunk_stripped() -> None:
    assert chunk_text("  Hello world.  \n", size=100, overlap=10) == ["Hello world."]


def test_cuts_at_paragraph_breaks_first() -> None:
    first = "Alpha beta gamma. Delta epsilon zeta."
    second = "Eta theta iota. Kappa lambda mu."
    text = f"{first}\n\n{second}"
    chunks = chunk_text(text, size=60, overlap=0)
    assert chunks == [first, second]


def test_cuts_at_sentence_ends_within_a_paragraph() -> None:
    sentences = [f"Sentence number {i} says something." for i in range(10)]
    text = " ".join(sentences)
    chunks = chunk_text(text, size=100, overlap=0)
    assert len(chunks) > 1
    for chunk in chunks:
        assert len(chunk) <= 100
        assert chunk.endswith(".")
        assert chunk.startswith("Sentence")
    assert " ".join(chunks) == text


def test_never_cuts_mid_word_and_every_word_survives() -> None:
    text = " ".join(f"word{i}" for i in range(500))  # no sentences, no paragraphs
    chunks = chunk_text(text, size=50, overlap=0)
    allowed = _words(text)
    for chunk in chunks:
        assert len(chunk) <= 50
        assert _words(chunk) <= allowed  # each token is a whole word
    assert " ".join(chunks) == text


def test_overlap_is_carried_from_chunk_to_chunk() -> None:
    text = " ".join(f"w{i:03d}" for i in range(300))
    chunks = chunk_text(text, size=100, overlap=30)
    assert len(chunks) > 3
    for before, after in itertools.pairwise(chunks):
        tail = before[-30:]
        # the next chunk starts within the last 30 characters, at a word start
        assert after.split()[0] in tail.split()
        assert after.startswith(tail[tail.index(after.split()[0]) :])
        assert len(after) <= 100
    assert _words(" ".join(chunks)) == _words(text)


def test_a_word_longer_than_the_size_is_cut_and_kept_whole_across_chunks() -> None:
    giant = "x" * 250
    chunks = chunk_text(f"start {giant} end", size=100, overlap=0)
    assert all(len(c) <= 100 for c in chunks)
    assert "".join(chunks).replace(" ", "") == f"start{giant}end"


def test_combining_characters_stay_with_their_base() -> None:
    # "e" + COMBINING ACUTE, repeated with no spaces: a giant word of decomposed letters
    text = "e\u0301" * 120
    chunks = chunk_text(text, size=101, overlap=0)
    for chunk in chunks:
        assert not unicodedata.category(chunk[0]).startswith("M")
        assert len(chunk) <= 101
    assert "".join(chunks) == text


def test_cjk_without_spaces_is_cut_after_punctuation_or_between_characters() -> None:
    sentence = "我们今天去公园散步了天气很好。"
    text = sentence * 20
    chunks = chunk_text(text, size=100, overlap=0)
    assert all(len(c) <= 100 for c in chunks)
    assert all(c.endswith("。") for c in chunks)
    assert "".join(chunks) == text
    plain = "漢字" * 200  # no punctuation at all
    parts = chunk_text(plain, size=100, overlap=10)
    assert all(len(p) <= 100 for p in parts)
    assert len(parts) > 4


def test_overlap_larger_than_half_still_makes_progress() -> None:
    text = " ".join(f"t{i}" for i in range(400))
    chunks = chunk_text(text, size=100, overlap=90)
    assert len(chunks) < len(text)  # no endless or degenerate chunking
    assert _words(" ".join(chunks)) == _words(text)


def test_bad_settings_and_huge_texts_are_clear_errors() -> None:
    with pytest.raises(MemoryInputError, match="overlap < size"):
        chunk_text("abc", size=10, overlap=10)
    with pytest.raises(MemoryInputError, match="at most") as caught:
        chunk_text("a" * (MAX_INGEST_CHARS + 1))
    assert caught.value.code == "invalid_memory_input"
