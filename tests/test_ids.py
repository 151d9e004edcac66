"""Ids: unique, prefixed, sortable, and never shared with a forked process."""

from __future__ import annotations

import multiprocessing
import re
from multiprocessing.connection import Connection

from corral.core.ids import new_id

ID = re.compile(r"^run_[0-9a-hjkmnp-tv-z]{26}$")


def test_ids_are_unique_over_many_reads_of_the_random_source() -> None:
    ids = [new_id("run") for _ in range(5_000)]  # (the random bytes are read in pools)
    assert len(set(ids)) == len(ids)
    assert all(ID.match(i) for i in ids)
    millis = [i[:14] for i in ids]  # (the prefix and 10 digits of milliseconds)
    assert millis == sorted(millis)  # made later, sorted later


def _ids_in_child(out: Connection) -> None:
    out.send([new_id("run") for _ in range(20)])


def test_a_forked_process_makes_ids_of_its_own() -> None:
    new_id("run")  # the pool is filled: a fork would inherit it
    fork = multiprocessing.get_context("fork")
    receive, send = fork.Pipe(duplex=False)
    child = fork.Process(target=_ids_in_child, args=(send,))
    child.start()
    theirs = receive.recv()
    child.join(10)
    ours = [new_id("run") for _ in range(20)]
    assert child.exitcode == 0
    assert {i[14:] for i in theirs}.isdisjoint(i[14:] for i in ours)  # the random parts
