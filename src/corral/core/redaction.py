"""Redaction: every secret value a run resolved is replaced by ``[REDACTED:name]``.

A :class:`Redactor` is built once per live agent from every secret its build
resolved (tool and MCP secrets, model API keys, the password of a basic-auth
secret) and every other Secret of its namespace, and passes every string a run
stores or returns: events, the run's error, output and messages, approvals,
session messages. It works on decoded
strings (before anything is encoded) and also knows the forms a secret takes
once text about it was encoded elsewhere:

- in upper and in lower case;
- escaped: JSON (``\\"``, ``\\\\``, ``\\n``, ``\\u00e9``), also twice (JSON text inside a JSON
  string), a Python repr, percent-encoding (of each case too);
- encoded, for values of :data:`MIN_ENCODED_LENGTH` characters or more: base64 and
  base64url (each at the three alignments a value can have inside a longer
  encoded text, so ``Basic base64(user:password)`` is caught), and hex.

Values shorter than :data:`MIN_SECRET_LENGTH` characters are not redacted: they
would mangle ordinary text (a ``Secret`` shorter than 8 characters is refused unless it
says ``allow_short``). Out of scope: a value reversed, split in pieces, in mixed
case, or encoded in a way not listed here. A redactor of a few forms (at most
:data:`SCAN_FORMS`: a handful of secrets) looks for them with plain substring searches; one of more
forms uses one compiled regex alternation, so text without a match costs one
``search``. The regexes are compiled when first needed: a run of an agent with
links gets a fresh agent token, and a redactor for it, per tool call, and
compiling the alternation of a token's forms took milliseconds. A redactor
without secrets is falsy so callers skip it.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import logging
import re
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from functools import cached_property
from typing import Any

from corral.core.errors import CorralError
from corral.core.messages import Message, dump_messages, load_messages
from corral.core.runs import PendingApproval

#: values shorter than this are never redacted (they would mangle ordinary text)
MIN_SECRET_LENGTH = 4
#: base64, base64url and hex forms are redacted only for values at least this long
MIN_ENCODED_LENGTH = 8
#: up to this many forms, a redactor finds them by substring search, without a regex
SCAN_FORMS = 64

Secrets = Mapping[str, str] | Iterable[tuple[str, str]]


class Redactor:
    """Replaces known secret values, in every form listed above, with ``[REDACTED:name]``."""

    def __init__(self, secrets: Secrets | None = None) -> None:
        pairs = secrets.items() if isinstance(secrets, Mapping) else (secrets or ())
        self.secrets: dict[str, str] = {}  # value -> name
        for name, value in pairs:
            if len(value) >= MIN_SECRET_LENGTH:
                self.secrets.setdefault(value, name)
        names: dict[str, str] = {}  # form -> name
        # longest values first: a form two values share is named after the longer one
        for value, name in sorted(self.secrets.items(), key=lambda p: -len(p[0])):
            for form in _forms(value):
                names.setdefault(form, name)
        self._names = names
        #: the length of the longest form (what a stream holds back, see :meth:`stream`)
        self.longest = max(map(len, names), default=0)
        self._scan = len(names) <= SCAN_FORMS

    def __bool__(self) -> bool:
        return bool(self._names)

    @cached_property
    def _pattern(self) -> re.Pattern[str]:
        # longest first: at one position the longest form wins (re takes the first that matches)
        return re.compile(_alternation(self._names))

    @cached_property
    def _overlapping(self) -> re.Pattern[str]:
        return re.compile(f"(?=({_alternation(self._names)}))")

    @cached_property
    def _encoded_forms(self) -> frozenset[str]:
        """What any form looks like once the data holding it is encoded (see :meth:`data`)."""
        return frozenset({_ENCODE(f)[1:-1] for f in self._names} | set(self._names))

    @cached_property
    def _encoded(self) -> re.Pattern[str]:
        return re.compile(_alternation(self._encoded_forms))

    def _first_match(self, text: str) -> int:
        """Where the first form in ``text`` begins (-1: none is in it)."""
        if self._scan:
            found = [at for form in self._names if (at := text.find(form)) >= 0]
            return min(found, default=-1)
        match = self._pattern.search(text)
        return -1 if match is None else match.start()

    def merged(self, other: Redactor) -> Redactor:
        """A redactor that knows the secrets of both."""
        if not other:
            return self
        if not self:
            return other
        pairs = [(n, v) for v, n in self.secrets.items()]
        return Redactor(pairs + [(n, v) for v, n in other.secrets.items()])

    def text(self, value: str) -> str:
        """``value`` with every form of every secret replaced."""
        if not self._names:
            return value
        start = self._first_match(value)
        if start < 0:
            return value
        return self._replace(value, start)

    def data(self, value: Any) -> Any:
        """JSON-like data with every string in it (keys too) redacted: ``value`` itself when
        nothing in it names a secret, else a redacted copy."""
        if not self._names:
            return value
        if isinstance(value, str):
            return self.text(value)
        # One C-level encoding and one scan decide whether to walk the data at all: JSON
        # escapes each character on its own, so a string holding any form shows that form
        # escaped in the encoding, and `_encoded` knows every form escaped.
        with contextlib.suppress(TypeError, ValueError):  # not JSON data: walk it below
            encoded = _ENCODE(value)
            if self._scan:
                if not any(form in encoded for form in self._encoded_forms):
                    return value
            elif self._encoded.search(encoded) is None:
                return value
        return self._data(value)

    def found_in(self, text: str) -> bool:
        """Whether ``text`` holds any form of any secret."""
        return bool(self._names) and self._first_match(text) >= 0

    def _data(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self._data(k): self._data(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._data(v) for v in value]
        return value

    def messages(self, messages: list[Message]) -> list[Message]:
        """The messages with every string in them redacted (the same list when there is
        nothing to redact)."""
        if not self._names or not messages:
            return messages
        dumped = dump_messages(messages)
        redacted = self.data(dumped)
        return messages if redacted is dumped else load_messages(redacted)

    def approval(self, pending: PendingApproval) -> PendingApproval:
        """A pending approval with its arguments and reason redacted."""
        if not self._names:
            return pending
        return dataclasses.replace(
            pending, arguments=self.text(pending.arguments), reason=self.text(pending.reason)
        )

    def cut_after(self, text: str, cut: int) -> int:
        """``cut``, moved past the end of any secret that begins before it."""
        if self._names and self._first_match(text) >= 0:
            for match in self._pattern.finditer(text):
                if match.start() >= cut:
                    break
                cut = max(cut, match.end())
        return cut

    def stream(self) -> StreamRedaction:
        """A redaction of text that arrives in pieces (a model's streamed answer)."""
        return StreamRedaction(self)

    def error(self, exc: CorralError) -> CorralError:
        """``exc`` itself when it names no secret, else a :class:`RedactedError` in its place."""
        if not self._names:
            return exc
        data = exc.to_dict()
        redacted = self.data(data)
        return exc if redacted == data else RedactedError(redacted)

    def _replace(self, value: str, start: int) -> str:
        """Replace every occurrence from ``start``; occurrences that overlap (one value
        ends where another begins) are replaced as one, so no character of either is left."""
        spans: list[tuple[int, int, str]] = []
        for match in self._overlapping.finditer(value, start):
            form = match.group(1)
            begin, end = match.start(), match.start() + len(form)
            if spans and begin < spans[-1][1]:
                first, last, name = spans[-1]
                if end > last:
                    spans[-1] = (first, end, name)
                continue
            spans.append((begin, end, self._names[form]))
        pieces: list[str] = []
        done = 0
        for begin, end, name in spans:
            pieces += [value[done:begin], f"[REDACTED:{name}]"]
            done = end
        pieces.append(value[done:])
        return "".join(pieces)


class StreamRedaction:
    """Redacts text that arrives in pieces, so that a secret split across two pieces is
    still caught: the last ``longest - 1`` characters wait for the next piece (or
    :meth:`flush`), since a secret may begin in them."""

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        self._hold = max(0, redactor.longest - 1)
        self._held = ""

    def feed(self, piece: str) -> str:
        """What of the text so far can be passed on now, redacted (may be empty)."""
        text = self._held + piece
        cut = self._redactor.cut_after(text, len(text) - self._hold)
        if cut <= 0:
            self._held = text
            return ""
        self._held = text[cut:]
        return self._redactor.text(text[:cut])

    def flush(self) -> str:
        """The rest, redacted: call once the stream has ended."""
        rest, self._held = self._held, ""
        return self._redactor.text(rest)


class RedactedError(CorralError):
    """An error whose description named a secret: its redacted ``to_dict`` under the same code."""

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(str(data.get("message", "")))
        self.code = str(data.get("code", CorralError.code))
        self._data = data

    def to_dict(self) -> dict[str, Any]:
        return dict(self._data)


_ENCODE = json.JSONEncoder(ensure_ascii=False, default=str, check_circular=False).encode


def _alternation(forms: Iterable[str]) -> str:
    return "|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True))


def _escaped(value: str) -> Iterator[str]:
    """``value`` escaped as JSON (once, and twice: JSON text inside a JSON string), a Python
    repr and percent-encoding do it."""
    for once in (json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]):
        yield once
        yield json.dumps(once)[1:-1]
        yield json.dumps(once, ensure_ascii=False)[1:-1]
    yield json.dumps(value, ensure_ascii=False)[1:-1].replace("/", "\\/")
    yield repr(value)[1:-1]
    yield repr(value + '"')[1:-2]  # the repr inside single quotes (``\\'``) whatever the value
    yield urllib.parse.quote(value, safe="")
    yield urllib.parse.quote_plus(value, safe="")


