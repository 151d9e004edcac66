"""A system run's tree of events for the terminal: ``corral systems run`` and ``corral logs``
of a system run.

The system run's own events (messages sent, node runs started and finished, joins)
come one line each; a node run's come under it, each line prefixed with its agent and
indented by its branch (``1`` flush, ``1.2`` one step in), so the branches of a
fan-out read side by side. Streamed text is left out: a node's answer is shown once,
when it finishes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from rich.console import Console

from corral.api import EventOut, TaskDetail
from corral.cli.common import escape
from corral.cli.events_view import readable, timestamp
from corral.core.events import (
    BranchJoinData,
    ChildFinishData,
    ChildStartData,
    ErrorData,
    MessageSendData,
    RunFinishData,
    RunStartData,
    ToolCallData,
    ToolResultData,
)
from corral.core.runs import RunState

_PREVIEW = 160


def _short(value: Any, limit: int = _PREVIEW) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _indent(branch: str | None) -> str:
    return "  " * (1 + (branch or "1").count("."))


class TreePrinter:
    """Prints the events of system run ``root`` and of its node runs as they arrive."""

    def __init__(self, console: Console, root: str, *, timestamps: bool = False) -> None:
        self.console = console
        self.root = root
        self.timestamps = timestamps
        #: node run id -> (agent, branch), learned from the system run's child.start
        self.nodes: dict[str, tuple[str, str]] = {}

    async def __call__(self, event: EventOut) -> None:
        self.render(event)

    def _say(self, event: EventOut, markup: str) -> None:
        when = f"[dim]{timestamp(event.ts)}[/] " if self.timestamps else ""
        self.console.print(when + markup, soft_wrap=True, highlight=False)

    def render(self, event: EventOut) -> None:
        if event.run_id == self.root:
            self._system(event)
        else:
            self._node(event)

    def _system(self, event: EventOut) -> None:
        data = readable(event)
        branch = str(getattr(data, "branch_id", None) or "1")
        at = _indent(branch)[2:]
        match data:
            case RunStartData(system=system, input=given):
                self._say(
                    event,
                    f"[bold]▶ system {escape(str(system))}[/] [dim]{escape(_short(given))}[/]",
                )
            case MessageSendData(from_agent=sender, kind=kind, to=to, hop=hop):
                sender = sender or ("input" if kind == "input" else "join")
                self._say(
                    event,
                    f"{at}[dim]✉ {escape(sender)} → {escape(to)} "
                    f"(branch {escape(branch)}, hop {hop})[/]",
                )
            case ChildStartData(agent=agent, run_id=run_id):
                self.nodes[run_id] = (agent, branch)
                self._say(
                    event,
                    f"{at}[cyan]⇢ {escape(agent)}[/] [dim]branch {escape(branch)} · "
                    f"run {escape(run_id)}[/]",
                )
            case ChildFinishData(agent=agent, state=state):
                colour = "green" if state == RunState.SUCCEEDED.value else "red"
                self._say(
                    event,
                    f"{at}[{colour}]⇠ {escape(agent)} {escape(state)}[/] "
                    f"[dim]branch {escape(branch)}[/]",
                )
            case BranchJoinData(agent=agent, join=join, inputs=inputs, dropped=dropped):
                line = f"⋈ {escape(agent)}"
                if inputs:
                    line += f" joins {len(inputs)} input(s) ({escape(str(join))})"
                if dropped:
                    line += f", {len(dropped)} dropped"
                self._say(event, f"{at}[magenta]{line}[/]")
            case ErrorData(message=message):
                self._say(event, f"[bold red]✗ {escape(message)}[/]")
            case _:
                pass  # (the system run's other events print no line)

    def _node(self, event: EventOut) -> None:
        agent, branch = self.nodes.get(event.run_id, (event.run_id, "1"))
        head = f"{_indent(branch)}[bold]{escape(agent)}[/] "
        match readable(event):
            case ToolCallData(tool=tool, arguments=arguments):
                self._say(
                    event, f"{head}[cyan]→ {escape(tool)}[/][dim]({escape(_short(arguments))})[/]"
                )
            case ToolResultData(tool=tool, error=error) if error:
                self._say(event, f"{head}[red]← {escape(tool)} failed[/]")
            case ToolResultData(tool=tool, output=output):
                self._say(
                    event,
                    f"{head}[green]← {escape(tool)}[/] [dim]{escape(_short('' if output is None else output))}[/]",
                )
            case ErrorData(message=message):
                self._say(event, f"{head}[red]✗ {escape(message)}[/]")
            case RunFinishData(state=RunState.SUCCEEDED.value, output=output):
                self._say(
                    event, f"{head}[green]✓[/] {escape(_short('' if output is None else output))}"
                )
            case RunFinishData(state=state):
                self._say(event, f"{head}[red]{escape(state)}[/]")
            case _:
                pass  # (a node run's streamed text and steps print no line)


Show = Callable[[EventOut], Awaitable[None]]
Follow = Callable[..., Awaitable[TaskDetail]]


async def follow_tree(follow: Follow, root: str, show: Show, *, live: bool) -> TaskDetail:
    """Hand ``show`` the events of system run ``root`` and of each node run its
    ``child.start`` events name, followed side by side (``live``: until each ends, as
    ``follow(run_id, show, follow=live)`` does); returns the system run as it ended."""
    async with anyio.create_task_group() as group:

        async def shown(event: EventOut) -> None:
            await show(event)
            if event.run_id == root and isinstance(start := readable(event), ChildStartData):
                group.start_soon(node_of, start.run_id)

        async def node_of(run_id: str) -> None:
            await follow(run_id, show, follow=live)

        record = await follow(root, shown, follow=live)
    return record
