"""The governance layer every tool call passes through, whatever the tool kind.

In order, for one call the model asked for:

1. the tool exists for this agent            else ``unsupported_tool``
2. the agent's roles permit it (fail closed) else ``permission_denied``
3. the arguments are at most the tool's
   ``max_input_bytes``, a JSON object that
   matches the tool's JSON Schema            else ``invalid_input`` (the model may correct itself)
4. no human approval is needed, or it was
   given                                     else ``approval_required`` (the run pauses)
5. the tool's circuit is closed              else ``circuit_open``
6. the call runs under the tool's timeout,
   retried per its retry policy              ``timeout``, ``execution_failed``, ...
7. the output is redacted (before it is encoded as text) and capped

Arguments over the size cap (or nested too deep) are not kept: the engine
replaces them in the model's message by a short marker (:meth:`Toolset.bound`)
before the message is journaled or sent again, and the marker fails check 3.

Every failure is a :class:`~corral.core.errors.ToolErrorInfo` in the
:class:`ToolOutcome`; nothing here raises for a failed call, so one bad call
never takes down its siblings in a parallel step.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import anyio
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from corral.core.backoff import jittered_backoff
from corral.core.errors import ToolError, ToolErrorCode, ToolErrorInfo
from corral.core.limits import DocumentLimits, json_too_deep_at
from corral.core.messages import Message, ToolCall, ToolSpec
from corral.core.redaction import Redactor
from corral.core.schemas import Unresolvable, local_validator, unresolvable_reason
from corral.resources.kinds import (
    MAX_INPUT_BYTES,
    ApprovalPolicy,
    CircuitBreakerPolicy,
    McpServerSpec,
    RetryPolicy,
    RiskLevel,
    ToolApproval,
    ToolSpecModel,
)
from corral.tools.base import ChildRun, Handoff, Tool, ToolContext

log = logging.getLogger(__name__)

_RISK_ORDER: dict[str, int] = {"low": 0, "medium": 1, "high": 2}
# Failures that say something about the tool's health; others are the caller's doing.
_BREAKER_CODES = frozenset(
    {ToolErrorCode.EXECUTION_FAILED, ToolErrorCode.TIMEOUT, ToolErrorCode.UNAVAILABLE}
)


@dataclass(frozen=True)
class ToolPolicy:
    """The per-tool rules, taken from a ``Tool`` or ``McpServer`` resource."""

    risk: RiskLevel = "low"
    approval: ToolApproval = "inherit"
    timeout_seconds: float = 30.0
    retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(max_attempts=1))
    breaker: CircuitBreakerPolicy = field(default_factory=CircuitBreakerPolicy)
    max_output_bytes: int = 65536
    max_input_bytes: int = MAX_INPUT_BYTES

    @staticmethod
    def of_tool(spec: ToolSpecModel) -> ToolPolicy:
        return ToolPolicy(
            spec.risk,
            spec.approval,
            spec.timeout_seconds,
            spec.retry,
            spec.circuit_breaker,
            spec.max_output_bytes,
            spec.max_input_bytes,
        )

    @staticmethod
    def of_mcp_server(spec: McpServerSpec) -> ToolPolicy:
        return ToolPolicy(
            spec.risk,
            spec.approval,
            spec.call_timeout_seconds,
            max_output_bytes=spec.max_output_bytes,
            max_input_bytes=spec.max_input_bytes,
        )


class CircuitBreaker:
    """Consecutive failures open the circuit; after ``reset_seconds`` one trial call is let through.

    closed --N failures--> open --reset_seconds--> half-open --success--> closed
                                                         \\--failure--> open
    """

    def __init__(
        self, policy: CircuitBreakerPolicy, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.policy = policy
        self._clock = clock
        self._failures = 0
        self._opened_at: float | None = None
        self._trial_in_flight = False

    @property
    def state(self) -> Literal["closed", "open", "half-open"]:
        if self._opened_at is None:
            return "closed"
        if self._clock() - self._opened_at >= self.policy.reset_seconds:
            return "half-open"
        return "open"

    def allow(self) -> bool:
        """Whether a call may go through now (claims the trial slot when half-open)."""
        state = self.state
        if state == "closed":
            return True
        if state == "half-open" and not self._trial_in_flight:
            self._trial_in_flight = True
            return True
        return False

    def release(self) -> None:
        """End a call that said nothing about the tool's health (bad arguments, blocked URL)."""
        self._trial_in_flight = False

    def record(self, ok: bool) -> None:
        self._trial_in_flight = False
        if ok:
            self._failures = 0
            self._opened_at = None
            return
        self._failures += 1
        if self._opened_at is not None or self._failures >= self.policy.failure_threshold:
            self._opened_at = self._clock()

    def retry_in(self) -> float:
        if self._opened_at is None:
            return 0.0
        return max(0.0, self.policy.reset_seconds - (self._clock() - self._opened_at))


