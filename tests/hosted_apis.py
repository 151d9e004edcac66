"""No test reaches a hosted model API: their host names do not resolve in the test process.

Every TCP connection by name starts with ``socket.getaddrinfo`` - httpx (sync
through ``socket.create_connection``, async through the event loop's resolver
thread), the openai and anthropic SDKs (httpx underneath), urllib, asyncpg, the
NATS client - so :func:`refusing_getaddrinfo` in its place (the autouse fixture
of ``conftest.py``) refuses the hosts of :data:`HOSTED_MODEL_APIS` with
:class:`HostedModelApiRefused`, which names the host, and passes every other
name (localhost fake servers, PostgreSQL, NATS) to the real resolver.
Subprocesses resolve on their own: the tests give them fake servers' URLs.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from typing import Any

#: host name patterns (fnmatch, lower case) of the hosted model APIs no test may call
HOSTED_MODEL_APIS = (
    "api.openai.com",
    "*.openai.azure.com",
    "*.cognitiveservices.azure.com",
    "api.anthropic.com",
    "generativelanguage.googleapis.com",
    "*-aiplatform.googleapis.com",
    "bedrock-runtime.*.amazonaws.com",
    "api.mistral.ai",
    "api.groq.com",
    "api.together.xyz",
    "openrouter.ai",
    "api.deepseek.com",
    "api.cohere.com",
    "api.fireworks.ai",
    "api.x.ai",
)


class HostedModelApiRefused(RuntimeError):
    """A test tried to connect to a hosted model API (not an ``OSError``: nothing retries it)."""

    def __init__(self, host: str) -> None:
        super().__init__(
            f"a test tried to connect to {host}, a hosted model API: tests use the fake "
            "servers of corral.testing (tests/hosted_apis.py refuses these hosts)"
        )
        self.host = host


def hosted_model_api(host: object) -> str | None:
    """``host`` as a lower-case name when it is a hosted model API's, else ``None``."""
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return None
    name = host.lower().rstrip(".")
    return name if any(fnmatch.fnmatchcase(name, p) for p in HOSTED_MODEL_APIS) else None


def refusing_getaddrinfo(resolve: Callable[..., Any]) -> Callable[..., Any]:
    """``socket.getaddrinfo`` (``resolve``) that raises for the hosted model APIs' hosts."""

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        refused = hosted_model_api(host)
        if refused is not None:
            raise HostedModelApiRefused(refused)
        return resolve(host, *args, **kwargs)

    return getaddrinfo
