"""``corral chat``: talk to an agent turn by turn in a session.

Each line is a run of the agent in the chat's session (durable like any run);
its progress goes to stderr, its answer to stdout. Lines that start with ``/``
are the chat's commands (:data:`HELP`). A run that stops for approval is decided
where it happens: on a terminal the chat asks ``approve? [y/N/r(eason)]`` for each
pending call and follows the run on to its answer; from a pipe nothing is asked
(nothing would answer): the chat prints each approval's id with the exact
``corral approvals approve|reject`` commands and goes on with the next line.

Exit code: 0, or 3 when a run of the chat still waits for approval as it ends;
2 before the first line when the agent does not exist (or the session belongs to
another agent); 130 when Ctrl-C stopped a run (what became of it is said).
"""

from __future__ import annotations

import shlex
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from corral.cli.common import (
    EXIT_OK,
    EXIT_WAITING_APPROVAL,
    NAMESPACE,
    Options,
    escape,
    print_error,
    run_async,
    session_id_option,
)

if TYPE_CHECKING:
    from corral.api import ApprovalOut, EventOut, TaskDetail
    from corral.cli.backend import Backend, RunControl
    from corral.cli.chat_input import ChatInput, Decision
    from corral.cli.events_view import EventPrinter

T = TypeVar("T")

PROMPT = "you> "
#: the slash commands (Tab completes them on a terminal)
COMMANDS = ("/help", "/approve", "/session", "/exit", "/quit")

HELP = """\
/help                               this help
/approve [ID] [--reject] [REASON]   decide an approval and follow its run on (ID: the one
                                    this chat's run waits for, when there is one)
/session                            the session's id, agent and message count
/exit                               leave (also /quit and Ctrl-D)
//TEXT                              say a line that starts with "/"
At "approve? [y/N/r(eason)]": y approves, n or Enter rejects, r asks for a reason and
rejects; Ctrl-C or Ctrl-D leaves the call pending (decide it later with /approve or
corral approvals)."""

#: what a turn's follower hands back: the run as it ended or paused, and its pending approvals
Outcome = tuple["TaskDetail", list["ApprovalOut"]]


def register(app: typer.Typer) -> None:
    app.command(name="chat")(chat)


def chat(
    agent: str = typer.Argument(..., help="The agent to chat with."),
    namespace: str = NAMESPACE,
    session: str | None = typer.Option(
        None,
        "--session",
        help="Continue this session (default: a new one).",
        callback=session_id_option,
    ),
) -> None:
    """Talk to an agent turn by turn in a session (/help lists the commands; Ctrl-D or
    /exit leaves).

    On a terminal, lines are edited with readline and kept in a history
    ($XDG_STATE_HOME/corral/chat_history), and a run that stops for approval is
    decided inline. Exit code 0, 3 when a run of the chat still waits for approval
    as it ends, 2 when the agent does not exist, 130 when Ctrl-C stopped a run.
    """
    from corral.cli.chat_input import ChatInput
    from corral.core.ids import new_id

    session_id = session or new_id("chat")
    run_async(_check(agent, namespace, session_id))  # before any line is read
    lines = ChatInput.open(COMMANDS)
    raise typer.Exit(Chat(agent, namespace, session_id, lines).loop())


async def _check(agent: str, namespace: str, session_id: str) -> None:
    """The agent exists and the session (when it exists) is the agent's: exit 2 otherwise."""
    from corral.cli.connect import open_backend
    from corral.core.errors import ConflictError, NotFoundError

    async with open_backend() as backend:
        if await backend.get_resource(namespace, "Agent", agent) is None:
            raise NotFoundError(f"Agent {agent!r} not found in namespace {namespace!r}")
        found = await backend.get_session(namespace, session_id)
        if found is not None and found.agent != agent:
            raise ConflictError(
                f"session {session_id!r} belongs to agent {found.agent!r}, not {agent!r}"
            )


