"""What the tests of Corral's A2A server share as an A2A client (the SDK's)."""

from __future__ import annotations

import anyio
from a2a.client.client import Client
from a2a.types.a2a_pb2 import CancelTaskRequest, GetTaskRequest, Task, TaskState


async def cancel_and_wait(client: Client, task_id: str) -> Task:
    """Cancel a task, then wait until it is CANCELED (a running one stops at its worker's
    next heartbeat: the answer comes at once, saying the cancel was requested)."""
    answer = await client.cancel_task(CancelTaskRequest(id=task_id))
    if answer.status.state != TaskState.TASK_STATE_CANCELED:
        assert answer.status.state == TaskState.TASK_STATE_WORKING, answer.status
        assert answer.status.message.parts[0].text == "cancel requested"
    with anyio.fail_after(30):
        while answer.status.state != TaskState.TASK_STATE_CANCELED:
            await anyio.sleep(0.05)
            answer = await client.get_task(GetTaskRequest(id=task_id))
    return answer
