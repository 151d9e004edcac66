"""The blocking client of the HTTP API: :class:`Client`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import TracebackType
from typing import Self, TypeVar

import httpx

from corral.api import EventOut
from corral.client import wire
from corral.client.calls import Call, Follow, Pages
from corral.client.methods import Methods, SyncIO

T = TypeVar("T")


class Client(Methods[httpx.BaseTransport], SyncIO):
    """A blocking client of a Corral server.

    Its methods, arguments and errors are :class:`~corral.client.methods.Methods`';
    this class is their blocking I/O.
    """

    def _connect(self, options: wire.HttpOptions, transport: httpx.BaseTransport | None) -> None:
        self._http = httpx.Client(**options, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def send(self, call: Call[T]) -> T:
        """Send one call and read its answer (an error answer raises)."""
        try:
            response = self._http.send(wire.request(self._http, call))
        except httpx.TransportError as exc:
            raise wire.connection_error(self.base_url, exc) from None
        return wire.answer(call, response)

    def _walk(self, pages: Pages[T]) -> Iterator[T]:
        cursor: str | None = None
        while True:
            page = self.send(pages.call(cursor))
            yield from page.items
            if (cursor := pages.next_cursor(page)) is None:
                return

    def _follow(self, follow: Follow) -> Iterator[EventOut]:
        stream = wire.EventStream.of(follow, self.base_url)
        while not stream.ended:
            time.sleep(stream.pause)
            with (
                stream.attempt(),
                self._http.stream(
                    "GET", stream.path, headers=stream.headers, timeout=stream.timeout
                ) as response,
            ):
                if response.is_error:
                    response.read()
                stream.opened(response)
                for line in response.iter_lines():
                    if (event := stream.feed(line)) is not None:
                        yield event
                    if stream.ended:
                        return
