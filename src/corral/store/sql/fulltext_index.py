"""The words of Memory scopes, kept in this process as postings for full-text search on
SQLite (:mod:`corral.store.sql.fulltext_sqlite` scores them with FTS5's BM25).

A :class:`TextIndex` holds one scope's entries as rows: each row's entry id, when it
was written (``updated_at``: the ranking's tie-break) and its length in tokens, and per
word the rows holding it with how often (numpy arrays). FTS5's ``unicode61`` tokenizer
reads one code point at a time - a letter or digit (folded to lower case) or a
separator; a combining mark continues a token but starts none - so the tokens of an ASCII text are its runs of ASCII letters and digits,
lower-cased, and those of other texts follow from what FTS5 makes of each code point:
a process learns that once from FTS5 itself for the alphabets most texts use
(:data:`LEARNED`), and tokenizes all such texts at once by one translation and split.
A text holding any other code point is tokenized by FTS5 (:func:`fts5_tokens`, an
in-memory table of the same tokenizer read through ``fts5vocab``: slower). Only ASCII
words are looked up (a query word that is not ASCII is never answered from the index):
other tokens are kept as stand-ins (\x01 for each letter not ASCII, by the table) or
not at all (by FTS5), but every token counts in an entry's length.

It is kept as the scope's vectors are (:mod:`corral.store.sql.vector_cache`): filed
under the scope's generation (``memory_generations``), read before the texts so an
index is never filed under a generation newer than its contents, and brought up to date
from the scope's noted changes (``memory_changes``) by :meth:`TextIndex.updated_to`: the
rows of the changed entries are marked dead, their texts now appended as new rows whose
postings live in a small second part (``delta``, copied per update, never the scope's
whole postings). When dead and appended rows pass a quarter of the index, the scope is
read whole again. :class:`TextIndexCache` bounds the indexes by bytes, least recently
used dropped first; a scope whose index would not fit is searched without one.
"""

from __future__ import annotations

import functools
import sqlite3
import sys
from contextlib import closing
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from corral.store.sql.scope_cache import ScopeCache

#: (namespace, memory, scope key)
Key = tuple[str, str, str]
#: the id of a row whose entry changed after the row was read
DEAD = -1
#: what one distinct word costs in the vocabulary beyond its characters (dict slot, str)
_WORD_BYTES = 100
#: ``memory_fts``'s tokenizer (migration 0008)
TOKENIZER = "unicode61 remove_diacritics 0"

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Counts = npt.NDArray[np.int32]


# every byte but ASCII letters and digits (upper case lowered) made a space; NUL kept:
# it parts the texts tokenized together; \x01 kept: it stands for a letter not ASCII
_FOLD = bytes(
    n + 32 if 65 <= n <= 90 else n if n < 2 or (n < 128 and chr(n).isalnum()) else 32
    for n in range(256)
)
_PART = b"\x00"
_OTHER = "\x01"
#: the code points past ASCII whose tokenization a process learns from FTS5 (once):
#: Latin, Greek, Cyrillic, Hebrew, Arabic; typographic punctuation; currency signs
LEARNED = (range(0x80, 0x800), range(0x2000, 0x2070), range(0x20A0, 0x20D0))


@functools.cache
def learned() -> dict[int, str]:
    """``str.translate``'s table of the :data:`LEARNED` code points as FTS5 tokenizes
    each: a separator made a space, a letter or digit made its fold if that is ASCII,
    else :data:`_OTHER`; and ASCII's \x01 (a separator) a space. Each is asked of FTS5
    alone and between two letters: one that is read otherwise in one place than in the
    other (a combining mark continues a token but starts none) is not learned."""
    points = [point for part in LEARNED for point in part]
    table = {1: " "}
    terms: dict[int, list[str]] = {}
    with closing(sqlite3.connect(":memory:")) as db:
        db.execute(f"CREATE VIRTUAL TABLE t USING fts5(x, tokenize='{TOKENIZER}')")
        db.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
        texts = [(2 * p + n, f"a{chr(p)}a" if n else chr(p)) for p in points for n in (0, 1)]
        db.executemany("INSERT INTO t(rowid, x) VALUES (?, ?)", texts)
        for doc, term in db.execute("SELECT doc, term FROM v"):
            terms.setdefault(doc, []).append(term)
    for point in points:
        alone, between = terms.get(2 * point, []), terms.get(2 * point + 1, [])
        if not alone and between == ["a", "a"]:
            table[point] = " "
        elif len(alone) == 1 and len(alone[0]) == 1 and between == [f"a{alone[0]}a"]:
            fold = alone[0]
            if not fold.isascii():
                table[point] = _OTHER
            elif fold.isalnum():
                table[point] = fold
    return table  # a code point otherwise tokenized is not learned: its texts go to FTS5


