"""One log record, one log line: control characters in what is logged are escaped.

A value a request carries (an id, a path, a header) may hold a newline, a carriage
return, NUL or a terminal escape. Logged as it is, a newline starts a line the caller
wrote, one that reads like the server's own (log forging), and an escape sequence
rewrites what a terminal shows. :class:`LogLineEscaping` escapes every control
character of a record's formatted message (``\\n``, ``\\r``, ``\\xNN``, ``\\uNNNN``; a
tab stays) and of the messages of its exception, so no value reaches the log able to
start a line, whichever log call wrote it and however it was formatted. A traceback
keeps its lines: only its frames (the server's own code) start them.

:func:`install_log_filters` puts it, and the secret redaction of
:mod:`corral.core.redaction`, on every handler configured by then.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Iterator
from types import TracebackType

from corral.core.redaction import install_log_redaction

__all__ = ["LogLineEscaping", "escape_controls", "install_log_filters"]

#: C0 controls but the tab, DEL, C1 controls, and the Unicode line and paragraph separators
_CONTROLS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r"}
_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` with every control character escaped (see the module docstring)."""
    return _CONTROLS.sub(_escape, text)


def _chain(exc: traceback.TracebackException) -> Iterator[str]:
    """The lines of a traceback, as ``logging`` prints them, its messages escaped."""
    if exc.__cause__ is not None:
        yield from _chain(exc.__cause__)
        yield _CAUSE
    elif exc.__context__ is not None and not exc.__suppress_context__:
        yield from _chain(exc.__context__)
        yield _CONTEXT
    if exc.stack:
        yield "Traceback (most recent call last):\n"
        yield from exc.stack.format()
    for line in exc.format_exception_only():
        yield escape_controls(line.removesuffix("\n")) + "\n"
    for index, member in enumerate(exc.exceptions or (), 1):  # an exception group's
        yield f"  +---------------- {index} ----------------\n"
        for line in "".join(_chain(member)).splitlines():
            yield f"    | {line}\n"


def exception_text(exc_info: ExcInfo) -> str:
    """The traceback of ``exc_info`` as ``logging`` prints it, its messages escaped."""
    text = "".join(_chain(traceback.TracebackException(*exc_info)))
    return text.removesuffix("\n")


class LogLineEscaping(logging.Filter):
    """A log handler filter that makes each record one line (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - bad arguments: the handler reports them as usual
            return True
        record.msg, record.args = escape_controls(message), None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            exc_type, exc, tb = record.exc_info
            assert exc_type is not None
            record.exc_text = exception_text((exc_type, exc, tb))
        return True


def install_log_filters() -> None:
    """:class:`LogLineEscaping`, then the secret redaction, on every handler configured
    by now (the root logger's, uvicorn's) and the handler of last resort."""
    install_log_redaction()
    loggers = [logging.getLogger(), *logging.root.manager.loggerDict.values()]
    handlers = [h for lg in loggers if isinstance(lg, logging.Logger) for h in lg.handlers]
    for handler in [*handlers, logging.lastResort]:
        if handler is None or any(isinstance(f, LogLineEscaping) for f in handler.filters):
            continue
        # first: the redaction after it sees the escaped text (it knows escaped forms)
        handler.filters.insert(0, LogLineEscaping())
