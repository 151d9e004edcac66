"""Section 8, memory: ingest and hybrid search of a Memory, beside ChromaDB.

The same precomputed data for every row: ``size`` entries of 40 words drawn from a
vocabulary of 5,000 made-up words, each with a unit vector of ``dims`` floats
(numpy, a fixed seed), and ``queries`` queries (three words and a vector each). No
embedding model runs: what is measured is storing and searching.

- ``corral, SQLite`` / ``corral, PostgreSQL``: the store's memory operations as the
  store backend calls them - ``write_memories`` in batches of ``batch`` entries (one
  transaction each, the full-text index and the vectors written with the entries),
  then ``search_memory`` with the query's words and vector: full text and an exact
  cosine over every vector of the scope, fused by reciprocal rank fusion, top 10.
  Each row says how it searched vectors (pgvector's ``<=>``, or the scope's vectors
  cached in process: an int8 first pass, the rows it cannot rule out scored in float32).
  "first search" is the first query after the load: it reads the scope's vectors (and
  its texts, into the full-text index) into the caches (every later one finds
  them there); "after a write" is a query right after one more entry is written (the
  caches are brought up to date from the scope's noted changes, not reloaded). "full
  text" is the same queries' words alone (no vector), after the hybrid ones.
- ``chromadb``: an embedded ``PersistentClient`` in a temporary directory (persisted,
  as the store is), ``collection.add`` in the same batches with the texts as documents,
  then ``collection.query`` with the query vector, top 10: its HNSW index
  (approximate, vectors only: no full text, no fusion).

Each (row, size) is a child process (``memory.py --child``). Ingest is entries per
second over the whole load; search latency p50 and p99 over the queries, after a few
untimed ones. PostgreSQL is a scratch database beside ``CORRAL_BENCH_POSTGRES_URL``
(default ``postgresql://postgres@127.0.0.1:5432/test``), dropped after; a row says
"not reachable" or "not installed" when it cannot run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import emit, fmt, percentile, run_child, scratch_database, table

BENCH = Path(__file__).resolve().parent
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
#: the issue's targets
TARGET_P50_MS = 10.0
TARGET_SIZE = 100_000

ROWS = ("corral, SQLite", "corral, PostgreSQL", "chromadb")
WORDS_PER_ENTRY = 40
VOCABULARY = 5_000
WARMUP = 3


@dataclass(frozen=True)
class Config:
    """How much to measure."""

    sizes: tuple[int, ...] = (10_000, 100_000)
    dims: int = 384
    queries: int = 100
    #: PostgreSQL without pgvector scans in SQL: fewer queries keep the run bearable
    postgres_queries: int = 20
    batch: int = 1_000
    rows: tuple[str, ...] = field(default=ROWS)
    timeout: float = 1_800.0


# --------------------------------------------------------------------------- the data


def dataset(size: int, dims: int, queries: int) -> tuple[list[str], Any, list[str], Any]:
    """Texts and unit vectors of the entries, and of the queries (the same every run)."""
    import numpy as np

    rng = np.random.default_rng(18)
    vocabulary = [f"w{n:04d}{'abcdefghij'[n % 10]}" for n in range(VOCABULARY)]
    # Zipf-like: a few common words, many rare ones, as in text
    weights = 1.0 / np.arange(1, VOCABULARY + 1)
    weights /= weights.sum()
    picks = rng.choice(VOCABULARY, size=(size, WORDS_PER_ENTRY), p=weights)
    texts = [" ".join(vocabulary[i] for i in row) for row in picks]
    vectors = rng.standard_normal((size, dims)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    asked = rng.choice(VOCABULARY, size=(queries, 3), p=weights)
    query_texts = [" ".join(vocabulary[i] for i in row) for row in asked]
    query_vectors = rng.standard_normal((queries, dims)).astype(np.float32)
    query_vectors /= np.linalg.norm(query_vectors, axis=1, keepdims=True)
    return texts, vectors, query_texts, query_vectors


# --------------------------------------------------------------------------- corral


@contextlib.asynccontextmanager
async def _database(row: str, tmp: str) -> AsyncIterator[str]:
    if row == "corral, SQLite":
        yield f"sqlite:///{tmp}/corral.db"
        return
    postgres_url = os.environ.get("CORRAL_BENCH_POSTGRES_URL") or DEFAULT_POSTGRES_URL
    name = f"corral_bench_memory_{secrets.token_hex(4)}"
    async with scratch_database(postgres_url, name) as url:
        yield url


async def _corral(row: str, size: int, dims: int, queries: int, batch: int) -> dict[str, Any]:
    from corral.core.memory import MemoryEntry, MemoryPlace, MemoryVector, embedder_id
    from corral.store import open_store

    texts, vectors, query_texts, query_vectors = dataset(size, dims, queries)
    place = MemoryPlace("default", "bench")
    made_by = embedder_id("bench", dims)
    with tempfile.TemporaryDirectory(prefix="corral-bench-memory-") as tmp:
        async with _database(row, tmp) as url, await open_store(url) as store:
            started = time.perf_counter()
            for start in range(0, size, batch):
                chunk = range(start, min(start + batch, size))
                await store.write_memories(
                    [MemoryEntry("default", "bench", "", f"e{n}", texts[n]) for n in chunk],
                    [MemoryVector(made_by, vectors[n].tolist()) for n in chunk],
                )
            ingest_s = time.perf_counter() - started
            ms: list[float] = []
            first_ms = 0.0
            for n in range(queries + WARMUP):
                q = n % queries
                vector = MemoryVector(made_by, query_vectors[q].tolist())
                began = time.perf_counter()
                hits = await store.search_memory(place, query_texts[q], top_k=10, vector=vector)
                if n == 0:  # loads the scope's vectors into the cache
                    first_ms = 1000 * (time.perf_counter() - began)
                if n >= WARMUP:
                    ms.append(1000 * (time.perf_counter() - began))
                assert hits, "a hybrid search always finds vectors"
            text_ms: list[float] = []
            for n in range(queries + WARMUP):
                began = time.perf_counter()
                await store.search_memory(place, query_texts[n % queries], top_k=10)
                if n >= WARMUP:
                    text_ms.append(1000 * (time.perf_counter() - began))
            await store.write_memories(
                [MemoryEntry("default", "bench", "", "one more", texts[0])],
                [MemoryVector(made_by, vectors[0].tolist())],
            )
            began = time.perf_counter()
            await store.search_memory(place, query_texts[0], top_k=10, vector=vector)
            after_write_ms = 1000 * (time.perf_counter() - began)
            index = await store.memory_vector_index()
    return {
        "ingest_per_s": size / ingest_s,
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "text_p50_ms": percentile(text_ms, 50),
        "text_p99_ms": percentile(text_ms, 99),
        "first_ms": first_ms,
        "after_write_ms": after_write_ms,
        "index": index,
    }


# --------------------------------------------------------------------------- chromadb


def _chromadb(size: int, dims: int, queries: int, batch: int) -> dict[str, Any]:
    import chromadb

    texts, vectors, _, query_vectors = dataset(size, dims, queries)
    with tempfile.TemporaryDirectory(prefix="corral-bench-chroma-") as tmp:
        client = chromadb.PersistentClient(path=tmp)
        collection = client.create_collection("bench", metadata={"hnsw:space": "cosine"})
        started = time.perf_counter()
        for start in range(0, size, batch):
            end = min(start + batch, size)
            collection.add(
                ids=[f"e{n}" for n in range(start, end)],
                embeddings=vectors[start:end],
                documents=texts[start:end],
            )
        ingest_s = time.perf_counter() - started
        ms: list[float] = []
        for n in range(queries + WARMUP):
            began = time.perf_counter()
            found = collection.query(query_embeddings=[query_vectors[n % queries]], n_results=10)
            if n >= WARMUP:
                ms.append(1000 * (time.perf_counter() - began))
            assert found["ids"] and found["ids"][0]
        version = chromadb.__version__
    return {
        "ingest_per_s": size / ingest_s,
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "index": f"chromadb {version} (HNSW, approximate, vectors only)",
    }


def child(row: str, size: int, dims: int, queries: int, batch: int) -> dict[str, Any]:
    if row == "chromadb":
        return _chromadb(size, dims, queries, batch)
    return asyncio.run(_corral(row, size, dims, queries, batch))


# --------------------------------------------------------------------------- the section


def _unavailable(row: str) -> str | None:
    """Why ``row`` cannot run here, or ``None``."""
    import importlib.util

    if row == "chromadb" and importlib.util.find_spec("chromadb") is None:
        return "not installed (make bench installs it in bench/.venv)"
    return None


def run(config: Config, log: Any = print) -> dict[str, Any]:
    """One child process per row and size."""
    samples: dict[str, dict[str, Any]] = {}
    status: dict[str, str] = {}
    for row in config.rows:
        why = _unavailable(row)
        if why is not None:
            status[row] = why
            log(f"[memory] {row}: {why}")
            continue
        status[row] = "ok"
        for size in config.sizes:
            queries = config.postgres_queries if row == "corral, PostgreSQL" else config.queries
            got = run_child(
                [
                    str(BENCH / "memory.py"),
                    "--child",
                    f"--row={row}",
                    f"--size={size}",
                    f"--dims={config.dims}",
                    f"--queries={queries}",
                    f"--batch={config.batch}",
                ],
                timeout=config.timeout,
                env={"PYTHONPATH": str(BENCH) + os.pathsep + os.environ.get("PYTHONPATH", "")},
            )
            if not got.ok:
                reason = got.error or "failed"
                if row == "corral, PostgreSQL" and ("connect" in reason.lower()):
                    reason = f"not reachable ({reason})"
                status[row] = reason
                log(f"[memory] {row} at {size}: {reason}")
                break
            samples[f"{row}@{size}"] = {**got.data, "queries": queries}
            log(
                f"[memory] {row} at {size}: ingest {got.data['ingest_per_s']:.0f}/s, "
                f"search p50 {got.data['p50_ms']:.2f} ms, p99 {got.data['p99_ms']:.2f} ms"
            )
    return {
        "sizes": list(config.sizes),
        "dims": config.dims,
        "batch": config.batch,
        "target_p50_ms": TARGET_P50_MS,
        "samples": samples,
        "status": status,
    }


def sample(result: dict[str, Any], row: str, size: int) -> dict[str, Any] | None:
    return result["samples"].get(f"{row}@{size}")  # type: ignore[no-any-return]


def render(result: dict[str, Any]) -> str:
    """Ingest rate and search latency per row and size, and how each searched."""
    header = [
        "store",
        "entries",
        "ingest /s",
        "first search ms",
        "after a write ms",
        "search p50 ms",
        "search p99 ms",
        "full text p50 ms",
        "full text p99 ms",
        "vector search",
    ]
    rows: list[list[str]] = []
    for row in ROWS:
        if row not in result["status"]:
            continue
        for size in result["sizes"]:
            got = sample(result, row, size)
            if got is None:
                rows.append([row, f"{size:,}", result["status"].get(row, "failed"), *[""] * 7])
                continue
            rows.append(
                [
                    row,
                    f"{size:,}",
                    fmt(got["ingest_per_s"], 0),
                    fmt(got["first_ms"], 1) if "first_ms" in got else "",
                    fmt(got["after_write_ms"], 1) if "after_write_ms" in got else "",
                    fmt(got["p50_ms"], 2),
                    fmt(got["p99_ms"], 2),
                    fmt(got["text_p50_ms"], 2) if "text_p50_ms" in got else "",
                    fmt(got["text_p99_ms"], 2) if "text_p99_ms" in got else "",
                    got["index"],
                ]
            )
    return table(header, rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--row", default="corral, SQLite")
    parser.add_argument("--size", type=int, default=1_000)
    parser.add_argument("--dims", type=int, default=384)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--only", action="append", choices=ROWS, help="rows to run (all)")
    args = parser.parse_args(argv)
    if args.child:
        emit(child(args.row, args.size, args.dims, args.queries, args.batch))
        return
    config = Config(
        sizes=(args.size,),
        dims=args.dims,
        queries=args.queries,
        batch=args.batch,
        rows=tuple(args.only or ROWS),
    )
    print(render(run(config, lambda line: print(line, file=sys.stderr))))


if __name__ == "__main__":
    main()
