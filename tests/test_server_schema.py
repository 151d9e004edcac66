"""Property-based run of /openapi.json (schemathesis) against a real server.

Every operation gets a bounded number of generated requests, valid and invalid.
The server must never answer 5xx, must reject what the schema forbids, and every
response must match the schema (status, content type, body, headers). The server
runs without workers: generated resources are stored but nothing ever executes
them, and a prompt can only wait (for at most a fraction of a second).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from server_harness import LiveServer, apply, echo_turn, resources

#: generated requests per operation and mode; each takes milliseconds
EXAMPLES = 6
#: "A request valid per the schema is accepted" does not hold for an API that checks
#: meaning too: a well-formed submit naming an agent that does not exist is a 422.
EXCLUDED = [positive_data_acceptance]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("home"), workers=0, max_prompt_seconds=0.2) as server:
        with server.client(server.admin) as client:
            apply(client, resources("helper", [echo_turn("x"), "{text: done}"]))
            client.post("/v1/tasks", json={"agent": "helper", "input": "x"})
        yield server


def test_generated_requests_never_break_the_server_or_the_schema(live: LiveServer) -> None:
    schema = schemathesis.openapi.from_url(f"{live.url}/openapi.json")
    headers = {"Authorization": f"Bearer {live.admin}"}
    failures: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        for mode in GenerationMode:

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                derandomize=True,
                database=None,
                phases=[Phase.explicit, Phase.generate],
            )
            def check(case: Case) -> None:
                case.call_and_validate(
                    base_url=live.url, headers=headers, excluded_checks=EXCLUDED, timeout=10
                )

            try:
                check()
            except Unsatisfiable:  # no parameters, no body: no invalid request to make
                assert mode is GenerationMode.NEGATIVE
            except (Exception, BaseExceptionGroup) as exc:  # one report for all operations
                failures.append(f"{operation.label} ({mode}):\n{exc}")
    assert operations >= 25
    assert not failures, "\n\n".join(failures)
