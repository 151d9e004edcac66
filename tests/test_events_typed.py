"""The typed journal (:mod:`corral.core.events`): one payload class per event type, a
JSON form that round-trips, and docs/api.md's event table generated from the classes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from corral.api import EventOut
from corral.core.errors import (
    BudgetExceededError,
    CorralError,
    DocumentTooComplexError,
    ModelError,
    ToolError,
)
from corral.core.events import (
    ChildFinishData,
    ErrorData,
    Event,
    EventType,
    HandoffData,
    MessageSendData,
    RunFinishData,
    ToolResultData,
    event_table,
    parse_event_data,
    payload_class,
)
from corral.core.memory import MemoryBackendError
from corral.core.redaction import RedactedError

API_DOC = Path(__file__).parent.parent / "docs" / "api.md"


def test_every_event_type_has_its_payload_class() -> None:
    for kind in EventType:
        assert payload_class(kind).TYPE is kind


def test_docs_api_event_table_is_the_generated_one() -> None:
    text = API_DOC.read_text()
    found = re.search(r"<!-- events:begin -->\n(.*?)\n<!-- events:end -->", text, re.S)
    assert found is not None, "docs/api.md lost its events:begin/end markers"
    assert found.group(1) == event_table(), (
        "docs/api.md's event table differs from corral.core.events: paste event_table()"
    )


def test_required_fields_are_written_even_when_null_and_optional_ones_only_with_a_value() -> None:
    result = ToolResultData(step=1, call_id="c1", tool="add", output="5", error=None)
    assert result.to_dict() == {
        "step": 1,
        "call_id": "c1",
        "tool": "add",
        "output": "5",
        "error": None,
        "attempts": 1,
    }
    # keys in declaration order: the stored JSON's bytes are the release's
    assert list(result.to_dict()) == ["step", "call_id", "tool", "output", "error", "attempts"]


def test_a_key_that_is_a_python_keyword_keeps_its_json_name() -> None:
    handoff = HandoffData(step=2, call_id="c", from_agent="triage", to="billing", reason="r")
    assert handoff.to_dict()["from"] == "triage"
    assert HandoffData.from_dict(handoff.to_dict()) == handoff
    sent = MessageSendData(message_id="m", to="b", kind="input")
    assert "from" not in sent.to_dict()  # the system's input has no sender


@pytest.mark.parametrize(
    "payload",
    [
        ChildFinishData(run_id="run_1", agent="a", state="succeeded", usage={"input_tokens": 3}),
        ErrorData(code="budget_exceeded", message="over", limit="max_cost_usd"),
        RunFinishData(state="succeeded", output={"n": 7}, steps=2),
    ],
)
def test_payloads_round_trip_through_their_json(payload: Any) -> None:
    text = json.dumps(payload.to_dict())
    assert parse_event_data(payload.TYPE, json.loads(text)) == payload


def test_a_payload_missing_a_required_field_is_refused_with_its_name() -> None:
    with pytest.raises(ValueError, match=r"tool\.call event lacks call_id"):
        parse_event_data(EventType.TOOL_CALL, {"step": 1, "tool": "add", "arguments": "{}"})


def test_an_unknown_key_is_ignored_and_an_unknown_type_refused() -> None:
    assert parse_event_data("step.start", {"step": 3, "later": "field"}).to_dict() == {"step": 3}
    with pytest.raises(ValueError):
        parse_event_data("no.such.type", {})


def test_an_error_event_keeps_every_field_an_error_describes_itself_with() -> None:
    error = {
        "code": "model_error",
        "message": "503",
        "retryable": True,
        "status_code": 503,
        "endpoint": "primary",
    }
    event = ErrorData.of(error, retry=2, max_attempts=3, retry_in=1.5)
    assert event.to_dict() == {**error, "retry": 2, "max_attempts": 3, "retry_in": 1.5}


def test_the_wire_form_carries_the_json_object_and_reads_back_typed() -> None:
    event = Event("run_1", 4, ToolResultData(step=1, call_id="c", tool="t", output=1, error=None))
    wire = EventOut.from_event(event)
    assert wire.type is EventType.TOOL_RESULT and wire.data == event.data.to_dict()
    again = EventOut.model_validate_json(wire.model_dump_json())
    assert again.payload() == event.data


def _error_classes_with_their_own_to_dict() -> set[type[CorralError]]:
    found: set[type[CorralError]] = set()
    stack: list[type[CorralError]] = [CorralError]
    while stack:
        cls = stack.pop()
        if "to_dict" in vars(cls):
            found.add(cls)
        stack.extend(cls.__subclasses__())
    return found


def test_an_error_event_holds_every_key_of_every_error_a_run_can_end_with() -> None:
    errors: list[CorralError] = [
        CorralError("plain"),
        ModelError("503", retryable=True, status_code=503, endpoint="primary"),
        ToolError("timeout", "slow", retryable=True, details={"after": 3}),
        BudgetExceededError("max_cost_usd", "over", inherited=True),
        DocumentTooComplexError("max_depth", "too deep"),
        RedactedError({"code": "model_error", "message": "[REDACTED:key]", "retryable": False}),
        MemoryBackendError("down", code=sorted(MemoryBackendError.CODES)[0], retryable=True),
    ]
    # a new to_dict (new keys) must join the list above before its keys can be lost
    assert _error_classes_with_their_own_to_dict() <= {type(e) for e in errors}
    for error in errors:
        described = error.to_dict()
        assert ErrorData.of(described).to_dict() == described, type(error)
    gave_up = {"code": "corral_error", "message": "gave up", "cause": {"code": "x", "message": "y"}}
    assert ErrorData.of(gave_up).to_dict() == gave_up
