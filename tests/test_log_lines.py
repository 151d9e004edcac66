"""One log record, one log line: what a request carries cannot start a line of the log,
whatever the log call (arguments, an f-string, an exception's message), and a
traceback keeps its lines."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from corral.core.log_lines import LogLineEscaping, escape_controls, install_log_filters

FORGED = "x\n2026-01-01 00:00:00,000 ERROR forged\r\x1b[2J\x00\u2028end"
ESCAPED = "x\\n2026-01-01 00:00:00,000 ERROR forged\\r\\x1b[2J\\x00\\u2028end"


@pytest.fixture
def printed() -> Iterator[io.StringIO]:
    """What the root logger's handler prints, the filters installed as the CLI does."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        install_log_filters()
        yield out
    finally:
        root.removeHandler(handler)


def lines(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


def test_a_value_logged_by_argument_or_formatted_in_is_escaped(printed: io.StringIO) -> None:
    log = logging.getLogger("corral.test")
    log.warning("task %s not found", FORGED)
    log.warning(f"task {FORGED} not found")  # a log site that formats itself
    log.warning("%r", {"id": FORGED})

    assert lines(printed) == [
        f"WARNING task {ESCAPED} not found",
        f"WARNING task {ESCAPED} not found",
        "WARNING {'id': 'x\\n2026-01-01 00:00:00,000 ERROR forged\\r\\x1b[2J\\x00\\u2028end'}",
    ]


def test_an_exceptions_message_is_escaped_and_its_traceback_keeps_its_lines(
    printed: io.StringIO,
) -> None:
    try:
        try:
            raise KeyError(FORGED)
        except KeyError as exc:
            raise ValueError(f"lookup of {FORGED}") from exc
    except ValueError:
        logging.getLogger("corral.test").exception("failed")

    shown = lines(printed)
    assert shown[0] == "ERROR failed"
    assert not [line for line in shown if line.startswith("2026")], shown
    assert f"ValueError: lookup of {ESCAPED}" in shown
    assert shown.count("Traceback (most recent call last):") == 2
    assert "The above exception was the direct cause of the following exception:" in shown
    assert any(line.startswith('  File "') for line in shown)


def test_the_members_of_an_exception_group_are_escaped(printed: io.StringIO) -> None:
    try:
        raise ExceptionGroup("several", [OSError(FORGED), RuntimeError("two\nlines")])
    except ExceptionGroup:
        logging.getLogger("corral.test").exception("failed")

    shown = lines(printed)
    assert not [line for line in shown if line.startswith(("2026", "lines"))], shown
    assert any(line.endswith(f"OSError: {ESCAPED}") for line in shown), shown
    assert any(line.endswith("RuntimeError: two\\nlines") for line in shown), shown


def test_a_record_whose_arguments_do_not_format_is_left_to_the_handler() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "%d", ("not a number",), None)
    assert LogLineEscaping().filter(record) is True
    assert (record.msg, record.args) == ("%d", ("not a number",))


def test_escaping_keeps_text_and_tabs_and_is_idempotent() -> None:
    text = "caf\u00e9 \U0001f511\tcolumn \\n stays"
    assert escape_controls(text) == text
    assert escape_controls(escape_controls(FORGED)) == ESCAPED
