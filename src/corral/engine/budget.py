"""Run limits: steps, tokens and cost are counted here; time is a cancel scope in the loop."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from corral.core.errors import BudgetExceededError
from corral.core.messages import ModelResponse, Usage
from corral.core.runs import RunRecord
from corral.models.base import TurnBound
from corral.resources.kinds import Limits


def capped(limits: Limits, max_cost_usd: float | None, max_tokens: int | None = None) -> Limits:
    """``limits`` under a run's own caps (what its parent or system run had left when it
    was created): the lower of the two ``max_cost_usd``, and of the two ``max_tokens``."""
    update: dict[str, float | int] = {}
    if max_cost_usd is not None:
        own = limits.max_cost_usd
        update["max_cost_usd"] = max_cost_usd if own is None else min(own, max_cost_usd)
    if max_tokens is not None:
        own_tokens = limits.max_tokens
        update["max_tokens"] = max_tokens if own_tokens is None else min(own_tokens, max_tokens)
    return limits.model_copy(update=update) if update else limits


def held_by(running: Sequence[RunRecord], ended: Sequence[RunRecord]) -> tuple[float, int]:
    """What child runs not yet charged to their parent hold of its budget, as ``(cost,
    tokens)``: those ``running``, their caps (each may spend all of it before it is
    charged); those ``ended``, what they spent."""
    return (
        sum(child.max_cost_usd or 0.0 for child in running)
        + sum(child.cost_usd for child in ended),
        sum(child.max_tokens or 0 for child in running)
        + sum(child.usage.total_tokens for child in ended),
    )


def inherited_limits(
    limits: Limits, max_cost_usd: float | None, max_tokens: int | None = None
) -> frozenset[str]:
    """Which of ``max_cost_usd`` and ``max_tokens`` the run's own caps set in
    :func:`capped` (they are at most its agent's): a run stopped by one of those was
    stopped by what its parent or system run had left."""
    inherited = set()
    own_cost, own_tokens = limits.max_cost_usd, limits.max_tokens
    if max_cost_usd is not None and (own_cost is None or max_cost_usd <= own_cost):
        inherited.add("max_cost_usd")
    if max_tokens is not None and (own_tokens is None or max_tokens <= own_tokens):
        inherited.add("max_tokens")
    return frozenset(inherited)


@dataclass
class Budget:
    """What a run has spent so far, checked against its limits; ``inherited``: the limits
    the run's own caps set (:func:`inherited_limits`), said in the error they raise."""

    limits: Limits
    steps: int = 0
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    inherited: frozenset[str] = frozenset()

    def start_step(self) -> int:
        if self.steps >= self.limits.max_steps:
            raise BudgetExceededError(
                "max_steps",
                f"the run reached its limit of {self.limits.max_steps} steps without a final answer",
            )
        self.steps += 1
        return self.steps

    def charge(self, response: ModelResponse) -> None:
        """Count a model turn; raises when a token or cost limit is passed."""
        self.spend(response.usage, response.cost_usd)

    def spend(self, usage: Usage, cost_usd: float) -> None:
        """Count tokens and cost (a model turn's, or a child run's whole spend); raises when
        a token or cost limit is passed."""
        self.usage = self.usage + usage
        self.cost_usd += cost_usd
        max_tokens = self.limits.max_tokens
        if max_tokens is not None and self.usage.total_tokens > max_tokens:
            raise self._exceeded(
                "max_tokens",
                f"the run used {self.usage.total_tokens} tokens, over its limit of {max_tokens}",
            )
        max_cost = self.limits.max_cost_usd
        if max_cost is not None and self.cost_usd > max_cost:
            raise self._exceeded(
                "max_cost_usd",
                f"the run cost ${self.cost_usd:.6f}, over its limit of ${max_cost:.6f}",
            )

    def left(
        self, held_cost: float = 0.0, held_tokens: int = 0, ways: int = 1
    ) -> tuple[float | None, int | None]:
        """What the run has left of its ``max_cost_usd`` and ``max_tokens`` (``None``: no
        limit), less what others hold of it (children still running: their caps), split
        evenly ``ways`` ways; never below 0."""
        max_cost, max_tokens = self.limits.max_cost_usd, self.limits.max_tokens
        cost = tokens = None
        if max_cost is not None:
            cost = max(max_cost - self.cost_usd - held_cost, 0.0) / ways
        if max_tokens is not None:
            tokens = max(max_tokens - self.usage.total_tokens - held_tokens, 0) // ways
        return cost, tokens

    @property
    def limited(self) -> bool:
        """Whether the run has a token or cost limit (what a model turn is checked against)."""
        return self.limits.max_tokens is not None or self.limits.max_cost_usd is not None

    def afford(self, bound: TurnBound, held_cost: float = 0.0, held_tokens: int = 0) -> None:
        """Check, before a model turn is paid, that its worst case (``bound``) fits in what
        the run has left less what others hold of it (see :meth:`left`); raises
        ``BudgetExceededError`` when it does not."""
        cost_left, tokens_left = self.left(held_cost, held_tokens)
        if tokens_left is not None and bound.total_tokens > tokens_left:
            raise self._exceeded(
                "max_tokens",
                f"the next model turn may use {bound.total_tokens} tokens ({bound.input_tokens} "
                f"input, up to {bound.output_tokens} output), more than the {tokens_left} left "
                f"of the run's limit of {self.limits.max_tokens} (a lower "
                "model_settings.max_output_tokens lowers what a turn may use)",
            )
        if cost_left is not None and bound.cost_usd > cost_left:
            raise self._exceeded(
                "max_cost_usd",
                f"the next model turn may cost ${bound.cost_usd:.6f} ({bound.input_tokens} "
                f"input, up to {bound.output_tokens} output tokens), more than the "
                f"${cost_left:.6f} left of the run's limit of ${self.limits.max_cost_usd:.6f} "
                "(a lower model_settings.max_output_tokens lowers what a turn may cost)",
            )

    def _exceeded(self, limit: str, message: str) -> BudgetExceededError:
        return BudgetExceededError(limit, message, inherited=limit in self.inherited)

    def timed_out(self) -> BudgetExceededError:
        return BudgetExceededError(
            "timeout", f"the run passed its time limit of {self.limits.timeout_seconds:g}s"
        )
