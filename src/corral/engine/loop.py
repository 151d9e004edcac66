"""The agent loop: model turn, parallel tool calls, results, next turn.

The loop knows nothing about where it runs (a CLI, a worker, a test): it gets a
live :class:`AgentDefinition`, an input and an event sink, and returns a
:class:`RunResult`. Events for one run are emitted strictly in order:

    run.start
      step.start  text.delta*  message.create  (tool.call+ tool.result+)?  step.finish
      ...
    run.finish | error run.finish

A tool call that needs a human's approval ends the run in ``waiting_approval``
after the step's other calls have run; the pending calls are in the result.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from corral.core.errors import CorralError, OutputValidationError
from corral.core.events import Event, EventSink, EventType
from corral.core.messages import Message, ModelResponse, TextDelta, ToolCall, Usage, dump
from corral.core.runs import PendingApproval, RunState
from corral.engine.budget import Budget
from corral.engine.structured import parse_output, repair_prompt, schema_instruction
from corral.models.base import Model, ModelSettings
from corral.resources.kinds import Limits
from corral.tools.base import ToolContext
from corral.tools.governance import ToolOutcome, Toolset


@dataclass
class AgentDefinition:
    """An agent made live: its model (with fallbacks) and governed tools."""

    name: str
    model: Model
    toolset: Toolset
    namespace: str = "default"
    instructions: str = ""
    limits: Limits = field(default_factory=Limits)
    model_settings: ModelSettings = field(default_factory=ModelSettings)
    output_schema: dict[str, Any] | None = None
    output_retries: int = 2
    stream: bool = True
    workspace: Path = field(default_factory=lambda: Path.cwd())


@dataclass
class RunResult:
    """Where a run ended and what it produced."""

    state: RunState
    output: Any = None
    error: dict[str, Any] | None = None
    messages: list[Message] = field(default_factory=list[Message])
    pending_approvals: list[PendingApproval] = field(default_factory=list[PendingApproval])
    steps: int = 0
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0


class Emitter:
    """Numbers events, redacts them and hands them to the sink in order."""

    def __init__(self, run_id: str, sink: EventSink, toolset: Toolset, first_seq: int = 1) -> None:
        self.run_id = run_id
        self._sink = sink
        self._redact = toolset.redactor.data
        self._seq = first_seq - 1

    async def __call__(self, type: EventType, **data: Any) -> None:
        self._seq += 1
        await self._sink(Event(self.run_id, self._seq, type, self._redact(data), time.time()))


class AgentLoop:
    """Runs one agent on one input; create one per run."""

    def __init__(self, agent: AgentDefinition, run_id: str, sink: EventSink) -> None:
        self.agent = agent
        self.run_id = run_id
        self.emit = Emitter(run_id, sink, agent.toolset)
        self.budget = Budget(agent.limits)
        self.messages: list[Message] = []

    async def run(self, user_input: str, history: Sequence[Message] = ()) -> RunResult:
        """Run to a final answer, a pause for approval, or a failure."""
        agent = self.agent
        system = agent.instructions
        if agent.output_schema is not None:
            system = f"{system}\n\n{schema_instruction(agent.output_schema)}".strip()
        self.messages = [Message.system(system)] if system else []
        self.messages += [*history, Message.user(user_input)]
        await self.emit(EventType.RUN_START, agent=agent.name, input=user_input)
        try:
            with anyio.fail_after(agent.limits.timeout_seconds):
                result = await self._steps()
        except TimeoutError:
            result = await self._failed(self.budget.timed_out())
        except CorralError as exc:
            result = await self._failed(exc)
        await self.emit(
            EventType.RUN_FINISH,
            state=result.state.value,
            output=result.output,
            steps=self.budget.steps,
            usage=dump(self.budget.usage),
            cost_usd=self.budget.cost_usd,
        )
        return result

    async def _steps(self) -> RunResult:
        repairs = 0
        while True:
            step = self.budget.start_step()
            await self.emit(EventType.STEP_START, step=step)
            response = await self._model_turn()
            self.messages.append(response.message)
            await self.emit(
                EventType.MESSAGE_CREATE,
                step=step,
                message=dump(response.message),
                endpoint=response.endpoint,
                usage=dump(response.usage),
                cost_usd=response.cost_usd,
            )
            self.budget.charge(response)
            calls = response.message.tool_calls
            if calls:
                pending = await self._tool_calls(step, calls)
                await self._finish_step(step)
                if pending:
                    return self._result(RunState.WAITING_APPROVAL, pending=pending)
                continue
            text = response.message.content
            if self.agent.output_schema is None:
                await self._finish_step(step)
                return self._result(RunState.SUCCEEDED, output=text)
            try:
                output = parse_output(text, self.agent.output_schema)
            except ValueError as problem:
                await self._finish_step(step)
                if repairs >= self.agent.output_retries:
                    raise OutputValidationError(
                        f"no valid structured output after {repairs} repair attempts: {problem}"
                    ) from problem
                repairs += 1
                self.messages.append(Message.user(repair_prompt(str(problem))))
                continue
            await self._finish_step(step)
            return self._result(RunState.SUCCEEDED, output=output)

    async def _model_turn(self) -> ModelResponse:
        agent = self.agent
        tools = agent.toolset.specs
        if not agent.stream:
            return await agent.model.request(self.messages, tools, agent.model_settings)
        final: ModelResponse | None = None
        async for item in agent.model.stream(self.messages, tools, agent.model_settings):
            if isinstance(item, TextDelta):
                await self.emit(EventType.TEXT_DELTA, text=item.text)
            else:
                final = item
        if final is None:  # a provider bug, not a user error
            raise CorralError(f"model {agent.model.name!r} ended its stream without a response")
        return final

    async def _tool_calls(self, step: int, calls: Sequence[ToolCall]) -> list[PendingApproval]:
        """Run the step's calls in parallel; each result goes to its own call, in call order."""
        toolset = self.agent.toolset
        for call in calls:
            await self.emit(
                EventType.TOOL_CALL,
                step=step,
                call_id=call.id,
                tool=toolset.ref_of(call.name),
                arguments=call.arguments,
            )
        outcomes: list[ToolOutcome | None] = [None] * len(calls)

        async def invoke(index: int, call: ToolCall) -> None:
            outcomes[index] = await toolset.invoke(call, self._context(step, index, call))

        async with anyio.create_task_group() as group:
            for index, call in enumerate(calls):
                group.start_soon(invoke, index, call)

        pending: list[PendingApproval] = []
        for outcome in outcomes:
            assert outcome is not None
            if outcome.needs_approval:
                assert outcome.error is not None
                approval = PendingApproval(
                    outcome.call.id, outcome.ref, outcome.call.arguments, outcome.error.reason
                )
                pending.append(approval)
                await self.emit(EventType.APPROVAL_REQUESTED, step=step, **dump(approval))
                continue
            self.messages.append(
                Message.tool(outcome.call, outcome.model_text(), is_error=outcome.error is not None)
            )
            await self.emit(
                EventType.TOOL_RESULT,
                step=step,
                call_id=outcome.call.id,
                tool=outcome.ref,
                output=outcome.output,
                error=dump(outcome.error) if outcome.error else None,
                attempts=outcome.attempts,
                duration_ms=outcome.duration_ms,
            )
        return pending

    def _context(self, step: int, index: int, call: ToolCall) -> ToolContext:
        agent = self.agent
        return ToolContext(
            run_id=self.run_id,
            agent=agent.name,
            namespace=agent.namespace,
            call_id=call.id,
            idempotency_key=f"{self.run_id}:{step}:{index}",
            workspace=agent.workspace,
        )

    async def _finish_step(self, step: int) -> None:
        await self.emit(
            EventType.STEP_FINISH,
            step=step,
            usage=dump(self.budget.usage),
            cost_usd=self.budget.cost_usd,
        )

    async def _failed(self, exc: CorralError) -> RunResult:
        error = exc.to_dict()
        await self.emit(EventType.ERROR, **error)
        return self._result(RunState.FAILED, error=error)

    def _result(
        self,
        state: RunState,
        *,
        output: Any = None,
        error: dict[str, Any] | None = None,
        pending: list[PendingApproval] | None = None,
    ) -> RunResult:
        return RunResult(
            state=state,
            output=output,
            error=error,
            messages=list(self.messages),
            pending_approvals=pending or [],
            steps=self.budget.steps,
            usage=self.budget.usage,
            cost_usd=self.budget.cost_usd,
        )
