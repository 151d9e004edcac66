"""The exact nearest rows of a float32 matrix to a query, read mostly in int8.

A scope's unit vectors are kept as float32 rows and beside them as int8 codes
(:func:`quantise`): row ``v`` is ``scale * code + e`` with ``|e|`` (its residual) known
per row. A search first takes the int8 dot product of the query's codes with every
row (simsimd, a quarter of the bytes of the float32 rows), which gives each row's
score to within a bound:

    q.v = sq*sv*(cq.cv) + q.e_v + e_q.(sv*cv)    (q = sq*cq + e_q, v = sv*cv + e_v)
    |q.v - sq*sv*(cq.cv)| <= |q||e_v| + |e_q|(|v| + |e_v|)

plus the rounding of the float32 score itself (``dims * 2**-23 * |q||v|``, twice the
classic bound of a float32 sum). Every row whose upper bound reaches the limit-th best
lower bound might be in the top ``limit``; those rows alone are scored exactly, in
float32 (:func:`exact`), and ranked. The result is the one the float32 pass over every
row gives, to the bit: :func:`exact` scores each row by itself (simsimd's float32 dot
product, the same kernel whichever rows are asked), unlike a BLAS matrix product,
whose last bits depend on the shape. When the bounds rule out too few rows (vectors
all alike), every row is scored exactly instead.

Without simsimd (a platform it has no wheel for) no codes are made, and every search is
numpy's float32 matrix product over every row (:data:`SEARCH` says which runs).
"""

from __future__ import annotations

import importlib.metadata
from types import ModuleType
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

simsimd: ModuleType | None
try:
    import simsimd
except ImportError:  # no wheel for this platform: the float32 pass alone
    simsimd = None

#: whether int8 codes are kept and searched first
FIRST_PASS = simsimd is not None
#: below this many rows the float32 pass is as quick as the int8 one
FIRST_PASS_MIN_ROWS = 2_048
#: threads of simsimd's int8 pass: one, as a hybrid search runs its full text on another
#: core meanwhile (a second thread there only contends with it)
THREADS = 1
#: when more than this share of the rows cannot be ruled out, all are scored exactly
CANDIDATE_SHARE = 0.25
#: a bound on the length of a stored row: rows are normalised in float32 (1 + dims *
#: 2**-24 at most); a longer one (not finite) gets an infinite residual, always re-scored
NORM_BOUND = 1.0 + 2.0**-8
#: the rounding of the float64 arithmetic of the bounds (values near 1)
_FLOAT64_SLACK = 2.0**-40
_CHUNK = 256  # rows at a time: their float64 copies stay in cache
_F64 = np.float64


def _version() -> str:
    try:
        return importlib.metadata.version("simsimd")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


SEARCH = (
    "exact cosine over the scope's vectors cached in process: an int8 first pass "
    f"(simsimd {_version()}), the rows it cannot rule out re-scored in float32"
    if FIRST_PASS
    else "exact cosine, numpy's float32 matrix product over the scope's vectors cached "
    "in process (simsimd not importable)"
)


class Codes(NamedTuple):
    """Rows in int8: row ``i`` is ``scales[i] * codes[i]`` give or take ``errors[i]``
    (an upper bound of the residual's length, infinite for a row not finite)."""

    codes: npt.NDArray[np.int8]
    scales: npt.NDArray[np.float64]
    errors: npt.NDArray[np.float64]

    @property
    def nbytes(self) -> int:
        return int(self.codes.nbytes + self.scales.nbytes + self.errors.nbytes)

    def take(self, rows: npt.NDArray[np.bool_] | slice) -> Codes:
        return Codes(self.codes[rows], self.scales[rows], self.errors[rows])

    @staticmethod
    def empty(count: int, width: int) -> Codes:
        return Codes(
            np.empty((count, width), dtype=np.int8),
            np.empty(count, dtype=_F64),
            np.empty(count, dtype=_F64),
        )

    def put(self, at: int, other: Codes) -> None:
        """``other`` written over the rows from ``at``."""
        end = at + len(other.codes)
        self.codes[at:end] = other.codes
        self.scales[at:end] = other.scales
        self.errors[at:end] = other.errors


