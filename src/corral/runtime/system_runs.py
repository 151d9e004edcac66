"""What both front doors do with agent systems, once: submit a system run, list its messages.

The coordinator that executes a system run is :mod:`corral.runtime.systems`; a
system run is a task like any other for everything else (get, cancel, events,
children: :mod:`corral.runtime.operations`).
"""

from __future__ import annotations

from collections.abc import Mapping

from corral.bus.base import Bus
from corral.core.agent_messages import AgentMessage
from corral.core.errors import ConflictError, NotFoundError
from corral.core.runs import RunRecord
from corral.resources.systems import AgentSystemSpec
from corral.runtime.operations import get_run
from corral.runtime.system_messages import KIND, system_run_record
from corral.store.base import Store


async def submit_system(
    store: Store,
    system: str,
    user_input: str,
    *,
    namespace: str = "default",
    idempotency_key: str | None = None,
    labels: Mapping[str, str] | None = None,
    bus: Bus | None = None,
) -> tuple[RunRecord, bool]:
    """Queue a run of the AgentSystem ``system``; returns ``(run, created)`` (``False``:
    the idempotency key was seen before). ``NotFoundError`` (nothing stored) when the
    namespace has no such AgentSystem; ``LabelError`` for bad labels; ``ConflictError``
    when the idempotency key is a task's of the Agent of the same name. A new run is
    announced on ``bus``."""
    stored = await store.get_resource(namespace, KIND, system)
    if stored is None or not isinstance(stored.resource.spec, AgentSystemSpec):
        raise NotFoundError(f"AgentSystem {system!r} not found in namespace {namespace!r}")
    record = system_run_record(
        system, user_input, namespace=namespace, idempotency_key=idempotency_key, labels=labels
    )
    # (its node runs' caps come from it: set before its first pass, whose node runs an
    # inbox consumer may create before that pass is saved)
    record.max_cost_usd = stored.resource.spec.limits.max_cost_usd
    record, created = await store.submit_run(record)
    if record.system != system or record.parent_run_id is not None:
        # the key is one of a task of the Agent of the same name (runs share the column)
        raise ConflictError(
            f"idempotency key {idempotency_key!r} belongs to task {record.id}, which is not "
            f"a run of AgentSystem {system!r}"
        )
    if created and bus is not None:
        await bus.announce_runnable([record.id], mark="submitted")
    return record, created


async def messages(
    store: Store,
    run_id: str,
    *,
    namespace: str | None = None,
    limit: int | None = None,
    after: tuple[float, str] | None = None,
) -> list[AgentMessage]:
    """The agent messages of a system run, oldest first (a page of them: at most ``limit``,
    after the keyset ``after`` = ``(created_at, id)``); none for a run of one agent.
    ``NotFoundError`` as :func:`~corral.runtime.operations.get_run`."""
    await get_run(store, run_id, namespace=namespace)
    return await store.list_agent_messages(run_id, limit=limit, after=after)
