"""What every route of the server shares: the store, the bus, settings, and the server's own parts.

A route reaches it with :func:`context_of`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio
from fastapi import Request

from corral.bus.base import Bus
from corral.core.runs import RunRecord
from corral.core.settings import Settings
from corral.runtime.agent_tokens import AgentTokenSigner
from corral.runtime.fanout import FanOut
from corral.runtime.follow import RunFollower, Stop, Until
from corral.runtime.health import WorkerHealth
from corral.server.limits import RateLimiter
from corral.server.metrics import Metrics
from corral.server.verifier import TokenVerifier
from corral.store.base import Store


@dataclass
class ServerContext:
    """The server's shared state, at ``app.state.corral``.

    :meth:`begin_shutdown` is called when the server begins to shut down: event
    streams end and prompt requests stop waiting, so the connections close and the
    process can drain; the worker (on ``stopping``) stops claiming and drains.
    """

    store: Store
    bus: Bus
    settings: Settings
    verifier: TokenVerifier
    #: requests per token
    limiter: RateLimiter
    #: failed authentications per client address
    auth_failures: RateLimiter
    metrics: Metrics
    fan_out: FanOut
    #: verifies the agent tokens of /v1/links (and mints those of the embedded worker)
    agent_tokens: AgentTokenSigner
    #: the URL tool programs reach this server at (``CORRAL_URL``): ``CORRAL_PUBLIC_URL``,
    #: else set once the server listens
    public_url: str | None = None
    #: how long a follower waits for a bus announcement before it reads the store anyway
    poll_seconds: float = 1.0
    #: an SSE stream with nothing to send sends a comment this often
    keepalive_seconds: float = 15.0
    #: the longest a prompt request may wait for its answer
    max_prompt_timeout_seconds: float = 600.0
    #: made in the app's lifespan: an anyio event needs the running event loop
    stopping: anyio.Event = field(init=False)
    #: ends the waits of event streams and prompt requests when shutdown begins
    followers_stop: Stop = field(default_factory=Stop)
    #: the embedded worker's health (readiness fails while it cannot claim); None without one
    worker_health: WorkerHealth | None = None

    async def settle(self, run_id: str, seconds: float, request: Request) -> RunRecord | None:
        """The run once it settles (or ``seconds`` pass, shutdown begins, or the client of
        ``request`` goes away: nobody waits for the answer then), as last read."""
        follower = RunFollower(
            self.store,
            self.bus,
            run_id,
            until=Until.SETTLED,
            poll_seconds=self.poll_seconds,
            stop=self.followers_stop,
            fan_out=self.fan_out,
        )
        async with anyio.create_task_group() as group:
            group.start_soon(_cancel_when_gone, request, group.cancel_scope)
            with anyio.move_on_after(seconds):
                await follower.settle()
            group.cancel_scope.cancel()
        if follower.ended and follower.record is not None:
            return follower.record
        return await self.store.get_run(run_id)

    def begin_shutdown(self) -> None:
        """Shutdown begins: streams and prompt waits end, the worker drains, readiness fails."""
        self.stopping.set()
        self.followers_stop.set()


async def _cancel_when_gone(request: Request, scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` when the client disconnects (the request's body was read: the
    next ASGI message is the disconnect)."""
    while True:
        if (await request.receive())["type"] == "http.disconnect":
            scope.cancel()
            return
        await anyio.sleep(0.5)  # (a server that sent more than the body: looked at again)


def context_of(request: Request) -> ServerContext:
    """The server's shared state (store, bus, settings, ...)."""
    context: ServerContext = request.app.state.corral
    return context
