"""Full-text search of Memory entries on SQLite: the best ``limit`` by BM25 without
asking FTS5 to rank every match.

FTS5's ``bm25()`` scores one matching row at a time, so ``ORDER BY bm25 LIMIT k`` scores
and sorts every entry holding any query word: a query with a common word ranks most of
the store. One word's share of an entry's BM25 is ``idf * f * (k1 + 1) / (f + k1 * (1 -
b + b * length / average length))``; ``idf`` needs how many entries hold the word
(``memory_fts_vocab``, migration 0016, counts kept per index version by
:class:`WordCounts`) and the index's row and token totals (FTS5's averages record);
FTS5 clamps it to 1e-6 for a word in half the entries or more. :func:`fulltext_sqlite`
answers by the first of these that applies:

1. **The scope's index** (:mod:`corral.store.sql.fulltext_index`): the scope's words
   kept in process as postings, current by the scope's generation and noted changes
   (built or updated by one search of the scope at a time: the others wait for it).
   Every entry of the scope holding a query word is scored with numpy - each word's
   share for all its entries at once, added word by word in the query's order - and
   the best ``limit`` taken by ``np.partition`` and sorted. Filters are checked on the
   first few hundred in order, else the ids they keep are read. Not used for a query word that is not ASCII, a scope whose index does not fit
   the cache (remembered for :data:`TOO_LARGE_FOR` generations), or by a store whose
   cache budget is 0.
2. **MaxScore** (Turtle and Flood, 1995), reading only the entries of the rarer words:
   each word's share is below ``idf * (k1 + 1)``. The words are taken rarest first; the
   entries of the scope (and filters) holding any word taken so far are scored whole,
   reading their texts, and once the ``limit``-th best of them scores above the sum of
   the bounds of the words not taken, no other entry can reach it. Else the next word
   is taken; with every word taken the scored entries are all the matches.
3. **FTS5's own ranking** (:func:`ranked_by_fts5`) for the rest: a query with a
   non-ASCII word, a scored entry with non-ASCII text, or rare words held by more than
   :data:`FAST_CANDIDATES` entries in all (or a quarter of the index).

Exact: each score is computed with FTS5's formula, constants, statistics and order of
operations (:meth:`_Query.share`; numpy's element-wise operations round each one as C
does), so it is the double FTS5's ``bm25()`` gives (negated), and the order is the full
ranking's - score, then the entry written last, then id (the tests compare the two on
corpora of common words and ties). That holds where SQLite computes in IEEE double
without fusing a multiply and an add (x86-64 builds); a build that fuses could differ in
the last bit and order two entries a bit apart the other way. Word counts come from the
entries' texts: for ASCII text FTS5's tokenization (``unicode61``) is the runs of ASCII
letters and digits, lower-cased (the tests check it against FTS5's); MaxScore hands
other texts to FTS5's ranking, the index has FTS5 tokenize them.
"""

from __future__ import annotations

import heapq
import math
from typing import Any, TypeVar

import anyio
import numpy as np
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.memory import MemoryHit, MemoryPlace
from corral.store.schema import memory_entries
from corral.store.sql.engine import Turns
from corral.store.sql.fulltext_index import DEAD, Floats, Ints, TextIndex, TextIndexCache
from corral.store.sql.memory_scopes import at_place, changed_entries, generation_of
from corral.store.sql.rows import MEMORY_ENTRIES

_Number = TypeVar("_Number", float, Floats)
_t = memory_entries
_COLUMNS = len(_t.columns)
_fts = sa.table("memory_fts", sa.column("rowid", sa.Integer))
_vocab = sa.table("memory_fts_vocab", sa.column("term", sa.Text), sa.column("doc", sa.Integer))
_fts_data = sa.table("memory_fts_data", sa.column("id", sa.Integer), sa.column("block"))
_docsize = sa.table("memory_fts_docsize", sa.column("id", sa.Integer), sa.column("sz"))