def ascii_form(text: str) -> str | None:
    """``text`` as an ASCII text of the same tokens at the same places (each letter or
    digit that is not ASCII made \x01), or ``None`` when it holds a code point not
    learned (or NUL): FTS5 tokenizes it then (:func:`fts5_tokens`)."""
    if "\x00" in text:
        return None
    if text.isascii() and _OTHER not in text:
        return text
    form = text.translate(learned())
    return form if form.isascii() else None


def index_tokens(text: str) -> list[str] | None:
    """The tokens the index makes of ``text`` (those not ASCII holding \x01), or
    ``None`` if FTS5 tokenizes it (as :meth:`Postings.of` splits them)."""
    form = ascii_form(text)
    if form is None:
        return None
    return [token.decode() for token in form.encode("ascii").translate(_FOLD).split()]


@dataclass(frozen=True)
class Postings:
    """Per word (``words``: word -> number), the rows holding it and how often: the rows
    of word ``n`` are ``rows[starts[n]:starts[n + 1]]``, with ``counts`` alike."""

    words: dict[str, int]
    starts: Ints
    rows: Counts
    counts: Counts

    @staticmethod
    def of(texts: list[str], rows: Ints) -> tuple[Postings, Ints]:
        """The postings of ``texts`` (each an :func:`ascii_form`; ``rows[i]`` is the row of
        ``texts[i]``) and each text's length in tokens. The texts are folded and split
        in one pass and counted with numpy: no Python work per token but a dict lookup."""
        if not texts:
            return _EMPTY, np.zeros(0, dtype=np.int64)
        tokens = (b" " + _PART + b" ").join(t.encode("ascii") for t in texts).translate(_FOLD)
        split = tokens.split()
        numbers_of = {_PART: 0}
        numbers_of.update(dict.fromkeys(split, 0))
        for n, token in enumerate(numbers_of):
            numbers_of[token] = n  # the parting token is 0, words 1 and up
        numbers = np.fromiter(map(numbers_of.__getitem__, split), np.int32, len(split))
        parts = numbers == 0
        docs = np.cumsum(parts)[~parts]
        numbers = numbers[~parts] - 1
        lengths = np.bincount(docs, minlength=len(texts)).astype(np.int64)
        kinds = len(numbers_of) - 1
        # stable: each word's rows stay ascending (a radix sort for up to 65,536 words)
        keys = numbers.astype(np.uint16) if kinds <= 1 << 16 else numbers
        order = np.argsort(keys, kind="stable")
        numbers, docs = numbers[order], docs[order]
        first = np.ones(len(numbers), dtype=np.bool_)  # first of a (word, text) run
        first[1:] = (numbers[1:] != numbers[:-1]) | (docs[1:] != docs[:-1])
        at = np.flatnonzero(first)
        counts = np.diff(np.append(at, len(numbers))).astype(np.int32)
        starts = np.zeros(kinds + 1, dtype=np.int64)
        np.cumsum(np.bincount(numbers[at], minlength=kinds), out=starts[1:])
        words = {token.decode(): n - 1 for token, n in numbers_of.items() if n}
        return Postings(words, starts, rows[docs[at]].astype(np.int32), counts), lengths

    def get(self, word: str) -> tuple[Counts, Counts] | None:
        n = self.words.get(word)
        if n is None:
            return None
        start, end = int(self.starts[n]), int(self.starts[n + 1])
        return self.rows[start:end], self.counts[start:end]

    @property
    def nbytes(self) -> int:
        vocabulary = sum(len(word) + _WORD_BYTES for word in self.words)
        return int(vocabulary + self.starts.nbytes + self.rows.nbytes + self.counts.nbytes)


_EMPTY = Postings({}, np.zeros(1, dtype=np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32))


