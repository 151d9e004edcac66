"""The words of Memory scopes, kept in this process as postings for full-text search on
SQLite (:mod:`corral.store.sql.fulltext_sqlite` scores them with FTS5's BM25).

A :class:`TextIndex` holds one scope's entries as rows: each row's entry id, when it
was written (``updated_at``: the ranking's tie-break) and its length in tokens, and per
word the rows holding it with how often (numpy arrays). The tokens of an ASCII text are
its runs of ASCII letters and digits, lower-cased: what FTS5's ``unicode61`` tokenizer
makes of it. An entry whose text is not ASCII gets a row with no postings, marked
``aside``: its score is asked of FTS5 itself.

It is kept as the scope's vectors are (:mod:`corral.store.sql.vector_cache`): filed
under the scope's generation (``memory_generations``), read before the texts so an
index is never filed under a generation newer than its contents, and brought up to date
from the scope's noted changes (``memory_changes``) by :meth:`TextIndex.updated`: the
rows of the changed entries are marked dead, their texts now appended as new rows whose
postings live in a small second part (``delta``, copied per update, never the scope's
whole postings). When dead and appended rows pass a quarter of the index, the scope is
read whole again. :class:`TextIndexCache` bounds the indexes by bytes, least recently
used dropped first; a scope whose index would not fit is searched without one.
"""

from __future__ import annotations

import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

#: (namespace, memory, scope key)
Key = tuple[str, str, str]
#: the id of a row whose entry changed after the row was read
DEAD = -1
#: what one distinct word costs in the vocabulary beyond its characters (dict slot, str)
_WORD_BYTES = 100
_ASCII_WORD = re.compile(r"[a-z0-9]+")

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Counts = npt.NDArray[np.int32]


def ascii_tokens(text: str) -> list[str] | None:
    """The tokens FTS5's ``unicode61`` makes of ``text`` if it is ASCII, else ``None``."""
    if not text.isascii():
        return None
    return _ASCII_WORD.findall(text.lower())


