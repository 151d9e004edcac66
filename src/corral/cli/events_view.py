"""A run's events for the terminal: what ``corral run`` streams and ``corral logs`` shows.

Progress (steps, tool calls and results, retries, approvals and their
decisions, errors, cancellation) goes to the progress console (stderr for
``corral run``), the streamed answer to the output console, so
``corral run agent "..." > answer.txt`` keeps just the answer. ``logs`` writes
both to stdout and ends with the run's final line (:meth:`EventPrinter.finish`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.console import Console

from corral.api import EventOut, Task
from corral.cli.common import escape, printable
from corral.cli.render import render_output
from corral.core.events import (
    AnyEventData,
    ApprovalRequestedData,
    ApprovalResolvedData,
    ChildFinishData,
    ChildStartData,
    ErrorData,
    HandoffData,
    MemorySearchData,
    MemoryWriteData,
    MessageCreateData,
    RunFinishData,
    RunStartData,
    StepStartData,
    TextDeltaData,
    ToolCallData,
    ToolResultData,
    WarningData,
)
from corral.core.runs import RunState

_PREVIEW = 300

_STATE_COLOUR = {
    RunState.SUCCEEDED: "green",
    RunState.WAITING_APPROVAL: "yellow",
    RunState.WAITING_CHILDREN: "yellow",
}


def _short(text: str, limit: int = _PREVIEW) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def readable(event: EventOut) -> AnyEventData | None:
    """The event's typed payload, or ``None`` when its data is not one (a server of
    another version may send fields this one does not know to be required)."""
    try:
        return event.payload()
    except (ValueError, TypeError):
        return None


def timestamp(ts: float | datetime) -> str:
    """An event's time as RFC 3339 in UTC, to the millisecond (``--timestamps``)."""
    when = ts if isinstance(ts, datetime) else datetime.fromtimestamp(ts, UTC)
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def seconds(value: Any) -> str:
    """A delay as people read it: ``0.4 s``, ``1.3 s``, ``12 s``."""
    number = float(value)
    return f"{number:.1f} s" if number < 10 else f"{number:.0f} s"