#: FTS5's bm25() constants
K1 = 1.2
B = 0.75
#: FTS5's idf for a word in half the entries or more (a log that would be <= 0)
CLAMPED_IDF = 1e-6
#: relative slack on a word's bound: far above the rounding of a sum of doubles
BOUND_SLACK = 1e-9
#: the most entries the words taken may hold (all scopes) before FTS5 ranks instead
FAST_CANDIDATES = 8_192
#: how many full-text matches FTS5 ranks before reading their entries (ranked_by_fts5)
FTS_CANDIDATES = 256
#: how many words' entry counts a store keeps for the index's current version
COUNTS_KEPT = 4_096
#: the most entries a scope's changes since its cached index may name for an update
MOST_CHANGED = 8_192
#: how many generations a scope too large for the cache is searched without an index
TOO_LARGE_FOR = 64
# FTS5's shadow table memory_fts_data: row 1 is the averages record (total rows, then
# total tokens per column), row 10 the structure record, rewritten by every change
_AVERAGES_ROWID = 1
_STRUCTURE_ROWID = 10


def fts5_search(terms: list[str]) -> tuple[sa.FromClause, sa.ColumnElement[Any], Any]:
    """FTS5: the join, the match condition, and the rank (lower is better)."""
    condition = _matches(" OR ".join(_phrase(term) for term in terms))
    rank = sa.func.bm25(sa.literal_column("memory_fts"))
    return _t.join(_fts, _fts.c.rowid == _t.c.id), condition, rank


def _phrase(term: str) -> str:
    """A word as a quoted FTS5 string ('"' doubled inside): never an operator or a column."""
    return '"' + term.replace('"', '""') + '"'


def _matches(expression: str) -> sa.ColumnElement[bool]:
    return sa.literal_column("memory_fts").op("MATCH")(sa.bindparam("match", expression))


def _among(
    ids: list[int] | sa.Select[Any], conditions: list[sa.ColumnElement[bool]]
) -> sa.ColumnElement[bool]:
    """The entries of ``ids`` that meet ``conditions``, looked up by id: the conditions sit
    inside a function, where SQLite cannot use them to pick the scope's index instead
    (which would read the whole scope to keep a few ids)."""
    return sa.and_(_t.c.id.in_(ids), sa.func.coalesce(sa.and_(*conditions), sa.false()))


class WordCounts:
    """How many entries hold each word, as of one version of the index: counting a common
    word walks its whole list of entries, and the same words come back query after query.

    The version is FTS5's structure record: each transaction's changes become a new
    segment, which rewrites it (a table with FTS5's ``secure-delete`` option, which edits
    segments in place, would not be told apart: ``memory_fts`` does not set it)."""

    def __init__(self, kept: int = COUNTS_KEPT) -> None:
        self.kept = kept
        self._version = b""
        self._counts: dict[str, int] = {}

    def get(self, version: bytes, words: list[str]) -> tuple[dict[str, int], list[str]]:
        """The counts known for ``version``, and the words not known."""
        if version != self._version:
            self._version, self._counts = version, {}
        known = {word: self._counts[word] for word in words if word in self._counts}
        return known, [word for word in words if word not in known]

    def put(self, version: bytes, counts: dict[str, int]) -> None:
        if version != self._version:
            return
        if len(self._counts) + len(counts) > self.kept:
            self._counts = {}
        self._counts.update(counts)


class FulltextCaches:
    """What one store keeps between full-text searches on SQLite: word counts, and the
    scopes' indexes within ``max_bytes`` (0 keeps none)."""

    def __init__(self, max_bytes: int) -> None:
        self.counts = WordCounts()
        self.indexes = TextIndexCache(max_bytes)
        # one search at a time builds or updates a scope's index, the others then use it
        self.building = Turns()


