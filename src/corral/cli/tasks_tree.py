"""``corral tasks tree ID``: a task and the child tasks its ``agents_exec`` calls started,
theirs too, as an indented tree (or nested JSON with ``-o json``), embedded and remote alike.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import typer

from corral.cli.common import run_async
from corral.core.limits import MAX_TREE_TASKS

if TYPE_CHECKING:
    from corral.api import Task
    from corral.cli.backend import Backend


class Node:
    """One task of the tree and its children."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.children: list[Node] = []

    def to_json(self) -> dict[str, Any]:
        body = self.task.model_dump(mode="json")
        return {**body, "children": [child.to_json() for child in self.children]}


async def load_tree(backend: Backend, task_id: str) -> tuple[Node, bool]:
    """The tree under ``task_id``, breadth first; whether it was cut at MAX_TREE_TASKS."""
    root = Node(await backend.get_run(task_id))
    level, count = [root], 1
    while level:
        below: list[Node] = []
        for node in level:
            for child in await backend.children(node.task.id):
                if count >= MAX_TREE_TASKS:
                    return root, True
                count += 1
                grown = Node(child)
                node.children.append(grown)
                below.append(grown)
        level = below
    return root, False


def render_tree(root: Node) -> list[str]:
    """``id  agent  state`` per task, children under their parent with tree lines."""
    lines: list[str] = []

    def walk(node: Node, prefix: str, branch: str) -> None:
        task = node.task
        lines.append(f"{prefix}{branch}{task.id}  {task.agent}  {task.state.value}")
        inner = prefix + ("" if not branch else ("│  " if branch == "├─ " else "   "))
        for i, child in enumerate(node.children):
            walk(child, inner, "└─ " if i == len(node.children) - 1 else "├─ ")

    walk(root, "", "")
    return lines


def tasks_tree(
    task_id: str = typer.Argument(..., help="The task (run) id."),
    output: str = typer.Option("text", "-o", "--output", help="text or json."),
) -> None:
    """A task and its child tasks (those its agents_exec calls started), as a tree."""
    if output not in ("text", "json"):
        raise typer.BadParameter("choose text or json", param_hint="-o")

    async def go() -> tuple[Node, bool]:
        from corral.cli.connect import open_backend

        async with open_backend() as backend:
            return await load_tree(backend, task_id)

    root, cut = run_async(go())
    if output == "json":
        typer.echo(json.dumps(root.to_json(), ensure_ascii=False, indent=2))
    else:
        typer.echo("\n".join(render_tree(root)))
    if cut:
        typer.echo(f"(the tree has more than {MAX_TREE_TASKS} tasks: cut there)", err=True)