class Permissions:
    """Which tool refs an agent may call, from its roles' ToolPermissions.

    ``rules`` is a list of ``(effect, patterns)``. With no roles at all the
    agent's own tool list is its allow-list (``rules=None``). With roles, a call
    needs an ``allow`` rule that matches and no ``deny`` rule that matches:
    anything unmatched is denied.
    """

    def __init__(self, rules: Sequence[tuple[str, Sequence[str]]] | None) -> None:
        self.rules = None if rules is None else [(e, tuple(p)) for e, p in rules]

    def allows(self, ref: str) -> bool:
        """Whether a call of ``ref`` passes :meth:`check`."""
        try:
            self.check(ref)
        except ToolError:
            return False
        return True

    def check(self, ref: str) -> None:
        if self.rules is None:
            return
        matches = [effect for effect, patterns in self.rules if _matches_any(ref, patterns)]
        if "deny" in matches:
            raise ToolError(ToolErrorCode.PERMISSION_DENIED, f"a role denies tool {ref!r}")
        if "allow" not in matches:
            raise ToolError(
                ToolErrorCode.PERMISSION_DENIED, f"no role of this agent allows tool {ref!r}"
            )


def _matches_any(ref: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(ref, p) for p in patterns)


def needs_approval(agent_policy: ApprovalPolicy, tool: ToolPolicy) -> bool:
    """A tool's own ``always``/``never`` wins; otherwise the agent's policy decides."""
    if tool.approval != "inherit":
        return tool.approval == "always"
    if agent_policy.policy == "by_risk":
        return _RISK_ORDER[tool.risk] >= _RISK_ORDER[agent_policy.min_risk]
    return agent_policy.policy == "always"


@dataclass
class Attempts:
    """How many times one call's tool ran, retries included (0: it never started), and
    each retry: the attempt that came next, of how many, after how long, and why."""

    count: int = 0
    retries: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])


@dataclass(frozen=True)
class ToolOutcome:
    """What came of one tool call: the text the model sees, or an error."""

    call: ToolCall
    ref: str
    output: str
    error: ToolErrorInfo | None = None
    attempts: int = 0
    duration_ms: float = 0.0
    #: the retries before the outcome (see :class:`Attempts`), journaled with the result
    retries: tuple[dict[str, Any], ...] = ()
    #: the child run the call started: no result yet, the run waits for the child's
    child: ChildRun | None = None
    #: the agent the call hands the conversation to (``handoff``)
    handoff: Handoff | None = None

    @property
    def needs_approval(self) -> bool:
        return self.error is not None and self.error.code == ToolErrorCode.APPROVAL_REQUIRED

    def model_text(self) -> str:
        """The tool message content: the output, or the error as JSON the model can act on."""
        return tool_message_text(self.output, self.error)


def tool_message_text(output: str, error: ToolErrorInfo | Mapping[str, Any] | None) -> str:
    """What the model sees of a tool result: the output, or the error as JSON.

    Also used to rebuild tool messages from stored ``tool.result`` events.
    """
    if error is None:
        return output
    if isinstance(error, ToolErrorInfo):
        code, reason = error.code, error.reason
    else:
        code, reason = str(error.get("code")), str(error.get("reason"))
    return json.dumps({"error": {"code": code, "message": reason}}, ensure_ascii=False)