def quantise(vectors: npt.NDArray[np.float32]) -> Codes:
    """Each row scaled into [-127, 127] by its largest component and rounded; its scale is
    a float32 (so scale times code is exact in float64) and its residual's length is
    computed in float64 and rounded up."""
    count, width = vectors.shape
    out = Codes.empty(count, width)
    for start in range(0, count, _CHUNK):
        block = vectors[start : start + _CHUNK]
        peak = np.abs(block).max(axis=1, initial=0.0)  # not finite if any component is not
        finite = np.isfinite(peak)
        if not finite.all():
            block = np.where(finite[:, None], block, np.float32(0))
            peak = np.where(finite, peak, np.float32(0))
        scales = (peak / np.float32(127)).astype(np.float32)
        scaled = block / np.where(scales > 0, scales, np.float32(1))[:, None]
        np.clip(np.rint(scaled, out=scaled), -127, 127, out=scaled)
        wide = block.astype(_F64)
        norms = np.sqrt(np.einsum("ij,ij->i", wide, wide))
        wide -= scales.astype(_F64)[:, None] * scaled  # exact products: float32 times int
        # the float64 rounding of the residual's length, covered
        errors = np.sqrt(np.einsum("ij,ij->i", wide, wide)) * (1 + 2.0**-40)
        errors[~finite | (norms > NORM_BOUND)] = np.inf
        out.put(start, Codes(scaled.astype(np.int8), scales.astype(_F64), errors))
    return out


def exact(vectors: npt.NDArray[np.float32], query: npt.NDArray[np.float32]) -> npt.NDArray[_F64]:
    """The float32 dot product of ``query`` with each row, each row's independent of the
    others (simsimd), or numpy's matrix product without simsimd."""
    if simsimd is None or not len(vectors):
        return (vectors @ query).astype(_F64)
    scores: npt.NDArray[_F64] = np.asarray(simsimd.cdist(query[None, :], vectors, metric="dot"))[0]
    return scores


def candidates(
    codes: Codes,
    query: npt.NDArray[np.float32],
    limit: int,
    live: npt.NDArray[np.bool_] | None,
) -> npt.NDArray[np.intp] | None:
    """The rows that may be among the ``limit`` best (of the ``live`` ones, if given; at
    least ``limit`` of them live), or ``None`` when too many are, or the query is not of
    unit length (float32 could overflow): score them all."""
    assert simsimd is not None
    count = len(codes.codes)
    wide = query.astype(_F64)
    peak = float(np.abs(query).max())
    query_norm = float(np.linalg.norm(wide)) * (1 + 2.0**-40)
    if not query_norm <= NORM_BOUND or peak == 0.0:  # the store asks with unit queries
        return None
    if len(query) * 127 * 127 >= 2**31:  # simsimd's int32 sums could overflow
        return None
    scale = np.float32(peak / 127)
    query_codes = np.clip(np.rint(query / scale), -127, 127).astype(np.int8)
    query_error = float(np.linalg.norm(wide - float(scale) * query_codes)) * (1 + 2.0**-40)
    dots = np.asarray(
        simsimd.cdist(query_codes[None, :], codes.codes, metric="dot", threads=THREADS)
    )[0]
    # int32 sums of int8 products, exact in float64; scale times scale exact in float64
    approx = dots * (float(scale) * codes.scales)
    rounding = len(query) * 2.0**-23 * query_norm * NORM_BOUND + _FLOAT64_SLACK
    bound = codes.errors * (query_norm + query_error)
    bound += query_error * NORM_BOUND + rounding
    lower = approx - bound
    upper = np.add(approx, bound, out=approx)
    if live is not None:
        lower[~live] = -np.inf
    floor = np.partition(lower, count - limit)[count - limit]
    rows = np.flatnonzero(upper >= floor)
    if live is not None:
        rows = rows[live[rows]]
    if len(rows) > max(limit, CANDIDATE_SHARE * count):
        return None
    return rows


def best(ids: npt.NDArray[np.int64], scores: npt.NDArray[_F64], limit: int) -> npt.NDArray[np.intp]:
    """The positions of the ``limit`` best ``scores``, best first, ties by ascending id (a
    score that is not a number counts as the worst)."""
    scores = np.where(np.isnan(scores), -np.inf, scores)
    if limit < len(scores):
        # the limit-th best score, then every row at least as good (ties kept whole)
        cut = np.partition(scores, len(scores) - limit)[len(scores) - limit]
        chosen = np.flatnonzero(scores >= cut)
    else:
        chosen = np.arange(len(scores))
    order = np.lexsort((ids[chosen], -scores[chosen]))[:limit]
    return chosen[order]
