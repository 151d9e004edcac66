"""Section 8b, memory vectors alone: one exact top-k over a cached scope matrix.

The vector half of a hybrid search (``bench/memory.py``) without the store: ``size``
unit vectors of ``dims`` floats (the same seed as section 8) in a
:class:`~corral.store.sql.vector_cache.Matrix`, and ``queries`` query vectors, top
``limit`` (50: the fusion pool of a hybrid search). Rows:

- ``float32 pass``: every row scored exactly (simsimd's float32 dot product row by
  row, or numpy's matrix product without simsimd);
- ``int8 first pass``: int8 dot products of every row, then the rows the error bound
  cannot rule out scored in float32 (the same answer; ``rescored`` is their mean count);
- ``numpy float32 matrix product``: ``vectors @ query`` alone, the search before the
  int8 pass (no selection of the top k).

Latency p50 and p99 in milliseconds, one thread unless ``--threads``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
from _common import percentile


def run(size: int, dims: int, queries: int, limit: int) -> dict[str, Any]:
    from memory import dataset

    from corral.store.sql.vector_cache import Matrix
    from corral.store.sql.vector_scan import candidates

    _, vectors, _, query_vectors = dataset(size, dims, queries)
    began = time.perf_counter()
    matrix = Matrix.of(1, list(range(size)), vectors)
    load_ms = 1000 * (time.perf_counter() - began)
    timings: dict[str, list[float]] = {"float32 pass": [], "int8 first pass": []}
    timings["numpy float32 matrix product"] = []
    rescored: list[int] = []
    for query in query_vectors:
        values = query.tolist()
        for name, first_pass in (("float32 pass", False), ("int8 first pass", True)):
            began = time.perf_counter()
            matrix.nearest(values, limit, first_pass=first_pass)
            timings[name].append(1000 * (time.perf_counter() - began))
        began = time.perf_counter()
        matrix.vectors @ query
        timings["numpy float32 matrix product"].append(1000 * (time.perf_counter() - began))
        if matrix.codes is not None:
            kept = candidates(matrix.codes, query, limit, None)
            rescored.append(size if kept is None else len(kept))
    return {
        "rows": {
            name: {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99)}
            for name, ms in timings.items()
        },
        "rescored": float(np.mean(rescored)) if rescored else None,
        "quantise_and_load_ms": load_ms,
        "bytes": matrix.nbytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--dims", type=int, default=384)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1, help="threads of the int8 pass")
    args = parser.parse_args()
    from corral.store.sql import vector_scan

    vector_scan.THREADS = args.threads
    result = run(args.size, args.dims, args.queries, args.limit)
    for name, got in result["rows"].items():
        print(f"{name:32s} p50 {got['p50_ms']:7.2f} ms  p99 {got['p99_ms']:7.2f} ms")
    print(f"rows re-scored in float32: {result['rescored']}")
    print(f"matrix made (normalised, quantised) in {result['quantise_and_load_ms']:.0f} ms")
    print(f"matrix bytes: {result['bytes']:,}")


if __name__ == "__main__":
    main()