class GovernedTool:
    """One tool with its policy, circuit breaker and argument validator."""

    def __init__(self, tool: Tool, policy: ToolPolicy) -> None:
        self.tool = tool
        self.policy = policy
        self.breaker = CircuitBreaker(policy.breaker)
        try:
            self._validator: Draft202012Validator | None = local_validator(tool.spec.parameters)
            self._validator.check_schema(tool.spec.parameters)
        except SchemaError as exc:
            raise ToolError(
                ToolErrorCode.UNSUPPORTED_TOOL, f"tool {tool.ref!r} has an invalid schema: {exc}"
            ) from exc

    @property
    def spec(self) -> ToolSpec:
        return self.tool.spec

    def validate(self, call: ToolCall) -> dict[str, Any]:
        """The call's arguments as a dict, or ``invalid_input`` naming every problem."""
        too_large = input_problem(call, self.policy.max_input_bytes)
        if too_large is not None:
            raise ToolError(ToolErrorCode.INVALID_INPUT, too_large)
        try:
            arguments = call.parsed_arguments()
        except ValueError as exc:
            raise ToolError(
                ToolErrorCode.INVALID_INPUT, f"arguments are not valid JSON: {exc}"
            ) from exc
        if not isinstance(arguments, dict):
            raise ToolError(ToolErrorCode.INVALID_INPUT, "arguments must be a JSON object")
        if CUT_ARGUMENTS in arguments:  # arguments Toolset.bound replaced
            raise ToolError(ToolErrorCode.INVALID_INPUT, str(arguments[CUT_ARGUMENTS]))
        assert self._validator is not None
        try:
            problems = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.path))
        except Unresolvable as exc:
            raise ToolError(
                ToolErrorCode.UNSUPPORTED_TOOL,
                f"tool {self.tool.ref!r}: {unresolvable_reason(exc)}",
            ) from None
        if problems:
            reasons = "; ".join(
                f"{'/'.join(str(p) for p in e.path) or '(root)'}: {e.message}" for e in problems
            )
            raise ToolError(ToolErrorCode.INVALID_INPUT, reasons)
        return arguments

    async def execute(
        self, arguments: dict[str, Any], ctx: ToolContext, attempts: Attempts | None = None
    ) -> Any:
        """Run the call under timeout and retry policy; ``attempts`` counts the tries,
        whether the call ends in a result or an error."""
        attempts = attempts if attempts is not None else Attempts()
        if not self.breaker.allow():
            raise ToolError(
                ToolErrorCode.CIRCUIT_OPEN,
                f"tool {self.tool.ref!r} failed repeatedly; circuit open for another "
                f"{self.breaker.retry_in():.0f}s",
                retryable=True,
            )
        retry = self.policy.retry
        while True:
            attempts.count += 1
            attempt = attempts.count
            try:
                result = await self._attempt(arguments, ctx)
            except ToolError as exc:
                if exc.code in _BREAKER_CODES:
                    self.breaker.record(False)
                else:
                    self.breaker.release()
                if not exc.retryable or attempt >= retry.max_attempts or not self.breaker.allow():
                    raise
                delay = jittered_backoff(
                    attempt, retry.initial_backoff_seconds, retry.max_backoff_seconds
                )
                attempts.retries.append(
                    {
                        "retry": attempt + 1,
                        "max_attempts": retry.max_attempts,
                        "retry_in": round(delay, 3),
                        "code": str(exc.code),
                        "reason": exc.info.reason,
                    }
                )
                await anyio.sleep(delay)
                continue
            self.breaker.record(True)
            return result

    async def _attempt(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        try:
            with anyio.fail_after(self.policy.timeout_seconds):
                return await self.tool.call(arguments, ctx)
        except TimeoutError as exc:
            raise ToolError(
                ToolErrorCode.TIMEOUT,
                f"tool {self.tool.ref!r} did not finish within {self.policy.timeout_seconds:g}s",
                retryable=True,
            ) from exc
        except ToolError:
            raise
        except Exception as exc:
            log.exception("tool %s raised unexpectedly", self.tool.ref)
            raise ToolError(ToolErrorCode.EXECUTION_FAILED, f"{type(exc).__name__}: {exc}") from exc


class Toolset:
    """The governed tools of one agent, looked up by the names the model sees."""

    def __init__(
        self,
        tools: Sequence[GovernedTool],
        *,
        permissions: Permissions | None = None,
        approval: ApprovalPolicy | None = None,
        redactor: Redactor | None = None,
    ) -> None:
        self.by_name = {t.spec.name: t for t in tools}
        self.permissions = permissions or Permissions(None)
        self.approval = approval or ApprovalPolicy()
        self.redactor = redactor or Redactor()

    @property
    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self.by_name.values()]

    def ref_of(self, model_name: str) -> str:
        tool = self.by_name.get(model_name)
        return tool.tool.ref if tool else model_name

    def bound(self, message: Message) -> Message:
        """The model's message as the run keeps it: each call's arguments over its tool's
        ``max_input_bytes`` (or nested too deep) replaced by a marker naming the problem.

        The run journals, stores and sends back this message, never the original, so
        the conversation is the same when replayed; the marked call fails with
        ``invalid_input``, and the model sees why and a glimpse of what it sent.
        """
        calls = tuple(self._bound_call(call) for call in message.tool_calls)
        if all(new is old for new, old in zip(calls, message.tool_calls, strict=True)):
            return message
        return replace(message, tool_calls=calls)

    def _bound_call(self, call: ToolCall) -> ToolCall:
        governed = self.by_name.get(call.name)
        cap = governed.policy.max_input_bytes if governed else MAX_INPUT_BYTES
        problem = input_problem(call, cap)
        if problem is None:
            return call
        marker = {CUT_ARGUMENTS: problem, "start": call.arguments[:_CUT_GLIMPSE_CHARS]}
        return replace(call, arguments=json.dumps(marker, ensure_ascii=False))

    def plants_environment(self, model_name: str) -> bool:
        """Whether a call of this tool hands its planted variables to a process."""
        tool = self.by_name.get(model_name)
        return tool is not None and tool.tool.plants_environment

    def shares_budget(self, model_name: str) -> bool:
        """Whether a call of this tool can spend the run's budget outside the run: it starts
        child runs, or its process gets the planted variables (an agent token, for agents
        with links)."""
        tool = self.by_name.get(model_name)
        return tool is not None and (tool.tool.starts_children or tool.tool.plants_environment)

    def is_idempotent(self, model_name: str) -> bool:
        tool = self.by_name.get(model_name)
        return tool is not None and tool.tool.idempotent

    async def invoke(
        self,
        call: ToolCall,
        ctx: ToolContext,
        *,
        approved: bool = False,
        on_start: Callable[[], Awaitable[None]] | None = None,
    ) -> ToolOutcome:
        """Run one call through every check; never raises for a failed call.

        ``on_start`` is awaited once every check has passed, just before the
        tool executes: the engine journals the call there.
        """
        started = time.perf_counter()
        governed = self.by_name.get(call.name)
        ref = governed.tool.ref if governed else call.name
        attempts = Attempts()
        redact = self.redactor.merged(Redactor(ctx.hidden)) if ctx.hidden else self.redactor
        try:
            if governed is None:
                known = ", ".join(sorted(self.by_name)) or "none"
                raise ToolError(
                    ToolErrorCode.UNSUPPORTED_TOOL,
                    f"no tool named {call.name!r} (available: {known})",
                )
            if not governed.tool.by_target:
                self.permissions.check(ref)
            arguments = governed.validate(call)
            for target in governed.tool.targets(arguments):
                self.permissions.check(target)
            if not approved and needs_approval(self.approval, governed.policy):
                raise ToolError(
                    ToolErrorCode.APPROVAL_REQUIRED,
                    f"tool {ref!r} (risk {governed.policy.risk}) needs a human's approval",
                )
            if on_start is not None:
                await on_start()
            result = await governed.execute(arguments, ctx, attempts)
        except ToolError as exc:
            info = exc.info
            reason = redact.text(info.reason)
            error = ToolErrorInfo(info.code, reason, info.retryable, redact.data(info.details))
            retries = tuple(redact.data(r) for r in attempts.retries)
            return ToolOutcome(call, ref, "", error, attempts.count, _ms_since(started), retries)
        if isinstance(result, ChildRun):
            ms = _ms_since(started)
            return ToolOutcome(call, ref, "", None, attempts.count, ms, child=result)
        if isinstance(result, Handoff):
            output = f"handing the conversation to agent {result.agent!r}"
            ms = _ms_since(started)
            return ToolOutcome(call, ref, output, None, attempts.count, ms, handoff=result)
        output = _cap(self._redacted_text(result, redact), governed.policy.max_output_bytes)
        retries = tuple(redact.data(r) for r in attempts.retries)
        return ToolOutcome(call, ref, output, None, attempts.count, _ms_since(started), retries)

    def answered(self, call: ToolCall, result: Any, error: ToolErrorInfo | None) -> ToolOutcome:
        """The outcome of a call answered from outside the call (a child run's answer):
        redacted and capped as a result of the tool itself would be."""
        governed = self.by_name.get(call.name)
        ref = governed.tool.ref if governed else call.name
        if error is not None:
            redact = self.redactor
            info = ToolErrorInfo(
                error.code, redact.text(error.reason), error.retryable, redact.data(error.details)
            )
            return ToolOutcome(call, ref, "", info)
        cap = governed.policy.max_output_bytes if governed else ToolPolicy().max_output_bytes
        return ToolOutcome(call, ref, _cap(self._redacted_text(result, self.redactor), cap))

    @staticmethod
    def _redacted_text(result: Any, redact: Redactor) -> str:
        """The result as text, redacted: data before it is encoded (a secret with a quote in
        it is no longer whole once encoded), then the text (what an object's ``str`` gave).
        Most results name no secret: one scan of the encoded text finds that out."""
        text = _as_text(result)
        if not redact.found_in(text):
            return text
        if isinstance(result, str):
            return redact.text(result)
        return redact.text(_as_text(redact.data(result)))

    async def aclose(self) -> None:
        for governed in self.by_name.values():
            await governed.tool.aclose()


