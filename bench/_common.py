"""Helpers the benchmark scripts share: statistics, the table, the fake server process."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def median(values: Sequence[float]) -> float:
    """The median of ``values``."""
    return statistics.median(values)


def spread(values: Sequence[float], digits: int = 2) -> str:
    """``median (min-max)`` of ``values``, rounded to ``digits``."""
    return f"{median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain Markdown table (pastes straight into ``docs/benchmarks.md``)."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def machine() -> str:
    """One line about where the figures were taken."""
    import sqlite3

    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}"
    )


class FakeServerProcess:
    """The fake OpenAI-compatible server in a child process (it gets its own core and GIL).

    The child answers as a :class:`~corral.testing.fake_openai.ToolLoop` of ``calls``
    tool calls and stops when its standard input closes.
    """

    def __init__(self, calls: int) -> None:
        self.calls = calls
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""

    def __enter__(self) -> FakeServerProcess:
        # FakeOpenAIServer.start() binds a socket without IPPROTO_TCP, so asyncio does not
        # set TCP_NODELAY on its connections and every answer (headers, then body) waits
        # ~40 ms for the client's delayed ACK. Serve the same routes on a proper socket.
        code = (
            "import socket, sys, threading, uvicorn\n"
            "from starlette.applications import Starlette\n"
            "from corral.testing.fake_openai import FakeOpenAIServer, ToolLoop\n"
            f"fake = FakeOpenAIServer(tool_loop=ToolLoop('lookup', {self.calls}))\n"
            "sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)\n"
            "sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n"
            "sock.bind(('127.0.0.1', 0))\n"
            "config = uvicorn.Config(Starlette(routes=fake.routes()), log_level='warning',\n"
            "    lifespan='off', access_log=False, backlog=4096)\n"
            "server = uvicorn.Server(config)\n"
            "threading.Thread(target=server.run, kwargs={'sockets': [sock]}, daemon=True).start()\n"
            "while not server.started: threading.Event().wait(0.01)\n"
            "print(f'http://127.0.0.1:{sock.getsockname()[1]}/v1', flush=True)\n"
            "sys.stdin.read()\n"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.base_url = self.proc.stdout.readline().strip()
        if not self.base_url:
            raise RuntimeError("the fake server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
