"""Limits on the YAML and JSON documents Corral parses from people and models.

A document is refused while it is read, before anything grows from it: its
size is checked first, JSON's nesting is counted by a linear scan before
``json.loads`` sees the text, and YAML's composer counts nodes, aliases and
depth as it builds the node tree (see :mod:`corral.resources.loader`), so an
alias bomb of a few hundred bytes stops after ``max_nodes`` nodes instead of
expanding into gigabytes. A refusal is a :class:`DocumentTooComplexError`
naming the limit and the variable that sets it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from corral.core.errors import DocumentTooComplexError, Location

#: The environment variable of each limit (read by :class:`~corral.core.settings.Settings`).
LIMIT_VARIABLES: dict[str, str] = {
    "max_bytes": "CORRAL_MAX_DOCUMENT_BYTES",
    "max_depth": "CORRAL_MAX_DOCUMENT_DEPTH",
    "max_nodes": "CORRAL_MAX_DOCUMENT_NODES",
    "max_aliases": "CORRAL_MAX_DOCUMENT_ALIASES",
}

# The characters that matter to JSON's nesting: brackets, and what starts, escapes
# or ends a string (brackets inside strings do not count).
_JSON_STRUCTURE = re.compile(r'[\[\]{}"\\]')


@dataclass(frozen=True)
class DocumentLimits:
    """How large and how complex one YAML or JSON text may be.

    ``max_nodes`` counts every scalar, list and mapping with aliases expanded (an
    alias counts as the whole subtree it names); ``max_aliases`` counts alias uses.
    """

    max_bytes: int = 1024 * 1024
    max_depth: int = 64
    max_nodes: int = 100_000
    max_aliases: int = 1_000

    def refuse(
        self, limit: str, reason: str, location: Location | None = None
    ) -> DocumentTooComplexError:
        """The error for passing ``limit``: the reason, the limit's value and its variable."""
        value = getattr(self, limit)
        return DocumentTooComplexError(
            limit,
            f"document too complex: {reason} (limit {limit}={value}, set by "
            f"{LIMIT_VARIABLES[limit]})",
            location,
        )

    def check_size(self, size: int, source: str | None = None) -> None:
        """Refuse a text of ``size`` bytes over ``max_bytes``."""
        if size > self.max_bytes:
            raise self.refuse(
                "max_bytes", f"{size} bytes, more than {self.max_bytes}", Location(source)
            )

    def loads_json(self, text: str, source: str | None = None) -> Any:
        """``json.loads`` within these limits; ``ValueError`` for text that is not JSON.

        The size and nesting are checked before parsing, so no input reaches the
        parser's recursion limit (a ``RecursionError`` never escapes).
        """
        self.check_size(len(text.encode("utf-8", "surrogatepass")), source)
        self.check_json_depth(text, source)
        return json.loads(text)

    def check_json_depth(self, text: str, source: str | None = None) -> None:
        """Refuse JSON text nested deeper than ``max_depth`` (see :func:`json_too_deep_at`)."""
        position = json_too_deep_at(text, self.max_depth)
        if position is not None:
            line = text.count("\n", 0, position) + 1
            raise self.refuse(
                "max_depth", f"nested deeper than {self.max_depth} levels", Location(source, line)
            )


def json_too_deep_at(text: str, max_depth: int) -> int | None:
    """Where JSON text first nests deeper than ``max_depth`` (an index), else ``None``.

    One pass without recursion; brackets inside strings do not count. Text that
    is not JSON passes (the parser then says what is wrong with it).
    """
    depth = 0
    in_string = False
    escaped_at = -1  # the position of a character a backslash escapes
    for match in _JSON_STRUCTURE.finditer(text):
        position = match.start()
        if position == escaped_at:
            continue
        char = match.group()
        if in_string:
            if char == "\\":
                escaped_at = position + 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > max_depth:
                return position
        elif char in "]}":
            depth -= 1
    return None


# Limits of the wire contract that the CLI's options check too: here, below corral.api, so
# that reading them does not import the API's pydantic models (corral --help stays fast).

#: most items one page of a list may hold
MAX_PAGE_ITEMS = 500
#: a task's priority lies in [-MAX_PRIORITY, MAX_PRIORITY]
MAX_PRIORITY = 1_000_000
#: the longest a submitted task may wait before it may start (a year and a day)
MAX_DELAY_SECONDS = 366 * 86400
#: how many tasks ``corral tasks tree`` shows at most (a runaway fan-out stays readable)
MAX_TREE_TASKS = 1000
