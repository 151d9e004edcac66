"""Label selectors, kubectl's equality-based ones: ``team=a,tier!=web,canary,!legacy``.

A selector is requirements joined by commas, all of which must hold:

    key=value, key==value   the label is there with this value
    key!=value              the label is absent or has another value
    key                     the label is there (any value)
    !key                    the label is absent

Keys and values are any text but ``,``, ``=``, ``!`` and surrounding spaces (labels are
free text in Corral: ``équipe=café`` works). The CLI's ``-l`` and the API's ``?selector=``
take the same text; the store turns it into a query (``corral.store.sql.labels``) and
:func:`matches` says the same for one resource's labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from corral.core.errors import UserError
from corral.core.labels import refused_char

#: the longest selector taken (the API's query parameter, the CLI's ``-l``)
MAX_SELECTOR_CHARS = 1024
#: the most requirements in one selector
MAX_REQUIREMENTS = 20
_FORBIDDEN = set(",=!")


class InvalidSelectorError(UserError):
    """A label selector that cannot be parsed (CLI exit code 2, API 422)."""

    code = "invalid_selector"


class Op(StrEnum):
    """What a requirement asks of a label."""

    EQUALS = "="
    NOT_EQUALS = "!="
    EXISTS = "exists"
    NOT_EXISTS = "!exists"


@dataclass(frozen=True)
class Requirement:
    """One requirement of a selector: ``value`` is ``None`` for (non-)existence."""

    key: str
    op: Op
    value: str | None = None

    def holds(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` meet this requirement."""
        found = labels.get(self.key)
        if self.op is Op.EQUALS:
            return found == self.value
        if self.op is Op.NOT_EQUALS:
            return found != self.value
        return (found is not None) == (self.op is Op.EXISTS)

    def __str__(self) -> str:
        if self.op is Op.EXISTS:
            return self.key
        if self.op is Op.NOT_EXISTS:
            return f"!{self.key}"
        return f"{self.key}{self.op.value}{self.value}"


@dataclass(frozen=True)
class Selector:
    """Requirements that must all hold (an empty selector matches everything)."""

    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.holds(labels) for r in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


def _part(text: str, what: str, whole: str) -> str:
    part = text.strip()
    if not part:
        raise InvalidSelectorError(f"invalid label selector {whole!r}: empty {what}")
    bad = sorted(_FORBIDDEN & set(part))
    if bad:
        raise InvalidSelectorError(
            f"invalid label selector {whole!r}: {what} {part!r} contains {bad[0]!r}"
        )
    if any(refused_char(char) for char in part):
        raise InvalidSelectorError(
            f"invalid label selector {whole!r}: {what} {part!r} has a control character"
        )
    return part


def _requirement(text: str, whole: str) -> Requirement:
    if "!=" in text:
        key, _, value = text.partition("!=")
        return Requirement(_part(key, "key", whole), Op.NOT_EQUALS, _value(value, whole))
    if "==" in text:
        key, _, value = text.partition("==")
        return Requirement(_part(key, "key", whole), Op.EQUALS, _value(value, whole))
    if "=" in text:
        key, _, value = text.partition("=")
        return Requirement(_part(key, "key", whole), Op.EQUALS, _value(value, whole))
    stripped = text.strip()
    if stripped.startswith("!"):
        return Requirement(_part(stripped[1:], "key", whole), Op.NOT_EXISTS)
    return Requirement(_part(stripped, "key", whole), Op.EXISTS)


def _value(text: str, whole: str) -> str:
    # an empty value is a value (kubectl: ``tier=`` selects labels set to "")
    return "" if not text.strip() else _part(text, "value", whole)


def parse_selector(text: str) -> Selector:
    """The selector of ``text``; ``InvalidSelectorError`` naming what is wrong."""
    if len(text) > MAX_SELECTOR_CHARS:
        raise InvalidSelectorError(
            f"label selector too long: {len(text)} characters, at most {MAX_SELECTOR_CHARS}"
        )
    if any("\ud800" <= char <= "\udfff" for char in text):
        raise InvalidSelectorError("label selector is not valid Unicode text")
    if not text.strip():
        raise InvalidSelectorError("empty label selector (use key=value, key!=value or key)")
    parts = text.split(",")
    if len(parts) > MAX_REQUIREMENTS:
        raise InvalidSelectorError(
            f"label selector has {len(parts)} requirements, at most {MAX_REQUIREMENTS}"
        )
    return Selector(tuple(_requirement(part, text) for part in parts))
