"""The int8 first pass of the in-process vector search gives the float32 pass's answer,
to the bit: the same ids in the same order with the same scores, on random and on
adversarial rows, through the cache's incremental updates."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from corral.store.sql.vector_cache import DEAD, Matrix
from corral.store.sql.vector_scan import (
    FIRST_PASS,
    FIRST_PASS_MIN_ROWS,
    SEARCH,
    candidates,
    exact,
    quantise,
)

pytestmark = pytest.mark.skipif(not FIRST_PASS, reason="simsimd is not importable here")

F32 = npt.NDArray[np.float32]


def unit_rows(rng: np.random.Generator, count: int, dims: int) -> F32:
    rows = rng.standard_normal((count, dims)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return rows


def unit(vector: npt.NDArray[np.floating]) -> list[float]:
    wide = np.asarray(vector, dtype=np.float64)
    return (wide / np.linalg.norm(wide)).tolist()  # type: ignore[no-any-return]


def same_both_ways(
    matrix: Matrix,
    query: list[float],
    limits: tuple[int, ...] = (1, 2, 5, 10, 50, 10_000),
    allowed: npt.NDArray[np.int64] | None = None,
) -> None:
    """Both passes answer alike for every limit (the first pass forced, even on few rows)."""
    for limit in limits:
        quick = matrix.nearest(query, limit, allowed, first_pass=True)
        full = matrix.nearest(query, limit, allowed, first_pass=False)
        assert quick == full, f"limit {limit}"


def test_random_rows_rank_alike_and_the_first_pass_rules_out_most_of_them() -> None:
    rng = np.random.default_rng(1)
    rows = unit_rows(rng, 20_000, 384)
    matrix = Matrix.of(1, list(range(5, 20_005)), rows)
    assert matrix.codes is not None
    for query in unit_rows(rng, 8, 384):
        same_both_ways(matrix, query.tolist())
        # not a vacuous comparison: the first pass leaves few rows to score in float32
        kept = candidates(matrix.codes, query, 50, None)
        assert kept is not None and 50 <= len(kept) < len(rows) // 20
    near_row = unit(rows[77] + 0.05 * rng.standard_normal(384))
    assert matrix.nearest(near_row, 1)[0][0] == 82
    same_both_ways(matrix, near_row)


def test_exact_scores_are_float32_dot_products_whichever_rows_are_asked() -> None:
    rng = np.random.default_rng(2)
    rows = unit_rows(rng, 3_000, 96)
    query = unit_rows(rng, 1, 96)[0]
    every = exact(rows, query)
    some = np.sort(rng.choice(len(rows), 300, replace=False))
    assert np.array_equal(exact(rows[some], query), every[some])  # row by row, bit for bit
    truth = rows.astype(np.float64) @ query.astype(np.float64)
    assert np.abs(every - truth).max() < 96 * 2.0**-23


def test_duplicates_ties_and_near_equal_scores_rank_alike() -> None:
    rng = np.random.default_rng(3)
    base = unit_rows(rng, 40, 64)
    copies = np.repeat(base, 50, axis=0)  # every row 50 times: ties broken by id
    nudged = copies + rng.standard_normal(copies.shape).astype(np.float32) * 1e-6
    rows = np.concatenate([copies, nudged]).astype(np.float32)
    ids = rng.permutation(len(rows)).tolist()
    matrix = Matrix.of(1, ids, rows)
    for query in [base[0], base[7], nudged[3], unit(base[0] + base[1])]:
        same_both_ways(matrix, list(map(float, query)))
    # a query at equal angles to two rows: their scores tie
    two = Matrix.of(1, [9, 4, 6], np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1]], np.float32))
    tied = two.nearest(unit(np.array([1.0, 1.0, 0.0])), 2, first_pass=True)
    assert [i for i, _ in tied] == [4, 9] and tied[0][1] == tied[1][1]
    same_both_ways(two, unit(np.array([1.0, 1.0, 1.0])))


def test_rows_that_quantise_worst_and_zero_ish_rows_rank_alike() -> None:
    rng = np.random.default_rng(4)
    dims = 32
    # one large component, the others just under half an int8 step: the largest residual
    step = 1.0 / 127
    worst = np.full((200, dims), 0.49 * step, dtype=np.float32)
    worst[:, 0] = 1.0
    worst[:, 1:] *= rng.choice([-1.0, 1.0], size=(200, dims - 1)).astype(np.float32)
    tiny = np.zeros((50, dims), dtype=np.float32)
    tiny[np.arange(50), rng.integers(0, dims, 50)] = 1e-30  # normalised to one axis
    zero = np.zeros((5, dims), dtype=np.float32)  # kept as zero: scores 0
    denormal = np.full((5, dims), 1e-42, dtype=np.float32)
    rows = np.concatenate([worst, tiny, zero, denormal, unit_rows(rng, 300, dims)])
    matrix = Matrix.of(1, list(range(len(rows))), rows)
    queries = [
        worst[0],
        unit(np.ones(dims)),
        unit(np.eye(dims)[3]),
        unit(np.eye(dims)[0] * -1),
        unit(rng.standard_normal(dims)),
        unit(np.full(dims, 0.49 * step) + np.eye(dims)[0]),
    ]
    for query in queries:
        same_both_ways(matrix, list(map(float, query)))


def test_dead_rows_appended_rows_and_compaction_rank_alike() -> None:
    rng = np.random.default_rng(5)
    dims = 48
    matrix = Matrix.of(1, list(range(1, 3_201)), unit_rows(rng, 3_200, dims))
    queries = [q.tolist() for q in unit_rows(rng, 4, dims)]
    generation = 1
    next_id = 10_000
    for _ in range(12):  # rewrites, deletes and new entries, appended then compacted
        alive = matrix.ids[matrix.ids != DEAD]
        rewritten = rng.choice(alive, 40, replace=False)
        deleted = rng.choice(np.setdiff1d(alive, rewritten), 30, replace=False)
        new = np.arange(next_id, next_id + 25)
        next_id += 25
        fresh_ids = np.sort(np.concatenate([rewritten, new]))
        # some rewritten rows take a query's own direction: they jump to the top
        fresh_rows = unit_rows(rng, len(fresh_ids), dims)
        fresh_rows[:3] = np.asarray(queries[0], dtype=np.float32)
        generation += 1
        fresh = Matrix.of(generation, fresh_ids.tolist(), fresh_rows)
        changed = np.concatenate([rewritten, deleted, new]).astype(np.int64)
        matrix = matrix.updated(changed, fresh)
        assert matrix.codes is not None and len(matrix.codes.codes) == len(matrix.ids)
        for query in queries:
            same_both_ways(matrix, query, limits=(1, 10, 50))
            found = {i for i, _ in matrix.nearest(query, 10_000, first_pass=True)}
            assert found == set(matrix.ids[matrix.ids != DEAD].tolist())
            assert not found & set(deleted.tolist())
    allowed = rng.choice(matrix.ids[matrix.ids != DEAD], 500, replace=False)
    for query in queries:
        same_both_ways(matrix, query, limits=(1, 10, 50), allowed=allowed)
        same_both_ways(matrix, query, limits=(5,), allowed=np.array([], dtype=np.int64))


def test_tiny_scopes_rank_alike() -> None:
    rng = np.random.default_rng(6)
    for count in range(1, 6):
        for dims in (1, 2, 3, 384):
            rows = unit_rows(rng, count, dims)
            matrix = Matrix.of(1, list(range(count, 0, -1)), rows)
            for query in unit_rows(rng, 3, dims):
                same_both_ways(matrix, query.tolist(), limits=(1, count, count + 3))
    empty = Matrix.of(1, [], np.zeros((0, 0), dtype=np.float32))
    assert empty.nearest([1.0, 0.0], 3, first_pass=True) == []


def test_random_small_matrices_rank_alike_over_many_seeds() -> None:
    for seed in range(60):
        rng = np.random.default_rng(100 + seed)
        dims = int(rng.integers(2, 40))
        count = int(rng.integers(1, 400))
        # few distinct values: many exact ties and rows the int8 codes cannot tell apart
        rows = rng.integers(-3, 4, size=(count, dims)).astype(np.float32)
        rows += rng.standard_normal((count, dims)).astype(np.float32) * float(rng.choice([0, 1e-4]))
        matrix = Matrix.of(1, rng.permutation(count).tolist(), rows)
        query = rng.integers(-3, 4, size=dims).astype(np.float64)
        if not query.any():
            query[0] = 1.0
        same_both_ways(matrix, unit(query), limits=(1, 3, 10, count))


def test_the_codes_bound_each_rows_residual_and_count_in_the_matrix_bytes() -> None:
    rng = np.random.default_rng(7)
    rows = unit_rows(rng, 500, 384)
    codes = quantise(rows)
    rebuilt = codes.scales[:, None] * codes.codes.astype(np.float64)
    residual = np.linalg.norm(rows.astype(np.float64) - rebuilt, axis=1)
    assert (residual <= codes.errors).all() and (codes.errors < 0.02).all()
    assert np.abs(codes.codes).max() == 127
    matrix = Matrix.of(1, list(range(500)), rows)
    spare = 500 + 500 // 16
    assert matrix.nbytes == 500 * 8 + spare * (384 * 4 + 384 + 8 + 8)
    broken = rows.copy()
    broken[3, 5] = np.nan
    assert np.isinf(quantise(broken).errors[3])  # never ruled out: always scored exactly
    assert FIRST_PASS_MIN_ROWS > 0 and "int8" in SEARCH


def test_without_simsimd_the_float32_pass_answers_and_capabilities_say_so() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["simsimd"] = None  # as on a platform without its wheel
        import numpy as np
        from corral.store.sql.vector_cache import Matrix
        from corral.store.sql.vectors import sqlite_vector_index
        rng = np.random.default_rng(8)
        rows = rng.standard_normal((3000, 16)).astype(np.float32)
        matrix = Matrix.of(1, list(range(3000)), rows)
        assert matrix.codes is None
        unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
        query = unit[42].astype(np.float64)
        truth = np.argsort(-(unit.astype(np.float64) @ query), kind="stable")[:5].tolist()
        assert [i for i, _ in matrix.nearest(query.tolist(), 5)] == truth
        assert [i for i, _ in matrix.nearest(query.tolist(), 5, first_pass=True)] == truth
        print(sqlite_vector_index())
        """
    )
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "simsimd not importable" in done.stdout