async def fulltext_sqlite(
    place: MemoryPlace,
    terms: list[str],
    conditions: list[sa.ColumnElement[bool]],
    limit: int,
    kept: FulltextCaches,
    conn: AsyncConnection,
) -> list[MemoryHit]:
    """The best ``limit`` entries of ``place`` matching any of ``terms`` under
    ``conditions`` (the scope's, then filters), by BM25 (see the module): over the
    scope's index where it applies, else by MaxScore, else by FTS5's own ranking."""
    found = await _indexed(place, terms, conditions, limit, kept, conn)
    if found is None:
        found = await _maxscore(terms, conditions, limit, kept.counts, conn)
    if found is not None:
        return found
    return await ranked_by_fts5(terms, conditions, limit, conn)


async def _indexed(
    place: MemoryPlace,
    terms: list[str],
    conditions: list[sa.ColumnElement[bool]],
    limit: int,
    kept: FulltextCaches,
    conn: AsyncConnection,
) -> list[MemoryHit] | None:
    """The answer scored over the scope's :class:`TextIndex`, or ``None`` where it does
    not apply (a word that is not ASCII, no cache, a scope too large to keep)."""
    if kept.indexes.max_bytes == 0 or not all(t.isascii() and t.isalnum() for t in terms):
        return None
    key = (place.namespace, place.memory, place.scope_key)
    generation = int((await conn.execute(generation_of(place))).scalar() or 0)
    too_large = kept.indexes.too_large.get(key)
    if too_large is not None and generation - too_large < TOO_LARGE_FOR:
        return None
    state = await _index_state(conn)
    if state is None:
        return None
    rows, tokens, version = state
    held = await _held(conn, kept.counts, version, terms)
    words = [term for term in terms if held[term] > 0]  # the others add 0.0
    if not words or rows <= 0:
        return []
    index = await _text_index(conn, place, generation, kept)
    if index is None:  # found too large by the search before this one
        return None
    query = _Query(words, rows, tokens, held)
    scores = np.zeros(len(index.ids), dtype=np.float64)
    matched = np.zeros(len(index.ids), dtype=np.bool_)
    for word in words:  # in the query's order: each entry's sum as bm25() adds it up
        for at, counts in index.postings(word):
            share = query.share(word, counts.astype(np.float64), index.lengths[at])
            scores[at] += share
            matched[at] = True
    candidates = np.flatnonzero(matched & (index.ids != DEAD))
    if len(conditions) > 1:  # filters: the best that pass them
        best = await _passing(conn, index, scores, candidates, conditions, limit)
    else:
        best = _first(index, scores, candidates, limit)
    ids = [int(n) for n in index.ids[best]]
    read_rows = await conn.execute(sa.select(_t).where(_t.c.id.in_(ids)))
    entries = {row.id: MEMORY_ENTRIES.record(row) for row in read_rows.all()}
    return [MemoryHit(entries[n], float(scores[row])) for n, row in zip(ids, best, strict=True)]


def _first(index: TextIndex, scores: Any, candidates: Ints, limit: int) -> Ints:
    """The first ``limit`` rows of ``candidates`` in the full ranking's order: score,
    then the entry written last, then id (every row tying the ``limit``-th score sorted)."""
    if limit < len(candidates):
        among = scores[candidates]
        cut = np.partition(among, len(among) - limit)[len(among) - limit]
        candidates = candidates[among >= cut]
    order = np.lexsort((index.ids[candidates], -index.updated[candidates], -scores[candidates]))
    return candidates[order[:limit]]


