"""A real ``corral serve`` for the server tests: uvicorn on a random port, in a thread.

:class:`LiveServer` runs :func:`corral.server.serve.serve` (the code ``corral serve``
runs: store, first admin token, app, embedded worker, uvicorn) in a thread of the
test process, over a temporary ``CORRAL_HOME``, and the tests talk to it over real
HTTP. Agents use the ``scripted`` provider and the ``slow_echo`` tool of
:mod:`server_tools`, so a run can be made to stay in flight for as long as a test needs.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

from corral.core.limits import DocumentLimits
from corral.core.settings import Settings
from corral.core.tokens import Role, mint_token
from corral.server.serve import ADMIN_TOKEN_FILE, CorralServer, serve
from corral.store import Store

T = TypeVar("T")
TESTS = Path(__file__).parent


class LiveServer:
    """``corral serve`` in a thread; ``url``, ``admin`` (the first admin token), ``client()``."""

    def __init__(
        self,
        home: Path,
        *,
        workers: int = 4,
        rate_limit: float = 0.0,
        rate_burst: int = 100,
        auth_failure_rate: float = 0.0,
        auth_failure_burst: int = 20,
        max_body_bytes: int = 1024 * 1024,
        poll_seconds: float = 0.5,
        keepalive_seconds: float = 15.0,
        open_store_with: Callable[[Settings], Awaitable[Store]] | None = None,
        max_prompt_seconds: float | None = None,
        document_limits: DocumentLimits | None = None,
        public_url: str | None = None,
    ) -> None:
        self.home = home
        self.max_prompt_seconds = max_prompt_seconds
        self.open_store_with = open_store_with
        self.settings = Settings(
            home=home,
            db_url=f"sqlite:///{home / 'corral.db'}",
            secret_key=None,
            api_rate_limit=rate_limit,
            api_rate_burst=rate_burst,
            api_auth_failure_rate=auth_failure_rate,
            api_auth_failure_burst=auth_failure_burst,
            api_max_body_bytes=max_body_bytes,
            document_limits=document_limits or DocumentLimits(),
            public_url=public_url,
        )
        self.workers = workers
        self.poll_seconds = poll_seconds
        self.keepalive_seconds = keepalive_seconds
        self.server: CorralServer | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="corral-serve", daemon=True)

    def _main(self) -> None:
        def got(server: CorralServer) -> None:
            self.server = server
            self.loop = asyncio.get_running_loop()
            if self.max_prompt_seconds is not None:
                server.context.max_prompt_timeout_seconds = self.max_prompt_seconds

        try:
            asyncio.run(
                serve(
                    self.settings,
                    host="127.0.0.1",
                    port=0,
                    workers=self.workers,
                    worker_options={
                        "poll_seconds": 0.05,
                        "grace_seconds": 5.0,
                        "lease_seconds": 3.0,
                    },
                    poll_seconds=self.poll_seconds,
                    keepalive_seconds=self.keepalive_seconds,
                    graceful_seconds=10,
                    log_level="warning",
                    on_server=got,
                    open_store_with=self.open_store_with,
                )
            )
        except BaseException as exc:
            self.error = exc

    def start(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while self.server is None or not self.server.started:
            assert self.error is None, f"the server failed to start: {self.error!r}"
            assert time.monotonic() < deadline, "the server did not start in 30 s"
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
        self._thread.join(30)
        assert not self._thread.is_alive(), "the server did not stop in 30 s"

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self.server is not None and self.server.port is not None
        return f"http://127.0.0.1:{self.server.port}"

    @property
    def admin(self) -> str:
        """The admin token of namespace ``default`` the first start wrote."""
        return (self.home / ADMIN_TOKEN_FILE).read_text().strip()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the server's event loop (where its store lives)."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def mint(self, namespace: str, role: Role | str) -> str:
        """A new token, made straight in the store (as ``corral token create`` does)."""
        assert self.server is not None
        token, plain = mint_token(namespace, Role(role), name=f"test {role}")
        self.call(self.server.context.store.create_token(token))
        return plain

    def client(self, token: str | None = None, **options: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **options)

    def async_client(self, token: str | None = None, **options: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=30, **options)


# --------------------------------------------------------------------------- resources


def resources(
    agent: str,
    turns: list[str],
    *,
    approval: str = "never",
    extra: str = "",
) -> str:
    """YAML of a scripted model, the ``echo`` tool and an agent using both."""
    script = "\n".join(f"    - {turn}" for turn in turns)
    return f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: {agent}-model}}
spec:
  provider: scripted
  script:
{script}
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: echo}}
spec:
  type: python
  python: {{function: "server_tools:slow_echo", path: "{TESTS}"}}
  timeout_seconds: 60
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: {agent}}}
spec:
  model: {agent}-model
  tools: [echo]
  approval: {{policy: {approval}}}
{extra}"""


def echo_turn(text: str, seconds: float = 0.0) -> str:
    """A scripted model turn that calls ``echo``."""
    arguments = json.dumps({"text": text, "seconds": seconds})
    return f"{{tool_calls: [{{name: echo, arguments: {arguments}}}]}}"


def apply(client: httpx.Client, yaml_text: str) -> None:
    response = client.post(
        "/v1/resources", content=yaml_text, headers={"Content-Type": "application/yaml"}
    )
    assert response.status_code == 200, response.text


# --------------------------------------------------------------------------- SSE


def sse_messages(lines: Iterator[str]) -> Iterator[dict[str, str]]:
    """The messages of an event stream (``id``, ``event``, ``data``), comments skipped."""
    message: dict[str, str] = {}
    for line in lines:
        if not line:
            if message:
                yield message
            message = {}
            continue
        if line.startswith(":"):
            message.setdefault("comment", line[1:].strip())
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        message[name] = message[name] + "\n" + value if name in message else value
    if message:
        yield message


def wait_for(predicate: Any, timeout: float = 20.0, message: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {message}"
        time.sleep(0.02)
