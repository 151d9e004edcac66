"""Delegation on PostgreSQL + NATS with real ``corral worker`` processes: the SIGKILL test
of :mod:`test_delegation_durability` again, on the scale-out cluster of :mod:`test_scaleout`
(child runs and woken parents reach the workers as NATS deliveries)."""

from __future__ import annotations

from nats_servers import nats_prefix_fixture, nats_server_url_fixture
from test_delegation_durability import (
    test_sigkill_while_a_child_runs_resumes_one_child_and_finishes_the_parent_once,
)
from test_durability import fake_openai_fixture, openai_server_fixture
from test_scaleout import cluster

__all__ = [
    "cluster",
    "fake_openai_fixture",
    "nats_prefix_fixture",
    "nats_server_url_fixture",
    "openai_server_fixture",
    "test_sigkill_while_a_child_runs_resumes_one_child_and_finishes_the_parent_once",
]
