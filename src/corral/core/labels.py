"""Labels on runs (``corral submit -l key=value``, the API's ``labels``): one rule for every door.

Labels are free text, as resources' are, within what a label selector
(:mod:`corral.core.selectors`) can name: a key of 1 to :data:`MAX_KEY` characters and a
value of at most :data:`MAX_VALUE` (it may be empty), printable text of any script
without ``,``, ``=``, ``!`` and without surrounding spaces (``équipe=café`` works); at
most :data:`MAX_LABELS` labels on a run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from corral.core.errors import UserError

#: the longest key and value (characters), and the most labels on one run
MAX_KEY = 63
MAX_VALUE = 63
MAX_LABELS = 32
#: what a selector cannot name inside a key or a value
_FORBIDDEN = set(",=!")


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
    if not text.isprintable():
        return f"{what} {_shown(text)} has a control character or is not valid Unicode text"
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
