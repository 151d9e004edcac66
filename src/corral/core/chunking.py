"""Cutting a long text into chunks for a Memory (``spec.chunking: {size, overlap}``).

A pure function: :func:`chunk_text` cuts at the best boundary that keeps a chunk within
``size`` characters - a paragraph break (a blank line), else a sentence end, else a
line break, else a space - and never inside a word unless one word alone is longer
than ``size``. The next chunk starts ``overlap`` characters (or fewer, at a word
start) before the cut, so that a sentence cut in two is still found whole in one of
them. Characters are Python code points; a combining mark is never separated from
the character it combines with, and text with no spaces (Chinese, Japanese) is cut
after CJK punctuation where there is one, else anywhere (each character is a word).
"""

from __future__ import annotations

import re
import unicodedata

from corral.core.memory import MemoryInputError

#: the longest text one ingest takes (characters): longer texts are refused, not cut
MAX_INGEST_CHARS = 5_000_000
#: how many times over an ingest's chunks may hold its text (overlap repeats it), beyond
#: an allowance that lets a short text be cut with any overlap
MAX_REPEAT = 3
REPEAT_ALLOWANCE_CHARS = 1_000_000

# Boundaries, best first: each pattern's match END is a place a chunk may end.
_PARAGRAPH = re.compile(r"\n[ \t]*\n\s*")
_SENTENCE = re.compile(r"[.!?\u2026][\"'\u201d\u2019)\]]*\s+|[\u3002\uff01\uff1f\uff0e]+")
_LINE = re.compile(r"\n+")
_SPACE = re.compile(r"\s+|[\u3001\uff0c\uff1b\uff1a]")
_LEVELS = (_PARAGRAPH, _SENTENCE, _LINE, _SPACE)
# the characters _cjk accepts, to skip its character-by-character search where there are none
_CJK = re.compile(
    "[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af\U00020000-\U0002ffff]"
)


def _is_mark(char: str) -> bool:
    return unicodedata.category(char).startswith("M") or char in "\u200d\ufe0f"


def _cjk(char: str) -> bool:
    # Scripts written without spaces: any place between two of their characters is a
    # word boundary.
    code = ord(char)
    return (
        0x3040 <= code <= 0x30FF  # hiragana, katakana
        or 0x3400 <= code <= 0x4DBF
        or 0x4E00 <= code <= 0x9FFF
        or 0xF900 <= code <= 0xFAFF
        or 0xAC00 <= code <= 0xD7AF  # hangul syllables
        or 0x20000 <= code <= 0x2FFFF
    )


def _safe(text: str, at: int) -> bool:
    """Whether a cut before ``text[at]`` separates no combining mark from its base."""
    return at <= 0 or at >= len(text) or not _is_mark(text[at])


def _word_break(text: str, at: int) -> bool:
    """Whether ``at`` is between two words (or next to a space or a CJK character)."""
    if at <= 0 or at >= len(text):
        return True
    before, after = text[at - 1], text[at]
    if before.isspace() or after.isspace():
        return _safe(text, at)
    return (_cjk(before) or _cjk(after)) and _safe(text, at)


def _cut(text: str, start: int, limit: int, past: int) -> int:
    """Where the chunk starting at ``start`` ends (at most ``limit``, after ``past``,
    where the previous chunk ended): the best boundary in its second half if there is
    one, else any boundary, else (a giant word) at the limit, moved back so no
    combining mark loses its base."""
    if limit >= len(text):
        return len(text)
    window = text[start:limit]
    least = max(past - start + 1, 1)
    for floor in (max((limit - start) // 2, least), least):
        for pattern in _LEVELS:
            ends = [m.end() for m in pattern.finditer(window) if m.end() >= floor]
            ends = [e for e in ends if e < len(window) or _word_break(text, start + e)]
            if ends:
                return start + ends[-1]
        if not _CJK.search(window):
            continue
        for at in range(limit, start + floor - 1, -1):  # CJK: between two characters
            if _word_break(text, at) and (_cjk(text[at - 1]) or _cjk(text[at])):
                return at
    at = limit
    while at > start + 1 and not _safe(text, at):
        at -= 1
    return at


def _next_start(text: str, start: int, end: int, overlap: int) -> int:
    """Where the next chunk starts: ``overlap`` characters before ``end``, moved forward
    to a word start (so no chunk begins mid-word), and always after ``start``."""
    if overlap <= 0:
        at = end
    else:
        at = max(end - overlap, start + 1)
        while at < end and not _word_break(text, at):
            at += 1
    while at < len(text) and text[at].isspace():
        at += 1  # a chunk starts with its first word
    return at


def chunk_text(text: str, size: int = 1000, overlap: int = 200) -> list[str]:
    """``text`` cut into chunks of at most ``size`` characters, each starting up to
    ``overlap`` characters before the previous one ended. An empty (or blank) text has
    no chunks; one longer than :data:`MAX_INGEST_CHARS` is a :class:`MemoryInputError`."""
    if size < 1 or not 0 <= overlap < size:
        raise MemoryInputError(f"chunking needs 0 <= overlap < size, not {overlap}/{size}")
    if len(text) > MAX_INGEST_CHARS:
        raise MemoryInputError(
            f"an ingest takes at most {MAX_INGEST_CHARS} characters, not {len(text)}: "
            "split the document"
        )
    chunks: list[str] = []
    # an overlap near the size starts each chunk a word after the last: a megabyte would be
    # hundreds of thousands of entries. What the chunks repeat of a text is capped.
    allowed = MAX_REPEAT * len(text) + REPEAT_ALLOWANCE_CHARS
    total = 0
    start = end = 0
    while start < len(text) and text[start].isspace():
        start += 1
    while start < len(text):
        end = _cut(text, start, start + size, end)
        chunk = text[start:end].rstrip()
        if chunk:
            chunks.append(chunk)
            total += len(chunk)
            if total > allowed:
                raise MemoryInputError(
                    f"chunking with size {size} and overlap {overlap} would repeat this text "
                    f"more than {MAX_REPEAT} times: lower the Memory's spec.chunking.overlap"
                )
        if end >= len(text):
            break
        start = _next_start(text, start, end, overlap)
    return chunks


__all__ = ["MAX_INGEST_CHARS", "chunk_text"]