async def _passing(
    conn: AsyncConnection,
    index: TextIndex,
    scores: Any,
    candidates: Ints,
    conditions: list[sa.ColumnElement[bool]],
    limit: int,
) -> Ints:
    """The first ``limit`` rows of ``candidates`` whose entries pass ``conditions``: of
    the first few hundred if enough of them do, else of the entries the filters keep."""
    first = _first(index, scores, candidates, max(FTS_CANDIDATES, 4 * limit))
    ids = [int(n) for n in index.ids[first]]
    passing = set((await conn.execute(sa.select(_t.c.id).where(_among(ids, conditions)))).scalars())
    kept = [row for row, n in zip(first, ids, strict=True) if n in passing]
    if len(kept) >= limit or len(first) == len(candidates):
        return np.asarray(kept[:limit], dtype=np.int64)
    allowed = np.fromiter(
        (await conn.execute(sa.select(_t.c.id).where(*conditions))).scalars(), dtype=np.int64
    )
    return _first(index, scores, candidates[np.isin(index.ids[candidates], allowed)], limit)


async def _text_index(
    conn: AsyncConnection, place: MemoryPlace, generation: int, kept: FulltextCaches
) -> TextIndex | None:
    """The scope's index at ``generation``: cached, else (one search of the scope at a
    time: searches at once do not each read the scope whole) brought up to date from the
    scope's changes, or built from its texts read whole (kept if it fits the cache);
    ``None`` if the search before this one found the scope too large to keep."""
    cache = kept.indexes
    key = (place.namespace, place.memory, place.scope_key)
    cached = cache.latest(key)
    if cached is not None and cached.generation == generation:
        return cached
    async with kept.building.turn("\x00".join(key)):
        return await _built(conn, place, generation, cache)


async def _built(
    conn: AsyncConnection, place: MemoryPlace, generation: int, cache: TextIndexCache
) -> TextIndex | None:
    key = (place.namespace, place.memory, place.scope_key)
    cached = cache.latest(key)  # again: the search before this one may have built it
    if cached is not None and cached.generation == generation:
        return cached
    too_large = cache.too_large.get(key)
    if too_large is not None and 0 <= generation - too_large < TOO_LARGE_FOR:
        return None
    if cached is not None and cached.generation < generation:
        changed = await changed_entries(conn, place, cached.generation, generation)
        if changed is not None and len(changed) <= MOST_CHANGED:
            fresh = await _texts(conn, place, changed)
            stale = np.asarray(changed, dtype=np.int64)
            index = await anyio.to_thread.run_sync(cached.updated_to, generation, stale, fresh)
            if index is not None:
                cache.put(key, index, updated=True)
                return index
    entries = await _texts(conn, place, None)
    # tokenizing is seconds for a large scope: off the event loop, like the update above
    index = await anyio.to_thread.run_sync(TextIndex.of, generation, entries)
    if cached is None or cached.generation < generation:  # never an older one filed
        cache.put(key, index)
    return index


async def _texts(
    conn: AsyncConnection, place: MemoryPlace, only: list[int] | None
) -> list[tuple[int, str, float]]:
    """The scope's entries (those of ``only``, if given) as (id, text, updated_at)."""
    statement = sa.select(_t.c.id, _t.c.text, _t.c.updated_at).where(at_place(place))
    if only is not None:
        rows = (await conn.execute(statement.where(_t.c.id.in_(only)).order_by(_t.c.id))).all()
        return [(int(n), str(text), float(updated_at)) for n, text, updated_at in rows]
    # the whole scope: the driver's own rows (a third of the time of SQLAlchemy's), in
    # this transaction; the statement has no list to expand, so it compiles as it runs
    compiled = statement.order_by(_t.c.id).compile(dialect=conn.dialect)
    params = [compiled.params[name] for name in compiled.positiontup or ()]
    raw = await conn.get_raw_connection()
    cursor = await raw.driver_connection.execute(str(compiled), params)  # type: ignore[union-attr]
    try:
        return list(await cursor.fetchall())
    finally:
        await cursor.close()


async def _held(
    conn: AsyncConnection, counts: WordCounts, version: bytes, terms: list[str]
) -> dict[str, int]:
    """How many entries (all scopes) hold each of ``terms``, at the index's ``version``."""
    held, unknown = counts.get(version, terms)
    if unknown:
        found = await _entries_holding(conn, unknown)
        found.update((word, 0) for word in unknown if word not in found)
        counts.put(version, found)
        held.update(found)
    return held


