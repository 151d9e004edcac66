"""Corral's event streams read by a parser nobody here wrote: the official ``openai`` SDK's.

Its SSE decoder turns every blank-line-ended block into an event once it has seen
an ``id`` or a ``retry`` (even a block with no ``data``), and its stream then
decodes each event's data as JSON. So a lone ``retry:`` block, or a keep-alive
comment followed by a blank line, broke it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from server_harness import LiveServer, apply, echo_turn, resources


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # keep-alives every 50 ms, so a 0.5 s tool call puts several between two events
    with LiveServer(
        tmp_path_factory.mktemp("home"), poll_seconds=0.05, keepalive_seconds=0.05
    ) as live:
        yield live


def read_with_openai_sdk(server: LiveServer, run_id: str) -> list[Any]:
    """The run's events as the openai SDK's own stream parses them."""
    sdk = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.admin, max_retries=0)
    with sdk:
        stream = sdk.get(
            f"/runs/{run_id}/events",
            cast_to=object,
            stream=True,
            stream_cls=openai.Stream[object],
            options={"headers": {"Accept": "text/event-stream"}},
        )
        return list(stream)


def test_the_openai_sdk_reads_a_whole_event_stream_with_keep_alives(server: LiveServer) -> None:
    with server.client(server.admin) as client:
        apply(client, resources("sdk-reader", [echo_turn("hi", 0.5), "{text: done}"]))
        submitted = client.post("/v1/tasks", json={"agent": "sdk-reader", "input": "go"})
        assert submitted.status_code == 201
        run_id = submitted.json()["id"]

    events = read_with_openai_sdk(server, run_id)

    types = [event.get("type") for event in events[:-1]]
    assert types[0] == "run.start" and types[-1] == "run.finish"
    assert [event["seq"] for event in events[:-1]] == list(range(1, len(events)))
    assert events[-1] == {"state": "succeeded"}  # the ``end`` event


def test_the_first_message_carries_the_retry_interval(server: LiveServer) -> None:
    with server.client(server.admin) as client:
        apply(client, resources("retry-first", ["{text: done}"]))
        run_id = client.post("/v1/tasks", json={"agent": "retry-first", "input": "go"}).json()["id"]
        headers = {"Accept": "text/event-stream"}
        with client.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as response:
            body = response.read().decode()

    first = body.split("\n\n")[0].splitlines()
    assert first[0] == "retry: 1000"
    assert first[1:3] == ["id: 1", "event: run.start"]
    assert body.count("retry:") == 1