def _forms(value: str) -> Iterator[str]:
    """The forms of one secret value, itself first; each form at least 4 characters long."""
    yield value
    # as is, in upper and in lower case (what a program or a model may have made of it)
    for cased in dict.fromkeys((value, value.upper(), value.lower())):
        yield cased
        yield from _escaped(cased)
    if len(value) < MIN_ENCODED_LENGTH:
        return
    raw = value.encode("utf-8")
    yield raw.hex()
    yield raw.hex().upper()
    for shift in range(3):
        # Inside a longer text encoded in one piece the value starts at any byte offset:
        # the characters that encode only its own bits are the same at each offset mod 3.
        encoded = base64.b64encode(bytes(shift) + raw).decode("ascii").rstrip("=")
        first = -(-8 * shift // 6)  # the first character with none of the padding's bits
        last = 8 * (shift + len(raw)) // 6  # past the last character with only the value's bits
        stable = encoded[first:last]
        yield stable
        yield stable.replace("+", "-").replace("/", "_")


class LogRedaction(logging.Filter):
    """A log handler filter that redacts every secret any agent of this process resolved.

    Install it on the handlers that print (:func:`install_log_redaction`); agents add
    what they resolved with :func:`remember` when they are built.
    """

    redactor = Redactor()

    def filter(self, record: logging.LogRecord) -> bool:
        redactor = LogRedaction.redactor
        if not redactor:
            return True
        try:
            message = redactor.text(record.getMessage())
        except Exception:  # noqa: BLE001 - bad arguments: the handler reports them as usual
            return True
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redactor.text(record.exc_text)
        if record.stack_info:
            record.stack_info = redactor.text(record.stack_info)
        record.msg, record.args = message, None
        return True


def remember(redactor: Redactor) -> None:
    """Make the log filter know ``redactor``'s secrets too (they are never forgotten)."""
    if not set(redactor.secrets) <= set(LogRedaction.redactor.secrets):
        LogRedaction.redactor = LogRedaction.redactor.merged(redactor)


def install_log_redaction() -> None:
    """Add the :class:`LogRedaction` filter to every handler configured by now (the root
    logger's, uvicorn's) and to the handler of last resort (what prints when logging was
    never configured)."""
    loggers = [logging.getLogger(), *logging.root.manager.loggerDict.values()]
    handlers = [h for lg in loggers if isinstance(lg, logging.Logger) for h in lg.handlers]
    for handler in [*handlers, logging.lastResort]:
        if handler is None:
            continue
        if not any(isinstance(f, LogRedaction) for f in handler.filters):
            handler.addFilter(LogRedaction())
