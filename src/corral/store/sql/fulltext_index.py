"""The words of Memory scopes, kept in this process as postings, and their BM25 ranking:
full-text search, the same on SQLite and PostgreSQL.

**Tokens.** An entry's tokens are the words :func:`~corral.core.memory.query_terms`
makes of a query: the text composed (NFC), its runs of letters and digits (``[^\\W_]+``),
each lower-cased (:func:`tokens`). An ASCII text's tokens are its runs of ASCII letters
and digits, lower-cased: all such texts are split at once by one translation and split
(:meth:`Postings.of`); other texts one at a time by the regular expression.

**Ranking.** BM25 over the scope's own statistics: ``N`` its entries, ``avgdl`` their
mean length in tokens, ``n`` how many of them hold the word; a word's share of an entry
of length ``dl`` holding it ``f`` times is ``idf * f * (k1 + 1) / (f + k1 * (1 - b + b
* dl / avgdl))`` with ``idf = ln(1 + (N - n + 0.5) / (n + 0.5))`` (always positive, as
Lucene's), ``k1 = 1.2``, ``b = 0.75``. The shares are added in the query's order; ties
go to the entry written last, then the lower id. Every figure is computed from integers
the scope's texts fix, one element at a time (numpy rounds each operation as C does),
so an index built whole and one brought up to date give the same doubles, in any
process.

**Upkeep.** An index is kept as the scope's vectors are
(:mod:`corral.store.sql.vector_cache`): filed under the scope's generation
(``memory_generations``), read before the texts so an index is never filed under a
generation newer than its contents, and brought up to date from the scope's noted
changes (``memory_changes``) by :meth:`TextIndex.updated_to`: the rows of the changed
entries are marked dead, their texts now appended as new rows whose postings live in a
small second part (``delta``, copied per update, never the scope's whole postings).
When dead and appended rows pass a quarter of the index, the scope is read whole
again. :class:`TextIndexCache` bounds the indexes by bytes, least recently used dropped
first; a scope whose index would not fit is indexed for each search and not kept.
"""

from __future__ import annotations

import math
import re
import sys
import unicodedata
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from corral.store.sql.scope_cache import ScopeCache

#: (namespace, memory, scope key)
Key = tuple[str, str, str]
#: the id of a row whose entry changed after the row was read
DEAD = -1
#: BM25's constants
K1 = 1.2
B = 0.75
#: what one distinct word costs in the vocabulary beyond its characters (dict slot, str)
_WORD_BYTES = 100

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Counts = npt.NDArray[np.int32]

#: a token: a run of letters and digits (the words of query_terms)
_WORD = re.compile(r"[^\W_]+")
# every byte but ASCII letters and digits (upper case lowered) made a space; NUL kept (it
# parts the texts split together) and bytes past ASCII kept (the UTF-8 of tokens split
# before, joined by spaces)
_FOLD = bytes(
    n + 32 if 65 <= n <= 90 else n if n == 0 or n >= 128 or chr(n).isalnum() else 32
    for n in range(256)
)
_PART = b"\x00"


def tokens(text: str) -> list[str]:
    """The tokens of ``text``, in order: its words as :func:`query_terms` reads a query."""
    return [word.lower() for word in _WORD.findall(unicodedata.normalize("NFC", text))]


