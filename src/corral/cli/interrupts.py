"""Ctrl-C while ``corral run`` or a ``corral chat`` turn sees a run through: the run stays
stored with its journal, and the command says what became of it and how to follow it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

import typer

if TYPE_CHECKING:
    from corral.api import TaskDetail
    from corral.cli.backend import RunControl


class Interrupted(Exception):
    """Ctrl-C stopped ``corral run`` (or a ``chat`` turn); what became of the run was said on stderr."""


#: how long Ctrl-C waits for a run executing here to be released for the workers
INTERRUPT_GRACE_SECONDS = 5.0


@asynccontextmanager
async def interruptible(control: RunControl, err: Any) -> AsyncIterator[None]:
    """Ctrl-C within the block: before the run is stored, stop at once (nothing to keep);
    after, set ``control.stop`` so the run is released (embedded) or left to the server,
    and the block ends with a run that stays stored. A second Ctrl-C, or a release that
    takes longer than INTERRUPT_GRACE_SECONDS, exits at once: the run's lease then
    expires and a worker resumes it from its journal.

    A signal handler of the loop, not a task: the block's errors pass unchanged."""
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    timers: list[asyncio.TimerHandle] = []

    def given_up() -> None:
        exit_now(
            err,
            f"interrupted: run {control.run_id} was left as it was; its lease expires "
            "and a worker (`corral worker` or `corral serve`) resumes it from its "
            f"journal. Follow it: corral logs -f {control.run_id}",
        )

    def interrupted() -> None:
        if control.run_id is None:  # nothing stored yet: nothing to keep
            exit_now(err, "interrupted")
        if control.stop.is_set():  # a second Ctrl-C
            given_up()
        err.print(f"[yellow]interrupted: stopping run {control.run_id} here…[/]", soft_wrap=True)
        control.stop.set()
        timers.append(loop.call_later(INTERRUPT_GRACE_SECONDS, given_up))

    loop.add_signal_handler(signal.SIGINT, interrupted)
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        for timer in timers:
            timer.cancel()


def exit_now(err: Any, message: str) -> NoReturn:
    """Exit 130 at once, past threads a cancelled tool leaves behind."""
    import os
    import sys

    err.print(f"[yellow]{message}[/]", soft_wrap=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)


def say_interrupted(err: Any, record: TaskDetail) -> None:
    """What became of a run Ctrl-C stopped following: it stays stored with its journal."""
    from corral.core.runs import RunState

    state = record.state
    if state is RunState.QUEUED:
        what = (
            "is queued again with its journal: a worker resumes it where it stopped "
            "(`corral worker` or `corral serve`)"
        )
    elif state is RunState.RUNNING:
        what = f"goes on on its worker{f' {record.lease_owner}' if record.lease_owner else ''}"
    elif state is RunState.WAITING_APPROVAL:
        what = "waits for approval: corral approvals list"
    else:
        what = f"has {state.value}"
    err.print(f"[yellow]interrupted: run {record.id} {what}[/]", soft_wrap=True)
    if not state.finished:
        err.print(f"  follow it: corral logs -f {record.id}", soft_wrap=True)
        err.print(f"  cancel it: corral tasks cancel {record.id}", soft_wrap=True)


def exit_interrupted() -> NoReturn:
    from corral.runtime.process import exit_past_leftover_threads

    exit_past_leftover_threads(code=130)  # a cancelled tool's thread may still run
    raise typer.Exit(130)


def spinner(console: Any) -> Any:
    @contextmanager
    def loading(name: str) -> Iterator[None]:
        if not console.is_terminal:
            yield
            return
        with console.status(f"loading model {name}…", spinner="dots"):
            yield

    return loading