@dataclass(frozen=True)
class Postings:
    """Per word (``words``: word -> number), the rows holding it and how often: the rows
    of word ``n`` are ``rows[starts[n]:starts[n + 1]]``, with ``counts`` alike."""

    words: dict[str, int]
    starts: Ints
    rows: Counts
    counts: Counts

    @staticmethod
    def of(docs: Iterable[tuple[int, Counter[str]]]) -> Postings:
        """The postings of ``docs``: (row, how often each word is in it)."""
        words: dict[str, int] = {}
        numbers: list[int] = []
        rows: list[int] = []
        counts: list[int] = []
        for row, counted in docs:
            numbers.extend(words.setdefault(word, len(words)) for word in counted)
            rows.extend([row] * len(counted))
            counts.extend(counted.values())
        number = np.asarray(numbers, dtype=np.int32)
        order = np.argsort(number, kind="stable")  # rows stay ascending within a word
        starts = np.zeros(len(words) + 1, dtype=np.int64)
        np.cumsum(np.bincount(number, minlength=len(words)), out=starts[1:])
        return Postings(
            words,
            starts,
            np.asarray(rows, dtype=np.int32)[order],
            np.asarray(counts, dtype=np.int32)[order],
        )

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
    rows appended by updates (``delta``: word -> rows, counts), and the ``aside`` rows
    (texts that are not ASCII, scored by FTS5)."""

    generation: int
    ids: Ints
    updated: Floats
    lengths: Floats
    base: Postings
    delta: dict[str, tuple[Counts, Counts]]
    aside: Ints
    dead: int
    appended: int
    nbytes: int

    @staticmethod
    def of(generation: int, entries: Iterable[tuple[int, str, float]]) -> TextIndex:
        """The index of ``entries`` (id, text, updated_at), read whole."""
        ids: list[int] = []
        updated: list[float] = []
        lengths: list[int] = []
        aside: list[int] = []
        docs: list[tuple[int, Counter[str]]] = []
        for row, (entry_id, text, updated_at) in enumerate(entries):
            ids.append(entry_id)
            updated.append(updated_at)
            tokens = ascii_tokens(text)
            if tokens is None:
                aside.append(row)
                lengths.append(0)
            else:
                lengths.append(len(tokens))
                docs.append((row, Counter(tokens)))
        base = Postings.of(docs)
        arrays = (np.asarray(ids, np.int64), np.asarray(updated, np.float64))
        lengths_array = np.asarray(lengths, np.float64)
        nbytes = base.nbytes + 3 * 8 * len(ids) + 8 * len(aside)
        return TextIndex(
            generation, *arrays, lengths_array, base, {}, np.asarray(aside, np.int64), 0, 0, nbytes
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
        delta = dict(self.delta)
        lengths: list[int] = []
        aside: list[int] = []
        new: dict[str, tuple[list[int], list[int]]] = {}
        for row, (_, text, _) in enumerate(fresh, start=len(self.ids)):
            tokens = ascii_tokens(text)
            if tokens is None:
                aside.append(row)
                lengths.append(0)
                continue
            lengths.append(len(tokens))
            for word, count in Counter(tokens).items():
                rows, counts = new.setdefault(word, ([], []))
                rows.append(row)
                counts.append(count)
        added = 0
        for word, (rows, counts) in new.items():
            before = delta.get(word, (_NO_ROWS, _NO_ROWS))
            added += 8 * len(rows) + (0 if word in delta else len(word) + _WORD_BYTES)
            delta[word] = (
                np.concatenate([before[0], np.asarray(rows, np.int32)]),
                np.concatenate([before[1], np.asarray(counts, np.int32)]),
            )
        kept_aside = self.aside[~stale[self.aside]] if len(self.aside) else self.aside
        return TextIndex(
            generation,
            np.concatenate(
                [np.where(stale, DEAD, self.ids), np.asarray([f[0] for f in fresh], np.int64)]
            ),
            np.concatenate([self.updated, np.asarray([f[2] for f in fresh], np.float64)]),
            np.concatenate([self.lengths, np.asarray(lengths, np.float64)]),
            self.base,
            delta,
            np.concatenate([kept_aside, np.asarray(aside, np.int64)]),
            dead,
            appended,
            self.nbytes + added + 24 * len(fresh) + 8 * len(aside),
        )

    def postings(self, word: str) -> list[tuple[Counts, Counts]]:
        """The rows holding ``word`` and how often, in the base then the delta."""
        found = [self.base.get(word), self.delta.get(word)]
        return [part for part in found if part is not None and len(part[0])]


_NO_ROWS: Counts = np.zeros(0, dtype=np.int32)


class TextIndexCache:
    """Indexes by key, least recently used dropped first beyond ``max_bytes``. A scope
    too large to keep is remembered with its generation (``too_large``), so it is not
    read whole search after search: it is tried again once it has changed much."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self._indexes: OrderedDict[Key, TextIndex] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.too_large: dict[Key, int] = {}
        self.loads = 0  # indexes built from a scope read whole (misses), for tests and bench
        self.updates = 0  # indexes brought up to date from their scope's changes

    @property
    def nbytes(self) -> int:
        return self._bytes

    def latest(self, key: Key) -> TextIndex | None:
        """The index of ``key`` whatever its generation (to bring it up to date)."""
        with self._lock:
            index = self._indexes.get(key)
            if index is not None:
                self._indexes.move_to_end(key)
            return index

    def put(self, key: Key, index: TextIndex, *, updated: bool = False) -> bool:
        """Keep ``index`` unless it is larger than the whole budget (then remember its
        scope as too large: ``False``); evict to fit."""
        with self._lock:
            if updated:
                self.updates += 1
            else:
                self.loads += 1
            if key in self._indexes:
                self._bytes -= self._indexes.pop(key).nbytes
            if index.nbytes > self.max_bytes:
                self.too_large[key] = index.generation
                return False
            self.too_large.pop(key, None)
            while self._indexes and self._bytes + index.nbytes > self.max_bytes:
                self._bytes -= self._indexes.popitem(last=False)[1].nbytes
            self._indexes[key] = index
            self._bytes += index.nbytes
            return True
