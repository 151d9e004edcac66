"""Capped exponential backoff with full jitter, the one formula every retry uses.

Full jitter (a uniform wait between 0 and the capped exponential ceiling) keeps
clients that failed together from retrying together. Used by run retries and
lease renewals (:mod:`corral.runtime`), a worker's failing store operations
(:mod:`corral.runtime.health`), model retries (:mod:`corral.models.gateway`),
tool retries (:mod:`corral.tools.governance`) and the reopening of lost MCP
sessions (:mod:`corral.tools.mcp`).
"""

from __future__ import annotations

import random

__all__ = ["jittered_backoff"]


def jittered_backoff(attempt: int, base: float, cap: float) -> float:
    """Seconds to wait after ``attempt`` failures: uniform in
    ``[0, min(cap, base * 2^(attempt-1))]`` (the first failure waits up to ``base``)."""
    ceiling = base * 2 ** min(max(attempt - 1, 0), 62)
    return random.uniform(0, min(cap, ceiling))