#: the key of the marker that replaces arguments over the cap (see Toolset.bound)
CUT_ARGUMENTS = "corral_arguments_not_kept"
_CUT_GLIMPSE_CHARS = 200
#: how deep a call's arguments may nest (parsers and schema checks recurse per level)
MAX_ARGUMENT_DEPTH = DocumentLimits.max_depth


def input_problem(call: ToolCall, max_bytes: int) -> str | None:
    """Why the call's arguments cannot be taken (too large, nested too deep), or ``None``."""
    size = len(call.arguments.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        return (
            f"the arguments are {size} bytes, more than this tool accepts ({max_bytes}, its "
            "max_input_bytes); they were not run and not kept: send less, in smaller calls"
        )
    if json_too_deep_at(call.arguments, MAX_ARGUMENT_DEPTH) is not None:
        return (
            f"the arguments are nested deeper than {MAX_ARGUMENT_DEPTH} levels; they were "
            "not run and not kept"
        )
    return None


# built once: json.dumps with options builds an encoder per call, and every tool result
# that is not text comes through here
_ENCODE = json.JSONEncoder(ensure_ascii=False, default=str).encode


def _as_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    return _ENCODE(result)


def _cap(text: str, max_bytes: int) -> str:
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    kept = data[:max_bytes].decode(errors="ignore")
    return f"{kept}\n[output truncated: {len(data) - max_bytes} of {len(data)} bytes cut]"


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)
