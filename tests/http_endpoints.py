"""A real HTTP endpoint on 127.0.0.1 for ``http`` tools: it records every request and
answers by path.

/echo (any other path)  200, JSON: the request's headers and JSON body
/status/CODE            CODE, a short text body (429: Retry-After 3; 302: a Location to a
                        metadata address)
/text                   200, plain text
/slow                   200 after the body's ``seconds``, JSON like /echo
/flood                  200, ``size`` bytes of "x" (the body's ``size``) as plain text
/fail                   400, the body's ``reason`` as plain text
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Server:
    port: int
    requests: list[Recorded] = field(default_factory=list)

    def url(self, path: str = "/echo", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


def _handler(server: Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"null")
            server.requests.append(Recorded(self.command, self.path, dict(self.headers), body))
            status, headers, text = 200, {}, "text/plain; charset=utf-8"
            if self.path.startswith("/status/"):
                status = int(self.path.rsplit("/", 1)[1])
                if status == 429:
                    headers["Retry-After"] = "3"
                if status == 302:
                    headers["Location"] = "http://169.254.169.254/latest/meta-data"
                payload, ctype = f"status {status} body".encode(), "text/plain"
            elif self.path == "/text":
                payload, ctype = b"plain answer", text
            elif self.path == "/flood":
                payload, ctype = b"x" * body["size"], text
            elif self.path == "/fail":
                status, payload, ctype = 400, body["reason"].encode(), text
            else:
                if self.path == "/slow":
                    time.sleep(body["seconds"])
                payload = json.dumps({"headers": dict(self.headers), "body": body}).encode()
                ctype = "application/json"
            headers.update({"Content-Type": ctype, "Content-Length": str(len(payload))})
            with contextlib.suppress(ConnectionError):  # the client gave up (timeout, cancel)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)

        do_POST = do_PUT = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def serving() -> Iterator[Server]:
    """The endpoint on a free port, served by a thread (a thread per request) until the end."""
    state = Server(port=0)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    state.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
