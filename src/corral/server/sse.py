"""A run's events as Server-Sent Events.

Each event goes out as::

    id: 7
    event: tool.call
    data: {"run_id": "run_...", "seq": 7, "type": "tool.call", "ts": ..., "data": {...}}

The ``id`` is the event's sequence number, so a client that reconnects with
``Last-Event-ID: 7`` (browsers do it by themselves) gets exactly the events
after 7: none missed, none twice. The first message also carries ``retry:``
(how long a client waits before it reconnects): a block of its own, with no
data, is an event with empty data to some parsers (the ``openai`` SDK's then
fails decoding it as JSON). A comment line (``: keep-alive``) goes out when
nothing else did for a while, so proxies keep the connection open; it is not
followed by a blank line, for the same reason (a blank line ends a message,
and after an ``id`` those parsers dispatch even a message without fields). The
stream ends with an ``end`` event (``data: {"state": ...}``) once the run has
finished; a run waiting for approval keeps its stream open. When the server
shuts down, open streams end without ``end``: the client reconnects (to
another server) with its ``Last-Event-ID``.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator

from corral.api import EventOut
from corral.core.events import Event, RunFinishData
from corral.runtime.follow import RunFollower, Until
from corral.server.context import ServerContext

MEDIA_TYPE = "text/event-stream"
#: how long a reconnecting EventSource waits before it tries again (``retry:``, ms)
RETRY_MS = 1000


def format_event(event: Event) -> str:
    """One event in the wire format."""
    payload = EventOut.from_event(event).model_dump_json()
    return f"id: {event.seq}\nevent: {event.type.value}\ndata: {payload}\n\n"


class _Formatted:
    """The wire text of recent events: the followers of a run send the same events, and
    one serialization serves them all (the store reads are shared the same way)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._texts: OrderedDict[tuple[str, int], str] = OrderedDict()

    def __call__(self, event: Event) -> str:
        key = (event.run_id, event.seq)
        text = self._texts.get(key)
        if text is None:
            text = self._texts[key] = format_event(event)
            if len(self._texts) > self.size:
                self._texts.popitem(last=False)
        return text


_formatted = _Formatted()


async def event_stream(context: ServerContext, run_id: str, after: int) -> AsyncIterator[str]:
    """The SSE body for ``run_id`` from the event after ``after`` until the run ends."""
    follower = RunFollower(
        context.store,
        context.bus,
        run_id,
        after=after,
        until=Until.FINISHED,
        poll_seconds=min(context.poll_seconds, context.keepalive_seconds),
        stop=context.followers_stop,
        fan_out=context.fan_out,
    )
    context.metrics.event_streams.inc()
    try:
        first = f"retry: {RETRY_MS}\n"  # goes out with the first message (see above)
        last_sent = time.monotonic()
        final: str | None = None
        async for batch in follower.batches():
            if batch:
                yield first + "".join(_formatted(event) for event in batch)
                first = ""
                last_sent = time.monotonic()
                final = next(
                    (e.data.state for e in batch if isinstance(e.data, RunFinishData)), final
                )
            elif time.monotonic() - last_sent >= context.keepalive_seconds:
                yield ": keep-alive\n"
                last_sent = time.monotonic()
        if follower.ended:
            if final is None and follower.record is not None:
                final = follower.record.state.value
            # state null: the run was deleted while followed
            yield f"{first}event: end\ndata: {json.dumps({'state': final})}\n\n"
    finally:
        context.metrics.event_streams.dec()