class EventPrinter:
    """Prints a run's events as they arrive.

    ``timestamps`` prefixes each progress line (and each line of streamed text)
    with the event's time; ``header`` shows the run's start (agent and input),
    which ``corral run`` leaves out (its user just typed them).
    """

    def __init__(
        self,
        out: Console,
        err: Console,
        *,
        show_text: bool = True,
        timestamps: bool = False,
        header: bool = False,
    ) -> None:
        self.out = out
        self.err = err
        self.show_text = show_text
        self.timestamps = timestamps
        self.header = header
        self.streamed_text = False
        self._line_open = False
        self._stamp = ""

    async def __call__(self, event: EventOut) -> None:
        self.render(event)

    def _say(self, markup: str) -> None:
        self.err.print(f"[dim]{self._stamp}[/]{markup}" if self._stamp else markup, soft_wrap=True)

    def render(self, event: EventOut) -> None:
        self._stamp = timestamp(event.ts) + " " if self.timestamps else ""
        data = readable(event)
        if data is None:  # a payload this version cannot read: shown as it came
            self._close_line()
            self._say(f"[dim]{escape(event.type.value)} {escape(_short(str(event.data)))}[/]")
            return
        if isinstance(data, TextDeltaData):
            self._text(data.text)
            return
        self._close_line()
        match data:
            case RunStartData(agent=agent, input=given) if self.header:
                self._say(f"[bold]▶ {escape(str(agent))}[/] [dim]{escape(_short(given))}[/]")
            case StepStartData(step=step):
                self._say(f"[dim]── step {step} ──[/]")
            case ToolCallData(tool=tool, arguments=arguments):
                self._say(f"[cyan]→ {escape(tool)}[/][dim]({escape(_short(arguments))})[/]")
            case ToolResultData():
                self._tool_result(data)
            case MessageCreateData(endpoint=endpoint, retries=retries):
                self._retries(endpoint or "model", retries)
            case ApprovalRequestedData(tool=tool, reason=reason):
                self._say(f"[yellow]⏸ {escape(tool)} waits for approval:[/] {escape(reason)}")
            case ApprovalResolvedData():
                self._say(approval_resolved_line(data))
            case ChildStartData(agent=agent, run_id=run_id):
                self._say(f"[cyan]⇢ {escape(agent)}[/] [dim]child run {escape(run_id)}[/]")
            case ChildFinishData(agent=agent, run_id=run_id, state=state):
                colour = "green" if state == RunState.SUCCEEDED.value else "red"
                self._say(
                    f"[{colour}]⇠ {escape(agent)} {escape(state)}[/] "
                    f"[dim]child run {escape(run_id)}[/]"
                )
            case MemoryWriteData():
                self._say(memory_write_line(data))
            case MemorySearchData():
                self._say(memory_search_line(data))
            case HandoffData(to=to, from_agent=from_agent, reason=reason):
                self._say(
                    f"[magenta]⇒ {escape(to)}[/] [dim]handoff from {escape(from_agent)}"
                    f"{': ' + escape(_short(reason)) if reason else ''}[/]"
                )
            case ErrorData():
                self._error(data)
            case WarningData(message=message):
                self._say(f"[yellow]! {escape(message)}[/]")
            case RunFinishData(state=RunState.CANCELLED.value):
                self._say("[red]⊘ cancelled[/]")
            case _:
                pass  # the other events (a step's end, a run's start without --header) print no line

    def _text(self, text: str) -> None:
        if not self.show_text:
            return
        if self._stamp and not self._line_open:
            self.out.print(f"[dim]{self._stamp}[/]", end="")
        if self._stamp and "\n" in text.rstrip("\n"):
            # every line of the answer carries the time it arrived at
            head, _, tail = text.rpartition("\n")
            text = head.replace("\n", f"\n{self._stamp}") + "\n" + tail
        self.out.print(escape(text), end="", highlight=False)
        self.streamed_text = True
        self._line_open = not text.endswith("\n")

    def _tool_result(self, data: ToolResultData) -> None:
        tool = escape(data.tool)
        self._retries(data.tool, data.retries)
        if data.error:
            code = escape(str(data.error.get("code")))
            reason = escape(_short(str(data.error.get("reason", ""))))
            self._say(f"[red]← {tool} failed ({code}): {reason}[/]")
        else:
            output = escape(_short(str(data.output if data.output is not None else "")))
            self._say(f"[green]← {tool}[/] [dim]{output}[/]")

    def _retries(self, what: str, retries: list[dict[str, Any]] | None) -> None:
        """The retries a tool call or a model turn went through (``retries`` of its event)."""
        for retry in retries or ():
            if isinstance(retry, dict):
                self._say(f"[yellow]↻ {escape(what)}: {escape(retry_line(retry))}[/]")

    def _error(self, data: ErrorData) -> None:
        if data.retry is not None:  # the attempt failed; the run is tried again (executor)
            self._say(f"[yellow]↻ run: {escape(retry_line(data.to_dict()))}[/]")
        else:
            self._say(f"[bold red]✗ {escape(data.message)}[/]")

    def _close_line(self) -> None:
        if self._line_open:
            self.out.print()
            self._line_open = False

    def finish(self, record: Task, *, output: bool = True) -> None:
        """Print the answer (unless it was streamed already) and the run's final line:
        its state, steps, tokens, cost and id."""
        self._close_line()
        if (
            output
            and record.output is not None
            and not (self.streamed_text and isinstance(record.output, str))
        ):
            self.out.print(printable(render_output(record.output)), highlight=False, markup=False)
        usage = record.usage
        summary = (
            f"{record.state.value} · {record.steps} step(s) · "
            f"{usage.input_tokens}+{usage.output_tokens} tokens"
        )
        if record.cost_usd:
            summary += f" · ${record.cost_usd:.6f}"
        if record.error and record.state is not RunState.SUCCEEDED:
            summary += f" · {record.error.get('code', 'error')}"
        colour = _STATE_COLOUR.get(record.state, "red")
        when = timestamp(record.finished_at) + " " if self.timestamps and record.finished_at else ""
        self.err.print(
            f"[dim]{when}[/][{colour}]{escape(summary)}[/] [dim]{record.id}[/]", soft_wrap=True
        )


