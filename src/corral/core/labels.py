"""Labels on runs (``corral submit -l key=value``, the API's ``labels``): one rule for every door.

Labels are free text, as resources' are, within what a label selector
(:mod:`corral.core.selectors`) can name: a key of 1 to :data:`MAX_KEY` characters and a
value of at most :data:`MAX_VALUE` (it may be empty), text of any script without
``,``, ``=``, ``!``, without control, format, private-use or separator characters
other than the space (:data:`REFUSED`), and without surrounding spaces
(``équipe=café`` works); at most :data:`MAX_LABELS` labels on a run. The OpenAPI
document says the same as JSON Schema (:func:`labels_schema`).
"""

from __future__ import annotations

import bisect
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

from corral.core.errors import UserError

#: the longest key and value (characters), and the most labels on one run
MAX_KEY = 63
MAX_VALUE = 63
MAX_LABELS = 32
#: what a selector cannot name inside a key or a value
_FORBIDDEN = set(",=!")
#: the unicode categories no label holds: control, format, surrogate, private use, line
#: and paragraph separators, and space separators other than the space itself
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp", "Zs"})
#: the characters no label holds, as inclusive ranges of code points: ``,=!`` and the
#: categories above, as Unicode 14 has them (a test checks them against the Python's)
REFUSED: tuple[tuple[int, int], ...] = (
    (0x0, 0x1F), (0x21, 0x21), (0x2C, 0x2C), (0x3D, 0x3D), (0x7F, 0xA0), (0xAD, 0xAD),
    (0x600, 0x605), (0x61C, 0x61C), (0x6DD, 0x6DD), (0x70F, 0x70F), (0x890, 0x891),
    (0x8E2, 0x8E2), (0x1680, 0x1680), (0x180E, 0x180E), (0x2000, 0x200F), (0x2028, 0x202F),
    (0x205F, 0x2064), (0x2066, 0x206F), (0x3000, 0x3000), (0xD800, 0xF8FF), (0xFEFF, 0xFEFF),
    (0xFFF9, 0xFFFB), (0x110BD, 0x110BD), (0x110CD, 0x110CD), (0x13430, 0x13438),
    (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0001, 0xE0001), (0xE0020, 0xE007F),
    (0xF0000, 0xFFFFD), (0x100000, 0x10FFFD),
)  # fmt: skip
_REFUSED_STARTS = [start for start, _ in REFUSED]


def refused_char(char: str) -> bool:
    """Whether a label may not hold ``char`` (see :data:`REFUSED`; a category refused that
    a newer Unicode gave a character is refused too)."""
    code = ord(char)
    at = bisect.bisect_right(_REFUSED_STARTS, code) - 1
    if at >= 0 and code <= REFUSED[at][1]:
        return True
    return char != " " and unicodedata.category(char) in _REFUSED_CATEGORIES


def _class_char(code: int) -> str:
    # BMP as an escape both ECMA-262 and Python read; past it the character itself
    return f"\\u{code:04x}" if code <= 0xFFFF else chr(code)


def _text_pattern(*, empty: bool) -> str:
    """A JSON Schema pattern of a key (``empty``: a value, which may be empty)."""
    # (not the surrogates: no JSON text holds one alone, and a regex of code points cannot
    # name them; the server refuses them all the same)
    ranges = [(max(lo, 0xE000), hi) if lo <= 0xDFFF <= hi else (lo, hi) for lo, hi in REFUSED]
    refused = "".join(
        _class_char(lo) if lo == hi else f"{_class_char(lo)}-{_class_char(hi)}" for lo, hi in ranges
    )
    text = f"[^{refused} ](?:[^{refused}]*[^{refused} ])?"
    # the end of the text: `$` also matches before a last line break in Python's `re`
    end = r"(?![\s\S])"
    return f"^(?:{text})?{end}" if empty else f"^{text}{end}"


def labels_schema() -> dict[str, Any]:
    """The rule of this module as JSON Schema (an object of labels)."""
    return {
        "type": "object",
        "maxProperties": MAX_LABELS,
        "propertyNames": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_KEY,
            "pattern": _text_pattern(empty=False),
        },
        "additionalProperties": {
            "type": "string",
            "maxLength": MAX_VALUE,
            "pattern": _text_pattern(empty=True),
        },
    }


class LabelError(UserError):
    """A run's label breaks the rule of this module (CLI exit code 2, API 422)."""

    code = "invalid_label"


def _shown(text: str, limit: int = 40) -> str:
    """``text`` quoted for an error, cut so that a huge value does not flood the message."""
    return repr(text if len(text) <= limit else text[:limit] + "…")


def _text_problem(text: str, what: str, limit: int) -> str | None:
    if len(text) > limit:
        return f"{what} {_shown(text)} is longer than {limit} characters"
    if text != text.strip():
        return f"{what} {_shown(text)} begins or ends with a space"
    bad = sorted(_FORBIDDEN & set(text))
    if bad:
        return f"{what} {_shown(text)} contains {bad[0]!r}"
    if any(refused_char(char) for char in text):
        return (
            f"{what} {_shown(text)} has a control character (or a format, private-use or "
            "separator one other than the space) or is not valid Unicode text"
        )
    return None


def label_problem(key: str, value: str) -> str | None:
    """Why ``key=value`` cannot be a run's label, or ``None``."""
    if not key:
        return "a label key may not be empty"
    return _text_problem(key, "label key", MAX_KEY) or _text_problem(
        value, f"the value of label {_shown(key)}", MAX_VALUE
    )


def labels_problem(labels: Mapping[str, str]) -> str | None:
    """Why ``labels`` cannot be a run's labels, or ``None`` (the API's check)."""
    if len(labels) > MAX_LABELS:
        return f"a run has at most {MAX_LABELS} labels, not {len(labels)}"
    for key, value in labels.items():
        problem = label_problem(key, value)
        if problem is not None:
            return problem
    return None


def check_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """``labels`` as a dict; :class:`LabelError` when they break the rule."""
    problem = labels_problem(labels)
    if problem is not None:
        raise LabelError(problem)
    return dict(labels)


def parse_labels(pairs: Iterable[str]) -> dict[str, str]:
    """``-l key=value`` options (each may hold several, comma separated) as labels; a key
    given twice, or a pair without ``=``, is a :class:`LabelError`."""
    labels: dict[str, str] = {}
    for text in pairs:
        for pair in text.split(","):
            key, equals, value = pair.partition("=")
            if not equals:
                raise LabelError(f"label {_shown(pair)} is not key=value")
            if key in labels:
                raise LabelError(f"label {_shown(key)} is given twice")
            labels[key] = value
    return check_labels(labels)
