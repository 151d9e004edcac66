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
from corral.cli.events_view import timestamp
from corral.core.events import EventType
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
        data, kind = event.data, event.type
        branch = str(data.get("branch_id") or "1")
        at = _indent(branch)[2:]
        if kind is EventType.RUN_START:
            self._say(
                event,
                f"[bold]▶ system {escape(str(data.get('system')))}[/] "
                f"[dim]{escape(_short(data.get('input', '')))}[/]",
            )
        elif kind is EventType.MESSAGE_SEND:
            sender = data.get("from") or ("input" if data.get("kind") == "input" else "join")
            self._say(
                event,
                f"{at}[dim]✉ {escape(str(sender))} → {escape(str(data.get('to')))} "
                f"(branch {escape(branch)}, hop {data.get('hop')})[/]",
            )
        elif kind is EventType.CHILD_START:
            agent = str(data.get("agent"))
            self.nodes[str(data.get("run_id"))] = (agent, branch)
            self._say(
                event,
                f"{at}[cyan]⇢ {escape(agent)}[/] [dim]branch {escape(branch)} · "
                f"run {escape(str(data.get('run_id')))}[/]",
            )
        elif kind is EventType.CHILD_FINISH:
            state = str(data.get("state"))
            colour = "green" if state == RunState.SUCCEEDED.value else "red"
            self._say(
                event,
                f"{at}[{colour}]⇠ {escape(str(data.get('agent')))} {escape(state)}[/] "
                f"[dim]branch {escape(branch)}[/]",
            )
        elif kind is EventType.BRANCH_JOIN:
            inputs, dropped = data.get("inputs") or [], data.get("dropped") or []
            line = f"⋈ {escape(str(data.get('agent')))}"
            if inputs:
                line += f" joins {len(inputs)} input(s) ({escape(str(data.get('join')))})"
            if dropped:
                line += f", {len(dropped)} dropped"
            self._say(event, f"{at}[magenta]{line}[/]")
        elif kind is EventType.ERROR:
            self._say(event, f"[bold red]✗ {escape(str(data.get('message', data)))}[/]")

    def _node(self, event: EventOut) -> None:
        agent, branch = self.nodes.get(event.run_id, (event.run_id, "1"))
        data, kind = event.data, event.type
        head = f"{_indent(branch)}[bold]{escape(agent)}[/] "
        if kind is EventType.TOOL_CALL:
            self._say(
                event,
                f"{head}[cyan]→ {escape(str(data.get('tool')))}[/]"
                f"[dim]({escape(_short(data.get('arguments', '')))})[/]",
            )
        elif kind is EventType.TOOL_RESULT:
            error = data.get("error")
            if error:
                self._say(event, f"{head}[red]← {escape(str(data.get('tool')))} failed[/]")
            else:
                self._say(
                    event,
                    f"{head}[green]← {escape(str(data.get('tool')))}[/] "
                    f"[dim]{escape(_short(data.get('output', '')))}[/]",
                )
        elif kind is EventType.ERROR:
            self._say(event, f"{head}[red]✗ {escape(str(data.get('message', data)))}[/]")
        elif kind is EventType.RUN_FINISH:
            state = str(data.get("state"))
            if state == RunState.SUCCEEDED.value:
                self._say(event, f"{head}[green]✓[/] {escape(_short(data.get('output', '')))}")
            else:
                self._say(event, f"{head}[red]{escape(state)}[/]")


Show = Callable[[EventOut], Awaitable[None]]
Follow = Callable[..., Awaitable[TaskDetail]]


async def follow_tree(follow: Follow, root: str, show: Show, *, live: bool) -> TaskDetail:
    """Hand ``show`` the events of system run ``root`` and of each node run its
    ``child.start`` events name, followed side by side (``live``: until each ends, as
    ``follow(run_id, show, follow=live)`` does); returns the system run as it ended."""
    async with anyio.create_task_group() as group:

        async def shown(event: EventOut) -> None:
            await show(event)
            if event.run_id == root and event.type is EventType.CHILD_START:
                group.start_soon(node_of, str(event.data["run_id"]))

        async def node_of(run_id: str) -> None:
            await follow(run_id, show, follow=live)

        record = await follow(root, shown, follow=live)
    return record