def retry_line(retry: dict[str, Any]) -> str:
    """``retry 2/3 in 1.3 s: 503 from http://...``: one retry of a call, a turn or a run
    (``retry`` is the attempt that comes next; ``max_attempts``, ``retry_in`` and the
    cause's ``code``/``message`` or ``reason`` when the journal has them)."""
    text = f"retry {retry.get('retry', '?')}"
    if retry.get("max_attempts"):
        text += f"/{retry['max_attempts']}"
    if retry.get("retry_in") is not None:
        text += f" in {seconds(retry['retry_in'])}"
    cause = retry.get("message") or retry.get("reason")
    code = retry.get("code")
    if code and cause:
        return f"{text}: {_short(str(cause))} ({code})"
    return f"{text}: {_short(str(cause or code or 'failed'))}"


def memory_write_line(data: MemoryWriteData) -> str:
    """A ``memory.write`` event: what a tool call wrote to which Memory (one entry, or the
    chunks of an ingest), and a preview of the (redacted) text the event carries."""
    memory = escape(data.memory)
    if data.failed:
        return f"[red]✎ memory {memory}: failed ({escape(data.failed)})[/]{_cost(data)}"
    preview = escape(_short(data.preview or "", 80))
    if data.key_prefix is not None:
        what = f"ingested {data.chunks} chunk(s) as {escape(data.key_prefix)}#N"
        if data.written != data.chunks:
            what += f" ({data.written} new: the others were written before)"
    else:
        what = f"wrote {escape(str(data.key))}"
        if data.written is False:
            what += " (written before: not again)"
    chars = f", {data.chars} chars" if data.chars is not None else ""
    return f"[magenta]✎ memory {memory}:[/] {what}[dim]{chars} “{preview}”[/]{_cost(data)}"


def memory_search_line(data: MemorySearchData) -> str:
    """A ``memory.search`` event: the Memory, the query's preview and how many hits."""
    memory = escape(data.memory)
    if data.failed:
        return f"[red]⌕ memory {memory}: failed ({escape(data.failed)})[/]{_cost(data)}"
    query = escape(_short(data.query or "", 80))
    return f"[magenta]⌕ memory {memory}:[/] “{query}” [dim]→ {data.hits} hit(s)[/]{_cost(data)}"


def _cost(data: MemoryWriteData | MemorySearchData) -> str:
    """What a memory call's embeddings cost the run (nothing when it embedded nothing)."""
    if data.usage is None:
        return ""
    tokens = data.usage.get("input_tokens", 0)
    return f"[dim] (embedded {tokens} tokens, ${data.cost_usd or 0:.6f})[/]"


def approval_resolved_line(data: ApprovalResolvedData) -> str:
    """A human decision (or an expiry) as journaled in ``approval.resolved``: the tool,
    approved or rejected, by whom, when, and the reason."""
    tool = escape(data.tool or data.call_id)
    if data.expired:
        return f"[red]✗ {tool}: the approval request expired[/]"
    verdict = "[green]✓ " if data.approved else "[red]✗ "
    verdict += f"{tool} {'approved' if data.approved else 'rejected'}"
    if data.by:
        verdict += f" by {escape(data.by)}"
    if data.decided_at:
        verdict += f" at {timestamp(data.decided_at)}"
    verdict += "[/]"
    if data.reason:
        verdict += f": {escape(data.reason)}"
    return verdict
