"""The SSRF guard for outbound tool calls.

:func:`check_destination` checks a URL with the rules of
:mod:`corral.core.addresses` (http or https, a host, no credentials, no blocked
address in any spelling), resolves a name once, refuses it when *any* resolved
address is not a public unicast address, and returns a :class:`Destination`
pinned to the checked address. The caller connects to that address, never to the
name again, so a DNS answer that changes between the check and the connection
(DNS rebinding) cannot redirect the call.

A URL whose tool says ``allow_private`` may reach a blocked address only where the
operator's allow-list (:class:`~corral.core.addresses.PrivateAllowList`,
``CORRAL_ALLOWED_PRIVATE_DESTINATIONS``, read at each call) names the host or the
address: ``allow_private`` alone reaches none of them.

Nothing here opens a connection; resolution goes through a ``Resolver``
(the system resolver in a worker thread by default).
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio.to_thread
import httpx

from corral.core.addresses import (
    ALLOWED_PRIVATE_VARIABLE,
    SCHEMES,
    IPAddress,
    PrivateAllowList,
    blocked_reason,
    literal_address,
    url_problem,
)
from corral.core.errors import ToolError, ToolErrorCode

__all__ = [
    "Destination",
    "IPAddress",
    "Resolver",
    "blocked_reason",
    "check_destination",
    "system_resolver",
]

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""Resolves ``(host, port)`` to IP address strings; raises ``OSError`` when it cannot."""


async def system_resolver(host: str, port: int) -> list[str]:
    """Resolve with ``getaddrinfo`` in a worker thread (abandoned if the call is cancelled)."""
    infos = await anyio.to_thread.run_sync(
        functools.partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM),
        abandon_on_cancel=True,
    )
    addresses: list[str] = []
    for info in infos:
        address = str(info[4][0])
        if address not in addresses:
            addresses.append(address)
    return addresses


@dataclass(frozen=True)
class Destination:
    """A checked destination: connect to ``address``, present ``host`` (Host header and SNI)."""

    url: httpx.URL
    host: str
    address: str

    @property
    def pinned_url(self) -> httpx.URL:
        """The URL with its host replaced by the checked IP address."""
        return self.url.copy_with(host=self.address)

    @property
    def host_header(self) -> str:
        """The ``Host`` header the original URL would have sent."""
        return self.url.netloc.decode("ascii")

    @property
    def sni_hostname(self) -> str | None:
        """The TLS server name (for https to a name, not to a literal address)."""
        if self.url.scheme != "https" or self.host == self.address:
            return None
        return self.host


def _blocked(url: str, reason: str) -> ToolError:
    return ToolError(ToolErrorCode.BLOCKED_DESTINATION, f"{url}: {reason}", details={"url": url})


def _parse_address(text: str) -> IPAddress:
    return ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 zone id


async def check_destination(
    url: str | httpx.URL,
    *,
    allow_private: bool = False,
    resolver: Resolver = system_resolver,
    allowed: PrivateAllowList | None = None,
) -> Destination:
    """Check ``url`` and pin it to one of its addresses; see the module docstring.

    Raises ``ToolError`` with code ``blocked_destination`` for a refused URL
    and ``unavailable`` (retryable) when the host does not resolve.
    ``allow_private`` lets the call reach a private, loopback or metadata address
    only where the operator's allow-list (``allowed``, default
    :meth:`PrivateAllowList.from_env`) names it; the URL is still pinned.
    """
    text = str(url)
    problem = url_problem(text, allow_private=allow_private)
    if problem is not None:
        raise _blocked(text, problem)
    parsed = httpx.URL(text)
    host = parsed.raw_host.decode("ascii")
    port = parsed.port or SCHEMES[parsed.scheme]
    literal = literal_address(host)  # checked by url_problem: it raises no more
    if literal is not None:
        addresses = [str(literal)]
    else:
        try:
            addresses = await resolver(host, port)
        except OSError as exc:
            raise ToolError(
                ToolErrorCode.UNAVAILABLE,
                f"{text}: cannot resolve {host!r} ({exc})",
                retryable=True,
                details={"url": text},
            ) from exc
    if not addresses:
        raise ToolError(
            ToolErrorCode.UNAVAILABLE, f"{text}: {host!r} has no address", retryable=True
        )
    parsed_addresses = [_parse_address(a) for a in addresses]
    listed = _allow_list(text, allowed) if allow_private else None
    for address in parsed_addresses:
        reason = blocked_reason(address)
        if reason is None or (listed is not None and listed.allows(host, address)):
            continue
        if listed is None:
            raise _blocked(text, f"{host} resolves to {address}, {reason}")
        raise _blocked(
            text,
            f"{host} resolves to {address}, {reason}, which the operator's allow-list of "
            f"private destinations does not name ({ALLOWED_PRIVATE_VARIABLE}="
            f"{listed.describe()}); allow_private alone reaches none",
        )
    return Destination(parsed, host, str(parsed_addresses[0]))


def _allow_list(url: str, allowed: PrivateAllowList | None) -> PrivateAllowList:
    if allowed is not None:
        return allowed
    try:
        return PrivateAllowList.from_env()
    except ValueError as exc:  # the operator's setting is malformed: nothing is allowed
        raise _blocked(url, str(exc)) from None