def test_a_query_without_direction_or_not_finite_is_scored_by_the_float32_pass_alike() -> None:
    rng = np.random.default_rng(9)
    matrix = Matrix.of(1, list(range(3_000)), unit_rows(rng, 3_000, 16))
    zero = [0.0] * 16
    assert matrix.nearest(zero, 5, first_pass=True) == matrix.nearest(zero, 5, first_pass=False)
    assert [score for _, score in matrix.nearest(zero, 5)] == [0.0] * 5
    broken = [float("nan")] + [0.1] * 15
    assert len(matrix.nearest(broken, 5, first_pass=True)) == 5  # no crash, no empty answer
    huge = [3e38] * 16  # float32's largest: its int8 scale is finite
    assert matrix.nearest(huge, 5, first_pass=True) == matrix.nearest(huge, 5, first_pass=False)
    with pytest.raises(ValueError, match="dimensions"):
        matrix.nearest([1.0] * 17, 5, first_pass=True)


def test_simsimds_int8_dot_products_are_exact_integers_at_the_extremes() -> None:
    """The bounds rest on it: every int32 sum exact, whatever the width's tail."""
    import simsimd

    rng = np.random.default_rng(10)
    for dims in (1, 3, 17, 64, 65, 384, 4_096):
        rows = rng.integers(-127, 128, (300, dims), dtype=np.int8)
        rows[:5], rows[5:10] = 127, -127
        for query in (rows[0], rows[5], rng.integers(-127, 128, dims, dtype=np.int8)):
            got = np.asarray(simsimd.cdist(query[None, :], rows, metric="dot"))[0]
            want = rows.astype(np.int64) @ query.astype(np.int64)
            assert np.array_equal(got, want.astype(np.float64)), dims