async def _maxscore(
    terms: list[str],
    conditions: list[sa.ColumnElement[bool]],
    limit: int,
    counts: WordCounts,
    conn: AsyncConnection,
) -> list[MemoryHit] | None:
    """The module's MaxScore, or ``None`` where it does not apply."""
    if not all(term.isascii() and term.isalnum() for term in terms):
        return None
    index = await _index_state(conn)
    if index is None:
        return None
    rows, tokens, version = index
    held = await _held(conn, counts, version, terms)
    words = [term for term in terms if held[term] > 0]  # the others add 0.0
    if not words or rows <= 0:
        return []
    query = _Query(words, rows, tokens, held)
    rarest = sorted(words, key=lambda word: held[word])  # stable: ties in query order
    shares: dict[int, dict[str, float]] = {}  # FTS5's share of each word taken, by entry
    scored: dict[int, tuple[float, float]] = {}  # entries of the scope: (score, updated_at)
    seen: set[int] = set()  # entries read: scored, or not of the scope
    # past a quarter of the index, ranking every match costs FTS5 about as much
    budget = min(FAST_CANDIDATES, rows // 4)
    for taken, word in enumerate(rarest, start=1):
        if sum(held[w] for w in rarest[:taken]) > budget:
            return None
        for entry_id, share in await _shares(conn, word):
            shares.setdefault(entry_id, {})[word] = share
        rest = sum(query.bound(w) for w in rarest[taken:])
        if taken < len(rarest) and _kth_largest(shares, limit) <= rest:
            continue  # the limit-th entry is unlikely to beat the rest: take another word
        # an entry not read scores at most its taken shares plus the bounds of the rest
        unread = sorted(
            (-(sum(got.values()) + rest) * (1.0 + BOUND_SLACK), entry_id)
            for entry_id, got in shares.items()
            if entry_id not in seen
        )
        at = 0
        while at < len(unread):
            best = _best(scored, limit)
            if len(best) == limit and scored[best[-1]][0] > -unread[at][0]:
                break
            batch = [entry_id for _, entry_id in unread[at : at + max(4 * limit, 256)]]
            at += len(batch)
            seen.update(batch)
            read = await _score(conn, batch, conditions, query, set(rarest[taken:]), shares)
            if read is None:
                return None
            scored.update(read)
        best = _best(scored, limit)
        if taken == len(rarest) or (len(best) == limit and scored[best[-1]][0] > rest):
            read_rows = await conn.execute(sa.select(_t).where(_t.c.id.in_(best)))
            entries = {row.id: MEMORY_ENTRIES.record(row) for row in read_rows.all()}
            return [MemoryHit(entries[n], scored[n][0]) for n in best]
    return None  # not reached: the last word taken returns


def _kth_largest(shares: dict[int, dict[str, float]], k: int) -> float:
    """The ``k``-th largest sum of shares (0.0 with fewer): what the ``k``-th best entry
    scores at least, were every entry in the scope (a guess: it may not be)."""
    sums = heapq.nlargest(k, (sum(got.values()) for got in shares.values()))
    return sums[-1] if len(sums) == k else 0.0


def _best(scored: dict[int, tuple[float, float]], limit: int) -> list[int]:
    """The ids of the best ``limit`` scored entries, in the full ranking's order."""
    return sorted(scored, key=lambda n: (-scored[n][0], -scored[n][1], n))[:limit]


async def _shares(conn: AsyncConnection, word: str) -> list[tuple[int, float]]:
    """Each entry holding ``word`` (all scopes) with the word's share of its BM25: FTS5's
    ``bm25()`` of the word alone (its idf is the same in any query)."""
    rank = sa.func.bm25(sa.literal_column("memory_fts"))
    statement = sa.select(_fts.c.rowid, rank).where(_matches(_phrase(word)))
    return [(int(n), -float(score)) for n, score in (await conn.execute(statement)).all()]


async def _score(
    conn: AsyncConnection,
    ids: list[int],
    conditions: list[sa.ColumnElement[bool]],
    query: _Query,
    untaken: set[str],
    shares: dict[int, dict[str, float]],
) -> dict[int, tuple[float, float]] | None:
    """The scores of the entries of ``ids`` in the scope and filters: the shares of the
    words taken as FTS5 gave them, of the others from the text (``None`` if a text
    needed is not ASCII), summed in the query's order as ``bm25()`` sums them."""
    statement = (
        sa.select(_t.c.id, _t.c.text, _t.c.updated_at, _docsize.c.sz)
        .select_from(_t.join(_docsize, _docsize.c.id == _t.c.id))
        .where(_among(ids, conditions))
    )
    scored: dict[int, tuple[float, float]] = {}
    for entry_id, text, updated_at, size in (await conn.execute(statement)).all():
        known = shares.get(entry_id, {})
        counted: dict[str, float] = {}
        if untaken:
            if not text.isascii():
                return None
            length = float(size[0] if size and size[0] < 0x80 else varints(bytes(size))[0])
            frequencies = _frequencies([w for w in query.words if w in untaken], text)
            counted = {w: query.share(w, f, length) for w, f in frequencies.items()}
        score = 0.0
        for word in query.words:
            share = known.get(word) if word not in untaken else counted.get(word)
            if share:
                score += share
        scored[entry_id] = (score, updated_at)
    return scored


class _Query:
    """The words of a query that some entry holds, in the query's order, with what
    FTS5's ``bm25()`` computes once per query for each."""

    def __init__(self, words: list[str], rows: int, tokens: int, held: dict[str, int]) -> None:
        self.words = words
        self.average = float(tokens) / float(rows)
        self.idf = {word: _idf(rows, held[word]) for word in words}

    def bound(self, word: str) -> float:
        """Above ``word``'s share in any entry (the share's limit as f grows, with slack)."""
        return self.idf[word] * (K1 + 1.0) * (1.0 + BOUND_SLACK)

    def share(self, word: str, f: _Number, length: _Number) -> _Number:
        """``word``'s share of an entry of ``length`` tokens holding it ``f`` times, with
        FTS5's operations in FTS5's order (``fts5Bm25Function``); of many entries at once
        for arrays (numpy's element-wise operations: the same doubles, one by one)."""
        idf, average = self.idf[word], self.average
        return idf * ((f * (K1 + 1.0)) / (f + K1 * (1 - B + B * length / average)))


def _frequencies(words: list[str], text: str) -> dict[str, int]:
    """How often each of ``words`` (ASCII letters and digits, lower case) is a unicode61
    token of the ASCII ``text``: an occurrence bounded by anything but a letter or digit."""
    lowered = text.lower()
    frequencies: dict[str, int] = {}
    for word in words:
        count = 0
        at = lowered.find(word)
        while at >= 0:
            end = at + len(word)
            if (at == 0 or not lowered[at - 1].isalnum()) and (
                end == len(lowered) or not lowered[end].isalnum()
            ):
                count += 1
            # a token cannot begin inside this occurrence: the word is letters and digits
            at = lowered.find(word, end)
        if count:
            frequencies[word] = count
    return frequencies


def _idf(rows: int, holding: int) -> float:
    idf = math.log(((rows - holding) + 0.5) / (holding + 0.5))
    return idf if idf > 0.0 else CLAMPED_IDF


async def _index_state(conn: AsyncConnection) -> tuple[int, int, bytes] | None:
    """The index's rows and tokens (FTS5's averages record) and its version (the
    structure record's bytes); ``None`` if the averages cannot be read."""
    statement = sa.select(_fts_data.c.id, _fts_data.c.block).where(
        _fts_data.c.id.in_((_AVERAGES_ROWID, _STRUCTURE_ROWID))
    )
    blocks = {int(n): bytes(block) for n, block in (await conn.execute(statement)).all()}
    if _AVERAGES_ROWID not in blocks:  # an index never written to
        return 0, 0, b""
    numbers = varints(blocks[_AVERAGES_ROWID])
    if len(numbers) < 2:
        return None
    return numbers[0], numbers[1], blocks.get(_STRUCTURE_ROWID, b"")


async def _entries_holding(conn: AsyncConnection, words: list[str]) -> dict[str, int]:
    """How many entries (all scopes) hold each of ``words``."""
    statement = sa.select(_vocab.c.term, _vocab.c.doc).where(_vocab.c.term.in_(words))
    return {str(term): int(doc) for term, doc in (await conn.execute(statement)).all()}


def varints(block: bytes) -> list[int]:
    """SQLite's varints (big-endian groups of 7 bits, a ninth byte of 8) one after another."""
    numbers: list[int] = []
    at = 0
    while at < len(block):
        value = 0
        for n in range(9):
            if at >= len(block):
                return numbers  # cut short: not a whole varint
            byte = block[at]
            at += 1
            if n == 8:
                value = (value << 8) | byte
                break
            value = (value << 7) | (byte & 0x7F)
            if not byte & 0x80:
                break
        numbers.append(value)
    return numbers


async def ranked_by_fts5(
    terms: list[str],
    conditions: list[sa.ColumnElement[bool]],
    limit: int,
    conn: AsyncConnection,
) -> list[MemoryHit]:
    """FTS5 ranks its matches alone first (BM25 over the index, no join: about half the
    time of ranking the join at 100,000 matches), the best :data:`FTS_CANDIDATES`; then
    the entries among them in the scope and filters are read. That is the exact answer
    when the candidates were all the matches, or when ``limit`` entries rank strictly
    better than the last candidate (nothing left out can come before them, ties
    included); otherwise the joined query ranks every match of the scope."""
    source, matches, rank = fts5_search(terms)
    candidates = max(FTS_CANDIDATES, 4 * limit)
    ranked = (
        await conn.execute(
            sa.select(_fts.c.rowid, rank.label("rank"))
            .select_from(_fts)
            .where(matches)
            .order_by(rank)
            .limit(candidates)
        )
    ).all()
    if not ranked:
        return []
    ranks = {int(row[0]): float(row[1]) for row in ranked}
    found = (await conn.execute(sa.select(_t).where(_among(list(ranks), conditions)))).all()
    hits = sorted(found, key=lambda row: (ranks[row.id], -row.updated_at, row.id))
    last = float(ranked[-1][1])
    if len(ranked) < candidates or sum(ranks[r.id] < last for r in hits) >= limit:
        return [MemoryHit(MEMORY_ENTRIES.record(row), -ranks[row.id]) for row in hits[:limit]]
    return await every_match_ranked(source, matches, rank, conditions, limit, conn)


async def every_match_ranked(
    source: sa.FromClause,
    matches: sa.ColumnElement[Any],
    rank: Any,
    conditions: list[sa.ColumnElement[bool]],
    limit: int,
    conn: AsyncConnection,
) -> list[MemoryHit]:
    """The best ``limit`` entries that ``matches`` in ``conditions``, the database ranking
    every match (``rank``: lower is better; newer first, then by id, among ties)."""
    statement = (
        sa.select(_t, rank.label("rank"))
        .select_from(source)
        .where(matches, *conditions)
        .order_by(rank, _t.c.updated_at.desc(), _t.c.id)
        .limit(limit)
    )
    return [
        MemoryHit(MEMORY_ENTRIES.record(tuple(row)[:_COLUMNS]), -float(row.rank))
        for row in (await conn.execute(statement)).all()
    ]
