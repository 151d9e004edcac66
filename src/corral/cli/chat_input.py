"""Where ``corral chat`` reads its lines: readline on a terminal, plain lines from a pipe.

On a terminal (stdin and stdout both ttys) lines are read with GNU readline: line
editing, and a history kept across chats in ``$XDG_STATE_HOME/corral/chat_history``
(``~/.local/state/corral/chat_history``; the file 0600, its directory 0700, the last
:data:`HISTORY_LENGTH` lines). Only what was said to the agent and the slash commands go
into the history, never the answers to an approval prompt. From a pipe, lines are
read as they come and no prompt is written, so stdout keeps only the answers.
"""

from __future__ import annotations

import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

#: the most lines the history file keeps
HISTORY_LENGTH = 1000

#: the approval prompt's answers (kubectl's habit: what is not a yes is a no)
YES = ("y", "yes")
NO = ("", "n", "no")
REASON = ("r", "reason")


@dataclass(frozen=True)
class Decision:
    """An answer to the approval prompt."""

    approved: bool
    reason: str | None = None


def is_text(line: str) -> bool:
    """Whether a line read is UTF-8 text (no lone surrogates, which no store or API takes)."""
    return not any("\udc80" <= char <= "\udcff" for char in line)


def history_path() -> Path:
    """``$XDG_STATE_HOME/corral/chat_history`` (a relative XDG path is ignored, as the
    XDG spec says), else ``~/.local/state/corral/chat_history``."""
    base = os.environ.get("XDG_STATE_HOME", "")
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".local" / "state"
    return root / "corral" / "chat_history"


class ChatInput:
    """The chat's lines. ``asks``: a person types them (stdin is a terminal), so the chat
    may ask questions; ``editing``: readline edits them and keeps the history."""

    def __init__(self, *, asks: bool, editing: bool, commands: tuple[str, ...] = ()) -> None:
        self.asks = asks
        self.commands = commands  # completed by Tab at the start of a line
        self.editing = editing
        self.warnings: list[str] = []  # said once by the chat (a history file that cannot be kept)
        self._readline: ModuleType | None = None
        self._added = 0  # lines added to the history by this chat
        self._path = history_path()

    @classmethod
    def open(cls, commands: tuple[str, ...] = ()) -> ChatInput:
        """For this process's stdin and stdout; loads the history on a terminal, where Tab
        completes ``commands``."""
        if isinstance(sys.stdin, io.TextIOWrapper):
            # bytes that are not UTF-8 come as lone surrogates, refused line by line
            sys.stdin.reconfigure(errors="surrogateescape")
        asks = sys.stdin.isatty()
        lines = cls(asks=asks, editing=asks and sys.stdout.isatty(), commands=commands)
        if lines.editing:
            lines._load()
        return lines

    def _load(self) -> None:
        import readline  # here: only a terminal needs it (it changes how input() reads)

        self._readline = readline
        readline.set_auto_history(False)  # approval answers stay out of the history
        readline.set_history_length(HISTORY_LENGTH)
        readline.set_completer(self._complete)
        readline.set_completer_delims(" \t\n")  # "/" is part of a command's name
        readline.parse_and_bind("tab: complete")
        try:
            if self._path.exists():
                readline.read_history_file(str(self._path))
        except OSError as exc:
            self.warnings.append(f"chat history {self._path} not read: {exc.strerror}")

    def _complete(self, text: str, state: int) -> str | None:
        """readline's completer: the commands that start with ``text``, at a line's start."""
        assert self._readline is not None
        if self._readline.get_begidx() != 0:
            return None
        found = [c for c in self.commands if c.startswith(text)]
        return found[state] + " " if state < len(found) else None

    def read(self, prompt: str) -> str | None:
        """One line without its newline; ``None`` at the end of input (Ctrl-D).
        ``KeyboardInterrupt`` on Ctrl-C."""
        if self.editing:
            try:
                return input(prompt)
            except EOFError:
                return None
        if self.asks:  # a person types, but stdout goes elsewhere: prompt on stderr
            sys.stderr.write(prompt)
            sys.stderr.flush()
        line = sys.stdin.readline()
        if not line:
            return None
        return line.removesuffix("\n").removesuffix("\r")

    def remember(self, line: str) -> None:
        """Add a line to the history (not twice in a row)."""
        readline = self._readline
        if readline is None:
            return
        length = readline.get_current_history_length()
        if length and readline.get_history_item(length) == line:
            return
        readline.add_history(line)
        self._added += 1

    def save(self) -> None:
        """Append this chat's lines to the history file, keeping its last HISTORY_LENGTH
        (appended, not rewritten: two chats at once both keep theirs)."""
        readline = self._readline
        if readline is None or not self._added:
            return
        try:
            self._path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # created 0600 before readline writes a word: the history may hold secrets
            os.close(os.open(self._path, os.O_WRONLY | os.O_CREAT, 0o600))
            os.chmod(self._path, 0o600)
            readline.append_history_file(min(self._added, HISTORY_LENGTH), str(self._path))
            self._added = 0
        except OSError as exc:
            sys.stderr.write(f"warning: chat history {self._path} not saved: {exc.strerror}\n")

    def ask_approval(self) -> Decision | None:
        """``approve? [y/N/r(eason)]``: y approves, n or Enter rejects, r asks for a
        reason and rejects. ``None`` (the approval stays pending) on Ctrl-C or Ctrl-D."""
        while True:
            try:
                answer = self.read("approve? [y/N/r(eason)] ")
                if answer is None:
                    return None
                answer = answer.strip().lower()
                if answer in YES:
                    return Decision(True)
                if answer in NO:
                    return Decision(False)
                if answer in REASON:
                    reason = self.read("reason: ")
                    if reason is None:
                        return None
                    if is_text(reason):
                        return Decision(False, reason.strip() or None)
                    sys.stderr.write("the reason is not UTF-8 text\n")
                    continue
            except KeyboardInterrupt:
                sys.stderr.write("\n")
                return None
            sys.stderr.write(
                "answer y (approve), n or Enter (reject), or r (reject with a reason)\n"
            )