@dataclass(frozen=True)
class TextIndex:
    """One scope's entries as rows (``ids``: :data:`DEAD` for a row whose entry changed
    since), as of ``generation``: postings of the rows read whole (``base``) and of the
    rows appended by updates (``delta``: word -> rows, counts)."""

    generation: int
    ids: Ints
    updated: Floats
    lengths: Floats
    base: Postings
    delta: dict[str, tuple[Counts, Counts]]
    dead: int
    appended: int
    nbytes: int

    @staticmethod
    def of(generation: int, entries: list[tuple[int, str, float]]) -> TextIndex:
        """The index of ``entries`` (id, text, updated_at), read whole."""
        base, lengths = _parts(entries, 0)
        return TextIndex(
            generation,
            np.asarray([e[0] for e in entries], dtype=np.int64),
            np.asarray([e[2] for e in entries], dtype=np.float64),
            lengths,
            base,
            {},
            0,
            0,
            base.nbytes + 24 * len(entries),
        )

    def updated_to(
        self, generation: int, changed: Ints, fresh: list[tuple[int, str, float]]
    ) -> TextIndex | None:
        """This index at ``generation``: the rows of the ``changed`` entries dead, and the
        ``fresh`` ones (id, text, updated_at: the changed entries still in the scope)
        appended; ``None`` when a quarter of the rows would be dead or appended (the
        scope is then read whole)."""
        stale = np.isin(self.ids, changed)
        dead = self.dead + int(stale.sum())
        appended = self.appended + len(fresh)
        if dead + appended > max(64, (len(self.ids) - dead) // 4):
            return None
        new, lengths = _parts(fresh, len(self.ids))
        delta = dict(self.delta)
        added = 0
        for word, n in new.words.items():
            start, end = int(new.starts[n]), int(new.starts[n + 1])
            before = delta.get(word, (_NO_ROWS, _NO_ROWS))
            added += 8 * (end - start) + (0 if word in delta else len(word) + _DELTA_WORD_BYTES)
            delta[word] = (
                np.concatenate([before[0], new.rows[start:end]]),
                np.concatenate([before[1], new.counts[start:end]]),
            )
        return TextIndex(
            generation,
            np.concatenate(
                [np.where(stale, DEAD, self.ids), np.asarray([f[0] for f in fresh], np.int64)]
            ),
            np.concatenate([self.updated, np.asarray([f[2] for f in fresh], np.float64)]),
            np.concatenate([self.lengths, lengths]),
            self.base,
            delta,
            dead,
            appended,
            self.nbytes + added + 24 * len(fresh),
        )

    def postings(self, word: str) -> list[tuple[Counts, Counts]]:
        """The rows holding ``word`` and how often, in the base then the delta."""
        found = [self.base.get(word), self.delta.get(word)]
        return [part for part in found if part is not None and len(part[0])]


_NO_ROWS: Counts = np.zeros(0, dtype=np.int32)
#: what one word of the delta costs beyond its characters and postings: a vocabulary
#: word's, and its pair of arrays (an object each) in a tuple
_DELTA_WORD_BYTES = _WORD_BYTES + 2 * sys.getsizeof(_NO_ROWS) + sys.getsizeof((_NO_ROWS, _NO_ROWS))


def _parts(entries: list[tuple[int, str, float]], first: int) -> tuple[Postings, Floats]:
    """The postings of ``entries`` as rows ``first`` and up, and each row's length in
    tokens: texts of learned code points split here (:func:`ascii_form`), the others by
    FTS5 (their ASCII tokens, as one ASCII text each, and their length as FTS5 counts)."""
    texts = [e[1] for e in entries]
    others: list[int] = []
    for n, text in enumerate(texts):
        form = ascii_form(text)
        if form is None:
            others.append(n)
        else:
            texts[n] = form
    counted: dict[int, int] = {}
    for n, (words, length) in zip(others, fts5_tokens([texts[n] for n in others]), strict=True):
        texts[n] = words
        counted[n] = length
    rows = np.arange(first, first + len(entries), dtype=np.int64)
    postings, lengths = Postings.of(texts, rows)
    for n, length in counted.items():
        lengths[n] = length
    return postings, lengths.astype(np.float64)


def fts5_tokens(texts: list[str]) -> list[tuple[str, int]]:
    """The ASCII tokens FTS5's tokenizer (:data:`TOKENIZER`) makes of each of ``texts``
    (one ASCII text, in no order) and how many tokens it makes in all: from an in-memory
    FTS5 table of this process's SQLite, the library the store's connections use."""
    if not texts:
        return []
    found = [("", 0)] * len(texts)
    with closing(sqlite3.connect(":memory:")) as db:
        db.execute(f"CREATE VIRTUAL TABLE t USING fts5(x, tokenize='{TOKENIZER}')")
        db.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
        db.executemany("INSERT INTO t(rowid, x) VALUES (?, ?)", enumerate(texts))
        # one row per text: its ASCII tokens joined (group_concat skips the NULLs)
        ascii_only = "CASE WHEN term GLOB '*[^a-z0-9]*' THEN NULL ELSE term END"
        statement = f"SELECT doc, group_concat({ascii_only}, ' '), count(*) FROM v GROUP BY doc"
        for doc, words, length in db.execute(statement):
            found[doc] = (words or "", length)
    return found


class TextIndexCache(ScopeCache[Key, TextIndex]):
    """Indexes by key (:class:`~corral.store.sql.scope_cache.ScopeCache`). A scope too
    large to keep is remembered with its generation (``too_large``), so it is not read
    whole search after search: it is tried again once it has changed much."""
