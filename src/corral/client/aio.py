"""The asyncio client of the HTTP API: :class:`AsyncClient` (the same methods as
:class:`~corral.client.Client`, awaited)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import TracebackType
from typing import Self, TypeVar

import anyio
import httpx

from corral.api import EventOut
from corral.client import wire
from corral.client.calls import Call, Follow, Pages
from corral.client.methods import AsyncIO, Methods

T = TypeVar("T")


class AsyncClient(Methods[httpx.AsyncBaseTransport], AsyncIO):
    """An asyncio client of a Corral server; the same methods as ``Client``, awaited.

    Its methods, arguments and errors are :class:`~corral.client.methods.Methods`';
    this class is their asyncio I/O.
    """

    def _connect(
        self, options: wire.HttpOptions, transport: httpx.AsyncBaseTransport | None
    ) -> None:
        self._http = httpx.AsyncClient(**options, transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def send(self, call: Call[T]) -> T:
        """Send one call and read its answer (an error answer raises)."""
        try:
            response = await self._http.send(wire.request(self._http, call))
        except httpx.TransportError as exc:
            raise wire.connection_error(self.base_url, exc) from None
        return wire.answer(call, response)

    async def _walk(self, pages: Pages[T]) -> AsyncIterator[T]:
        cursor: str | None = None
        while True:
            page = await self.send(pages.call(cursor))
            for item in page.items:
                yield item
            if (cursor := pages.next_cursor(page)) is None:
                return

    async def _follow(self, follow: Follow) -> AsyncIterator[EventOut]:
        stream = wire.EventStream.of(follow, self.base_url)
        while not stream.ended:
            await anyio.sleep(stream.pause)
            with stream.attempt():
                async with self._http.stream(
                    "GET", stream.path, headers=stream.headers, timeout=stream.timeout
                ) as response:
                    if response.is_error:
                        await response.aread()
                    stream.opened(response)
                    async for line in response.aiter_lines():
                        if (event := stream.feed(line)) is not None:
                            yield event
                        if stream.ended:
                            return
