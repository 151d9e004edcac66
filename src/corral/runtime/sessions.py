"""Session history for a run, compacted when it grows past the agent's policy."""

from __future__ import annotations

import logging

from corral.core.errors import NotFoundError
from corral.core.messages import Message
from corral.core.runs import RunRecord
from corral.core.sessions import SessionMessage
from corral.engine.loop import AgentDefinition
from corral.models.base import ModelSettings
from corral.store.base import Store

log = logging.getLogger(__name__)

SUMMARY_PREFIX = "[Summary of the earlier conversation]"
_SUMMARIZE = (
    "Summarize the conversation below for your own later use. Keep every fact, name, "
    "number, decision and open question a later answer may need; drop pleasantries. "
    "Reply with the summary only."
)


def estimate_tokens(messages: list[Message]) -> int:
    """A cheap, provider-neutral estimate: about four characters a token."""
    return (
        sum(
            len(m.content) + sum(len(c.arguments) + len(c.name) for c in m.tool_calls) + 16
            for m in messages
        )
        // 4
    )


async def session_history(
    store: Store, namespace: str, session_id: str, agent: AgentDefinition
) -> list[Message]:
    """The messages to send before a new input, compacting the session first if needed."""
    stored = await store.session_messages(namespace, session_id)
    messages = [m.message for m in stored]
    policy = agent.session_policy
    if estimate_tokens(messages) <= policy.max_history_tokens:
        return messages
    cut = _cut_index(stored, policy.keep_recent_messages)
    if cut <= 0:
        return messages
    old = stored[:cut]
    summary: Message | None = None
    if policy.compaction == "summarize":
        summary = await _summarize(agent, [m.message for m in old])
    await store.compact_session(namespace, session_id, old[-1].seq, summary)
    log.info("session %s: compacted %d messages (%s)", session_id, cut, policy.compaction)
    return [m.message for m in await store.session_messages(namespace, session_id)]


async def missing_session(store: Store, record: RunRecord) -> NotFoundError | None:
    """The error of a run whose session is gone, or ``None`` (also for a run without one).

    The store refuses to delete a session while a run of it is unfinished; a store
    changed by other means, or runs queued before that rule, can still lack it.
    """
    if record.session_id is None:
        return None
    if await store.get_session(record.namespace, record.session_id) is not None:
        return None
    return NotFoundError(
        f"session {record.session_id!r} of namespace {record.namespace!r} no longer exists; "
        "the run cannot continue its conversation"
    )


def _cut_index(stored: list[SessionMessage], keep_recent: int) -> int:
    """Where the kept tail begins: at a user message, so no tool result loses its call."""
    cut = max(0, len(stored) - keep_recent)
    while 0 < cut < len(stored) and stored[cut].message.role != "user":
        cut -= 1
    return cut


async def _summarize(agent: AgentDefinition, messages: list[Message]) -> Message:
    transcript = "\n".join(
        f"{m.role}: {m.content}"
        + "".join(f" [called {c.name}({c.arguments})]" for c in m.tool_calls)
        for m in messages
    )
    request = [Message.system(_SUMMARIZE), Message.user(transcript)]
    response = await agent.model.request(request, [], ModelSettings(temperature=0))
    summary = agent.toolset.redactor.text(response.message.content.strip())
    return Message.user(f"{SUMMARY_PREFIX}\n{summary}")
