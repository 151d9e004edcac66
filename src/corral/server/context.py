"""What every route of the server shares: the store, the bus, settings, and the server's own parts.

A route reaches it with :func:`context_of`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio
from fastapi import Request

from corral.bus.base import Bus
from corral.core.settings import Settings
from corral.runtime.agent_tokens import AgentTokenSigner
from corral.runtime.fanout import FanOut
from corral.runtime.follow import Stop
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

    def begin_shutdown(self) -> None:
        """Shutdown begins: streams and prompt waits end, the worker drains, readiness fails."""
        self.stopping.set()
        self.followers_stop.set()


def context_of(request: Request) -> ServerContext:
    """The server's shared state (store, bus, settings, ...)."""
    context: ServerContext = request.app.state.corral
    return context
