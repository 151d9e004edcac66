"""The benchmark's model: Corral's fake OpenAI-compatible server, in a process of its own.

It answers every conversation as an agent that calls the ``add`` tool ``--calls``
times, one call per turn, then gives its final answer
(:class:`~corral.testing.fake_openai.ToolLoop`), optionally ``--delay`` seconds
late (the scale section keeps 1,000 runs in flight that way). It prints its
``base_url`` and serves until its standard input closes.

It serves the fixture's routes with a uvicorn of its own, set up for load:

- The socket is bound with ``IPPROTO_TCP`` (as the fixture's is) so asyncio sets
  ``TCP_NODELAY`` on its connections; without it every answer (headers, then
  body) waits ~40 ms for the client's delayed ACK, swamping every other figure.
- A backlog of 4,096 (1,000 runs connect at once in the scale section), and
  idle connections kept open (``timeout_keep_alive``), as a hosted API keeps them.
- It keeps no request log (the fixture records each request for tests'
  assertions, which grows without bound here) and counts instead: requests
  served and the most it held at once (``POST /bench/stats`` reads and resets),
  so a child can check that a framework made exactly the model calls it should.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.testing.fake_openai import FakeOpenAIServer, ToolLoop

#: The arguments of every tool call the fake model makes, and what the tool returns for them.
ARGUMENTS = {"a": 17, "b": 25}


class CountingServer(FakeOpenAIServer):
    """A :class:`FakeOpenAIServer` that counts instead of recording."""

    def __init__(self, calls: int) -> None:
        super().__init__(tool_loop=ToolLoop("add", calls, dict(ARGUMENTS)))
        self.served = 0
        self.in_flight = 0
        self.max_in_flight = 0

    def routes(self) -> list[Route]:
        return [*super().routes(), Route("/bench/stats", self.stats, methods=["POST"])]

    async def handle(self, request: Request) -> Response:
        # uvicorn serves from one event loop thread, so plain counters are safe
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await super().handle(request)
        finally:
            self.in_flight -= 1
            self.served += 1
            self.requests.clear()

    async def stats(self, request: Request) -> Response:
        body = {"served": self.served, "max_in_flight": self.max_in_flight}
        self.served = 0
        self.max_in_flight = self.in_flight
        return JSONResponse(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=3, help="tool calls before the answer")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    args = parser.parse_args()
    fake = CountingServer(args.calls)
    if args.delay:
        fake.delay(args.delay, times=None)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        Starlette(routes=fake.routes()),
        log_level="warning",
        lifespan="off",
        access_log=False,
        backlog=4096,
        # uvicorn closes a connection idle for 5 s by default; a client whose pooled
        # connection is closed just as it sends gets a connection error (seen with DBOS at
        # c=50, where steps wait on fsyncs). Real model APIs keep connections far longer.
        timeout_keep_alive=600,
    )
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        threading.Event().wait(0.01)
    print(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
