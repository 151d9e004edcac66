"""What one model turn is sent: the agent's settings, as where the run stands changes them.

- A forced ``tool_choice`` (``required``, or a named tool) is sent until the run has called
  a tool; from then on every turn is sent ``auto`` (as the OpenAI Agents SDK's
  ``reset_tool_choice`` does), so the model can answer with what the tool returned: a
  provider that honours a forced choice never answers in text, and the run would call the
  tool until ``max_steps``. ``model_settings.reset_tool_choice: false`` keeps forcing.
- A run with a token or cost limit sends an output cap on every turn (the Agent's
  ``max_output_tokens``, else the provider's own, else
  :data:`~corral.models.base.DEFAULT_OUTPUT_TOKENS`), so a turn's worst case
  (:meth:`~corral.models.base.Model.turn_bound`) is a real bound the budget can check
  before the turn is paid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from corral.core.messages import Message
from corral.models.base import DEFAULT_OUTPUT_TOKENS, Model, ModelSettings


def forces_a_call(settings: ModelSettings) -> bool:
    """Whether ``settings`` make the model call a tool (``required``, or a named tool)."""
    choice = settings.tool_choice
    return choice is not None and choice not in ("auto", "none")


def turn_settings(
    settings: ModelSettings, model: Model, run_messages: Sequence[Message], limited: bool
) -> ModelSettings:
    """The settings of the next turn of a run whose own messages (its input and what came
    after it) are ``run_messages``; ``limited``: the run has a token or cost limit."""
    if (
        settings.reset_tool_choice
        and forces_a_call(settings)
        and any(message.tool_calls for message in run_messages)
    ):
        settings = replace(settings, tool_choice="auto")
    if limited and settings.max_output_tokens is None and model.default_output_tokens is None:
        settings = replace(settings, max_output_tokens=DEFAULT_OUTPUT_TOKENS)
    return settings