def _splittable(text: str) -> bytes:
    """``text`` as bytes whose :data:`_FOLD` translation split on whitespace gives its
    tokens: an ASCII text as it is, any other as its tokens joined by spaces."""
    if text.isascii() and "\x00" not in text:
        return text.encode("ascii")
    return " ".join(tokens(text)).encode("utf-8")


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
        """The postings of ``texts`` (``rows[i]`` is the row of ``texts[i]``) and each
        text's length in tokens. The texts are folded and split in one pass and counted
        with numpy: no Python work per token but a dict lookup."""
        if not texts:
            return _EMPTY, np.zeros(0, dtype=np.int64)
        joined = (b" " + _PART + b" ").join(map(_splittable, texts))
        split = joined.translate(_FOLD).split()
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
        words = {token.decode("utf-8"): n - 1 for token, n in numbers_of.items() if n}
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
    rows appended by updates (``delta``: word -> rows, counts); ``tokens`` the total
    length of the live rows."""

    generation: int
    ids: Ints
    updated: Floats
    lengths: Floats
    base: Postings
    delta: dict[str, tuple[Counts, Counts]]
    dead: int
    appended: int
    tokens: int
    nbytes: int
    _norms: list[Floats] = field(default_factory=list, compare=False, repr=False)

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
            int(lengths.sum()),
            base.nbytes + 24 * len(entries),
        )

    @property
    def live(self) -> int:
        """How many entries the scope holds: its rows not dead."""
        return len(self.ids) - self.dead

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
            self.tokens - int(self.lengths[stale].sum()) + int(lengths.sum()),
            self.nbytes + added + 24 * len(fresh),
        )

    def postings(self, word: str) -> list[tuple[Counts, Counts]]:
        """The live rows holding ``word`` and how often, in the base then the delta."""
        found: list[tuple[Counts, Counts]] = []
        for part in (self.base.get(word), self.delta.get(word)):
            if part is None or not len(part[0]):
                continue
            rows, counts = part
            if self.dead:
                alive = self.ids[rows] != DEAD
                rows, counts = rows[alive], counts[alive]
            if len(rows):
                found.append((rows, counts))
        return found

    def norms(self) -> Floats:
        """Each row's ``k1 * (1 - b + b * dl / avgdl)``: what BM25 adds to a count."""
        if not self._norms:  # a race computes the same array twice: either is kept
            average = float(self.tokens) / float(max(1, self.live))
            self._norms.append(K1 * (1.0 - B + B * self.lengths / average))
        return self._norms[0]

    def scores(self, words: list[str]) -> tuple[Floats, Ints]:
        """Each row's BM25 for a query of ``words`` (in the query's order, each once), and
        the rows holding any of them."""
        scores = np.zeros(len(self.ids), dtype=np.float64)
        matched = np.zeros(len(self.ids), dtype=np.bool_)
        live = float(self.live)
        for word in words:
            found = self.postings(word)
            holding = sum(len(rows) for rows, _ in found)
            if not holding:
                continue
            idf = math.log(1.0 + (live - holding + 0.5) / (holding + 0.5))
            norms = self.norms()
            for rows, counts in found:
                f = counts.astype(np.float64)
                scores[rows] += idf * (f * (K1 + 1.0)) / (f + norms[rows])
                matched[rows] = True
        return scores, np.flatnonzero(matched)

    def best(self, scores: Floats, candidates: Ints, limit: int) -> Ints:
        """The first ``limit`` rows of ``candidates`` in the ranking's order: score, then
        the entry written last, then id (every row tying the ``limit``-th score sorted)."""
        if limit < len(candidates):
            among = scores[candidates]
            cut = np.partition(among, len(among) - limit)[len(among) - limit]
            candidates = candidates[among >= cut]
        order = np.lexsort((self.ids[candidates], -self.updated[candidates], -scores[candidates]))
        return candidates[order[:limit]]


_NO_ROWS: Counts = np.zeros(0, dtype=np.int32)
#: what one word of the delta costs beyond its characters and postings: a vocabulary
#: word's, and its pair of arrays (an object each) in a tuple
_DELTA_WORD_BYTES = _WORD_BYTES + 2 * sys.getsizeof(_NO_ROWS) + sys.getsizeof((_NO_ROWS, _NO_ROWS))


def _parts(entries: list[tuple[int, str, float]], first: int) -> tuple[Postings, Floats]:
    """The postings of ``entries`` as rows ``first`` and up, and each row's length."""
    rows = np.arange(first, first + len(entries), dtype=np.int64)
    postings, lengths = Postings.of([e[1] for e in entries], rows)
    return postings, lengths.astype(np.float64)


class TextIndexCache(ScopeCache[Key, TextIndex]):
    """Indexes by key (:class:`~corral.store.sql.scope_cache.ScopeCache`)."""