class Chat:
    """One chat: its session, the runs of it left waiting for approval, its lines."""

    def __init__(self, agent: str, namespace: str, session_id: str, lines: ChatInput) -> None:
        from rich.console import Console

        self.agent = agent
        self.namespace = namespace
        self.session_id = session_id
        self.lines = lines
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)
        self.out = Console(highlight=False, soft_wrap=True)
        self.waiting: dict[str, None] = {}  # runs of this chat that wait for approval, in order
        self.shown: dict[str, int] = {}  # the last event shown of each run

    # ------------------------------------------------------------------ the loop

    def loop(self) -> int:
        """Read and answer lines until /exit or the end of input; the exit code."""
        from corral.cli.interrupts import Interrupted, exit_interrupted

        for warning in self.lines.warnings:
            self.err.print(f"[yellow]warning:[/] {escape(warning)}")
        self.err.print(
            f"[dim]chatting with {escape(self.agent)} in session {self.session_id} — "
            "/help for commands, Ctrl-D or /exit to leave[/]"
        )
        try:
            self.converse()
            return self.exit_code()
        except Interrupted:
            self.lines.save()  # exit_interrupted leaves at once
            exit_interrupted()
        finally:
            self.lines.save()

    def converse(self) -> None:
        """Lines until /exit or the end of input."""
        from corral.cli.chat_input import is_text

        while True:
            try:
                line = self.lines.read(PROMPT)
            except KeyboardInterrupt:  # at the prompt: drop the line, as a shell does
                self.err.print()
                continue
            if line is None:
                if self.lines.asks:
                    self.err.print()
                break
            if not line.strip():
                continue
            if not is_text(line):
                print_error("the line is not UTF-8 text; it was not sent")
                continue
            self.lines.remember(line)
            text = line.strip()
            if text.startswith("/") and not text.startswith("//"):
                if not self.command(text):
                    break
                continue
            self.turn(text[1:] if text.startswith("//") else line)

    def command(self, text: str) -> bool:
        """Run a slash command; ``False`` when the chat ends."""
        name, *more = text.split(maxsplit=1)
        rest = more[0] if more else ""
        if name in ("/exit", "/quit"):
            return False
        if name == "/help":
            self.err.print(HELP, markup=False)
        elif name == "/session":
            self.show_session()
        elif name == "/approve":
            self.approve_command(rest)
        else:
            self.err.print(
                f"unknown command {escape(name)}: /help lists the commands "
                "(//TEXT says a line that starts with /)"
            )
        return True

    def exit_code(self) -> int:
        """3 when a run of this chat still waits for approval (said), else 0."""
        if not self.waiting:
            return EXIT_OK
        still = self.call(self._still_waiting())
        for run_id in still or []:
            self.err.print(
                f"[yellow]run {run_id} still waits for approval:[/] corral approvals list"
            )
        return EXIT_WAITING_APPROVAL if still else EXIT_OK

    # ------------------------------------------------------------------ turns

    def turn(self, prompt: str) -> None:
        """One line said to the agent: a run in the session, followed to its answer."""
        outcome = self.call(self._run(prompt))
        if outcome is not None:
            self.settle(*outcome)

    def settle(self, record: TaskDetail, approvals: list[ApprovalOut]) -> None:
        """A run that stopped for approval: ask for each call and follow the run on
        (on a terminal), or say how to decide and go on."""
        from corral.core.runs import RunState

        while record.state is RunState.WAITING_APPROVAL:
            self.waiting[record.id] = None
            decisions = self.ask(approvals) if self.lines.asks and approvals else None
            if decisions is None:
                self.hint(record, approvals)
                return
            outcome = self.call(self._decide(record.id, decisions))
            if outcome is None:
                return
            record, approvals = outcome
        self.waiting.pop(record.id, None)

    def ask(self, approvals: list[ApprovalOut]) -> list[tuple[str, Decision]] | None:
        """The decision for each pending call; ``None`` when one is left pending."""
        from corral.cli.approval_hints import approval_line

        decisions: list[tuple[str, Decision]] = []
        for approval in approvals:
            self.err.print(approval_line(approval))  # the reason was shown with the pause
            decision = self.lines.ask_approval()
            if decision is None:
                return None
            decisions.append((approval.id, decision))
        return decisions

    def hint(self, record: TaskDetail, approvals: list[ApprovalOut]) -> None:
        from corral.cli.approval_hints import print_approval_hint

        print_approval_hint(self.err, record, approvals)
        self.err.print("[dim]or decide it here: /approve [ID] [--reject] [REASON][/]")

    # ------------------------------------------------------------------ commands

    def show_session(self) -> None:
        found = self.call(self._session())
        if found is None:
            return
        exists, count = found
        state = f"{count} message(s)" if exists else "new: the first line creates it"
        waits = f" · {len(self.waiting)} run(s) wait for approval" if self.waiting else ""
        self.err.print(
            f"session {self.session_id} · agent {escape(self.agent)} · "
            f"namespace {escape(self.namespace)} · {state}{waits}"
        )

    def approve_command(self, rest: str) -> None:
        """``/approve [ID] [--reject] [REASON]``: decide, then follow the run on when it
        is this chat's."""
        from corral.cli.chat_input import Decision

        try:
            words = shlex.split(rest)
        except ValueError as exc:
            self.err.print(f"[red]/approve: {escape(str(exc))}[/]")
            return
        reject = "--reject" in words
        words = [w for w in words if w != "--reject"]
        flags = [w for w in words if w.startswith("--")]
        if flags:
            self.err.print(f"[red]/approve: unknown option {escape(flags[0])}[/]: /help")
            return
        approval_id = words.pop(0) if words and words[0].startswith("apr_") else None
        decision = Decision(not reject, " ".join(words) or None)
        outcome = self.call(self._approve(approval_id, decision))
        if outcome is not None:
            self.settle(*outcome)

    # ------------------------------------------------------------------ async work

    def call(self, coro: Coroutine[Any, Any, T]) -> T | None:
        """Run one piece of the chat's async work; a Corral error is one line and the
        chat goes on (``None``)."""
        import asyncio

        from corral.core.errors import CorralError

        try:
            return asyncio.run(coro)
        except CorralError as exc:
            if Options.debug:
                raise
            print_error(escape(exc.message))
            return None
        except KeyboardInterrupt:  # before the run was stored: nothing to keep
            from corral.cli.interrupts import Interrupted

            self.err.print("[yellow]interrupted[/]")
            raise Interrupted from None

    async def _run(self, prompt: str) -> Outcome:
        from corral.cli.connect import open_backend
        from corral.cli.interrupts import interruptible, spinner

        control, show, printer = self._following()
        async with open_backend() as backend, interruptible(control, self.err):
            record = await backend.run(
                self.agent,
                prompt,
                namespace=self.namespace,
                session=self.session_id,
                output_schema=None,
                show=show,
                loading=spinner(self.err),
                control=control,
            )
            return await self._ended(backend, control, printer, record)

    async def _decide(self, run_id: str, decisions: list[tuple[str, Decision]]) -> Outcome:
        """Record the decisions, then follow the run on (executing it here, embedded)."""
        from corral.cli.connect import open_backend
        from corral.core.errors import ConflictError

        async with open_backend() as backend:
            for approval_id, decision in decisions:
                try:
                    await backend.decide(approval_id, decision.approved, decision.reason)
                except ConflictError as exc:  # decided elsewhere meanwhile: the run goes on
                    print_error(escape(exc.message))
            return await self._follow_on(backend, run_id)

    async def _approve(self, approval_id: str | None, decision: Decision) -> Outcome | None:
        from corral.cli.connect import open_backend

        async with open_backend() as backend:
            if approval_id is None:
                approval_id = await self._only_pending(backend)
                if approval_id is None:
                    return None
            decided = await backend.decide(approval_id, decision.approved, decision.reason)
            verdict = "approved" if decision.approved else "rejected"
            run = await backend.get_run(decided.run_id)
            if decided.run_id not in self.waiting and run.session_id != self.session_id:
                self.err.print(
                    f"approval {decided.id} {verdict}; run {run.id} is not this chat's: "
                    f"follow it with corral logs -f {run.id}"
                )
                return None
            return await self._follow_on(backend, decided.run_id)

    async def _only_pending(self, backend: Backend) -> str | None:
        """The one approval this chat's runs wait for; said why not when there is none
        or several."""
        pending: list[ApprovalOut] = []
        for run_id in self.waiting:
            pending += await backend.list_approvals(self.namespace, ["pending"], run_id=run_id)
        if len(pending) == 1:
            return pending[0].id
        if not pending:
            self.err.print(
                "no run of this chat waits for approval; /approve ID decides another "
                "(corral approvals list)"
            )
        else:
            self.err.print(f"{len(pending)} approvals wait; name one: /approve ID")
            from corral.cli.approval_hints import approval_line

            for approval in pending:
                self.err.print(f"  {approval_line(approval)}")
        return None

    async def _follow_on(self, backend: Backend, run_id: str) -> Outcome:
        from corral.cli.interrupts import interruptible, spinner

        control, show, printer = self._following()
        control.run_id = run_id
        async with interruptible(control, self.err):
            record = await backend.see_through(
                run_id, show, loading=spinner(self.err), control=control
            )
            return await self._ended(backend, control, printer, record)

    def _following(self) -> tuple[RunControl, Any, EventPrinter]:
        """A control, and a printer that shows each event of a run once (a run followed
        on after a decision is replayed from its first event)."""
        from corral.cli.backend import RunControl
        from corral.cli.events_view import EventPrinter

        printer = EventPrinter(self.out, self.err)

        async def show(event: EventOut) -> None:
            if event.seq > self.shown.get(event.run_id, 0):
                self.shown[event.run_id] = event.seq
                printer.render(event)

        return RunControl(), show, printer

    async def _ended(
        self, backend: Backend, control: RunControl, printer: EventPrinter, record: TaskDetail
    ) -> Outcome:
        """Print the end of a run (or its pause) and list what it waits for."""
        from corral.cli.interrupts import Interrupted, say_interrupted
        from corral.core.runs import RunState

        if control.stop.is_set():
            say_interrupted(self.err, record)
            raise Interrupted
        approvals: list[ApprovalOut] = []
        if record.state is RunState.WAITING_APPROVAL:
            printer.finish(record, output=False)
            approvals = await backend.list_approvals(
                record.namespace, ["pending"], run_id=record.id
            )
        else:
            printer.finish(record)
        return record, approvals

    async def _session(self) -> tuple[bool, int]:
        from corral.cli.connect import open_backend

        async with open_backend() as backend:
            if await backend.get_session(self.namespace, self.session_id) is None:
                return False, 0
            messages = await backend.session_messages(
                self.namespace, self.session_id, include_hidden=False
            )
            return True, len(messages)

    async def _still_waiting(self) -> list[str]:
        from corral.cli.connect import open_backend
        from corral.core.errors import NotFoundError
        from corral.core.runs import RunState

        still: list[str] = []
        async with open_backend() as backend:
            for run_id in self.waiting:
                try:
                    run = await backend.get_run(run_id)
                except NotFoundError:
                    continue
                if run.state is RunState.WAITING_APPROVAL:
                    still.append(run_id)
        return still
