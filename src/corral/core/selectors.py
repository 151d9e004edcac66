"""Labels on runs and the ``-l`` selectors that pick runs by them, one rule for every door.

A label is ``key=value``. Keys and values are short words of any script: letters,
digits, ``-``, ``_``, ``.`` (and ``/`` in a key), beginning and ending with a letter
or a digit; a key has 1 to :data:`MAX_KEY` characters, a value at most
:data:`MAX_VALUE` (it may be empty). ``=``, ``,``, ``!``, spaces and control
characters never occur in either, so a selector can always be written for a label.

A selector (``corral tasks list -l``, the API's ``label`` parameter) is a comma
separated list of requirements, all of which must hold, as kubectl writes them:
``key=value`` (or ``key==value``), ``key!=value`` (true too when the label is
absent), ``key`` (the label is present) and ``!key`` (it is absent).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from corral.core.errors import UserError

#: the longest key and value (characters), and the most labels on one run
MAX_KEY = 63
MAX_VALUE = 63
MAX_LABELS = 32
#: the most requirements in one selector
MAX_REQUIREMENTS = 32

# \w is any script's letters and digits, and "_"; a word begins and ends with a
# letter or a digit.
_KEY = re.compile(r"[^\W_](?:[\w./-]*[^\W_])?")
_VALUE = re.compile(r"(?:[^\W_](?:[\w.-]*[^\W_])?)?")


class LabelError(UserError):
    """A label or a selector breaks the rule of this module."""

    code = "invalid_label"


def _shown(text: str, limit: int = 40) -> str:
    """``text`` quoted for an error, cut so a huge value does not flood the message."""
    return repr(text if len(text) <= limit else text[:limit] + "…")


def key_problem(key: str) -> str | None:
    """Why ``key`` is not a label key, or ``None``."""
    if not key:
        return "a label key may not be empty"
    if len(key) > MAX_KEY:
        return f"label key {_shown(key)} is longer than {MAX_KEY} characters"
    if not _KEY.fullmatch(key):
        return (
            f"label key {_shown(key)} must be letters, digits, '-', '_', '.' or '/', "
            "beginning and ending with a letter or a digit"
        )
    return None


def value_problem(key: str, value: str) -> str | None:
    """Why ``value`` is not the value of label ``key``, or ``None``."""
    if len(value) > MAX_VALUE:
        return f"the value of label {_shown(key)} is longer than {MAX_VALUE} characters"
    if not _VALUE.fullmatch(value):
        return (
            f"the value {_shown(value)} of label {_shown(key)} must be letters, digits, "
            "'-', '_' or '.', beginning and ending with a letter or a digit (or empty)"
        )
    return None


def labels_problem(labels: Mapping[str, str]) -> str | None:
    """Why ``labels`` cannot be a run's labels, or ``None`` (the API's check)."""
    if len(labels) > MAX_LABELS:
        return f"a run has at most {MAX_LABELS} labels, not {len(labels)}"
    for key, value in labels.items():
        problem = key_problem(key) or value_problem(key, value)
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
    """``-l key=value`` options (each may hold several, comma separated) as labels;
    a key given twice is a :class:`LabelError`."""
    labels: dict[str, str] = {}
    for pair in _parts(pairs):
        key, equals, value = pair.partition("=")
        if not equals:
            raise LabelError(f"label {_shown(pair)} is not key=value")
        if key in labels:
            raise LabelError(f"label {_shown(key)} is given twice")
        labels[key] = value
    return check_labels(labels)


class Op(StrEnum):
    EQUALS = "="
    NOT_EQUALS = "!="
    EXISTS = "exists"
    ABSENT = "!exists"


@dataclass(frozen=True)
class Requirement:
    """One requirement of a selector on one label."""

    key: str
    op: Op
    value: str = ""

    def matches(self, labels: Mapping[str, str]) -> bool:
        found = labels.get(self.key)
        if self.op is Op.EQUALS:
            return found == self.value
        if self.op is Op.NOT_EQUALS:
            return found != self.value
        return (found is not None) == (self.op is Op.EXISTS)

    def __str__(self) -> str:
        if self.op is Op.EXISTS:
            return self.key
        if self.op is Op.ABSENT:
            return f"!{self.key}"
        return f"{self.key}{self.op.value}{self.value}"


@dataclass(frozen=True)
class Selector:
    """Requirements that must all hold; the empty selector picks everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)

    def __bool__(self) -> bool:
        return bool(self.requirements)


def parse_selector(texts: str | Iterable[str]) -> Selector:
    """A selector from its text (several texts: all their requirements);
    :class:`LabelError` naming the requirement that is malformed."""
    requirements: list[Requirement] = []
    for part in _parts([texts] if isinstance(texts, str) else texts):
        requirements.append(_requirement(part))
        if len(requirements) > MAX_REQUIREMENTS:
            raise LabelError(f"a selector has at most {MAX_REQUIREMENTS} requirements")
    return Selector(tuple(requirements))


def _requirement(text: str) -> Requirement:
    for token, op in (("!=", Op.NOT_EQUALS), ("==", Op.EQUALS), ("=", Op.EQUALS)):
        key, found, value = text.partition(token)
        if found:
            key = key.strip()
            value = value.strip()
            problem = key_problem(key) or value_problem(key, value)
            if problem is not None:
                raise LabelError(f"selector {_shown(text)}: {problem}")
            return Requirement(key, op, value)
    absent = text.startswith("!")
    key = text[1:].strip() if absent else text
    problem = key_problem(key)
    if problem is not None:
        raise LabelError(f"selector {_shown(text)}: {problem}")
    return Requirement(key, Op.ABSENT if absent else Op.EXISTS)


def _parts(texts: Iterable[str]) -> list[str]:
    """The comma separated parts of ``texts``, stripped; an empty part is an error."""
    parts: list[str] = []
    for text in texts:
        for part in text.split(","):
            part = part.strip()
            if not part:
                raise LabelError(f"empty label or requirement in {_shown(text)}")
            parts.append(part)
    return parts
