"""Process helpers shared by the tests that start and kill real programs."""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running (not zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
