"""Rendering of the API's bodies for the terminal: run events, tasks, resources.

The CLI renders what the API answers (:mod:`corral.api`) in both modes, and
``-o json`` prints the body itself. Progress (steps, tool calls, results,
errors) goes to stderr; the answer goes to stdout, so
``corral run agent "..." > answer.txt`` keeps just the answer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape

from corral.api import EventOut, ResourceOut, Task
from corral.cli.output import age, document
from corral.core.events import EventType
from corral.core.runs import RunState

_PREVIEW = 300


def _short(text: str, limit: int = _PREVIEW) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class EventPrinter:
    """Prints a run's events as they arrive."""

    def __init__(self, out: Console, err: Console, *, show_text: bool = True) -> None:
        self.out = out
        self.err = err
        self.show_text = show_text
        self.streamed_text = False
        self._line_open = False

    async def __call__(self, event: EventOut) -> None:
        self.render(event)

    def render(self, event: EventOut) -> None:
        data = event.data
        if event.type is EventType.TEXT_DELTA:
            if self.show_text:
                self.out.print(escape(str(data.get("text", ""))), end="", highlight=False)
                self.streamed_text = True
                self._line_open = True
            return
        self._close_line()
        if event.type is EventType.STEP_START:
            self.err.print(f"[dim]── step {data.get('step')} ──[/]")
        elif event.type is EventType.TOOL_CALL:
            self.err.print(
                f"[cyan]→ {escape(str(data.get('tool')))}[/]"
                f"[dim]({escape(_short(str(data.get('arguments', ''))))})[/]"
            )
        elif event.type is EventType.TOOL_RESULT:
            self._tool_result(data)
        elif event.type is EventType.APPROVAL_REQUESTED:
            self.err.print(
                f"[yellow]⏸ {escape(str(data.get('tool')))} waits for approval:[/] "
                f"{escape(str(data.get('reason', '')))}"
            )
        elif event.type is EventType.ERROR:
            self.err.print(f"[bold red]✗ {escape(str(data.get('message', data)))}[/]")

    def _tool_result(self, data: dict[str, Any]) -> None:
        error = data.get("error")
        tool = escape(str(data.get("tool")))
        if error:
            code = escape(str(error.get("code")))
            reason = escape(_short(str(error.get("reason", ""))))
            self.err.print(f"[red]← {tool} failed ({code}): {reason}[/]")
        else:
            output = escape(_short(str(data.get("output", ""))))
            self.err.print(f"[green]← {tool}[/] [dim]{output}[/]")

    def _close_line(self) -> None:
        if self._line_open:
            self.out.print()
            self._line_open = False

    def finish(self, record: Task) -> None:
        """Print the answer (unless it was streamed already) and a one-line summary."""
        self._close_line()
        if record.output is not None and not (
            self.streamed_text and isinstance(record.output, str)
        ):
            self.out.print(render_output(record.output), highlight=False, markup=False)
        usage = record.usage
        summary = (
            f"{record.state.value} · {record.steps} step(s) · "
            f"{usage.input_tokens}+{usage.output_tokens} tokens"
        )
        if record.cost_usd:
            summary += f" · ${record.cost_usd:.6f}"
        colour = {RunState.SUCCEEDED: "green", RunState.WAITING_APPROVAL: "yellow"}.get(
            record.state, "red"
        )
        self.err.print(f"[{colour}]{summary}[/] [dim]{record.id}[/]")


def render_output(output: Any) -> str:
    return output if isinstance(output, str) else json.dumps(output, indent=2, ensure_ascii=False)


def body_json(body: BaseModel | Sequence[BaseModel], *, indent: int | None = 2) -> str:
    """An API body, or a list of them, as JSON (``-o json``): what the API answers, with
    its timestamps as RFC 3339 text (:func:`corral.cli.output.document`)."""
    if isinstance(body, BaseModel):
        data: Any = document(body)
    else:
        data = [document(item) for item in body]
    return json.dumps(data, indent=indent, ensure_ascii=False)


def resource_document(resource: ResourceOut) -> dict[str, Any]:
    """A stored resource as the document ``apply`` takes (secret values stay redacted)."""
    data = resource.model_dump(mode="json", exclude_none=True)
    return {key: data[key] for key in ("apiVersion", "kind", "metadata", "spec")}


__all__ = ["EventPrinter", "age", "body_json", "render_output", "resource_document"]
