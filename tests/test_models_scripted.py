"""The ``scripted`` provider's turns: what a turn may say, and its simulated latency."""

from __future__ import annotations

import time

import anyio
import pytest
from pydantic import ValidationError

from corral.core.messages import Message
from corral.models.base import ModelSettings
from corral.models.scripted import ScriptedModel
from corral.resources.kinds import ScriptedTurn


async def test_a_turn_with_latency_answers_after_it_and_others_meanwhile() -> None:
    model = ScriptedModel([ScriptedTurn(text="slow", latency_seconds=0.3)])
    quick = ScriptedModel([ScriptedTurn(text="quick")])
    answers: list[str] = []

    async def ask(which: ScriptedModel) -> None:
        response = await which.request([Message.user("hi")], [], ModelSettings())
        answers.append(response.message.content or "")

    started = time.monotonic()
    async with anyio.create_task_group() as group:
        group.start_soon(ask, model)
        await anyio.sleep(0.05)
        group.start_soon(ask, quick)
    assert answers == ["quick", "slow"]  # the slow turn held no one else up
    assert time.monotonic() - started >= 0.3


@pytest.mark.parametrize("latency", [-1, 60.5, float("nan"), "soon"])
def test_a_latency_out_of_range_is_refused(latency: object) -> None:
    with pytest.raises(ValidationError, match="latency_seconds"):
        ScriptedTurn.model_validate({"text": "x", "latency_seconds": latency})
