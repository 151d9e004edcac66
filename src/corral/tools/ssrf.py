"""The SSRF guard for outbound tool calls.

:func:`check_destination` resolves a URL's host once, refuses it when *any*
resolved address is not a public unicast address (loopback, link-local and
cloud metadata, private, CGNAT, unspecified, multicast, reserved, and the same
hidden inside IPv4-mapped, 6to4, Teredo or NAT64 IPv6 addresses), and returns
a :class:`Destination` pinned to the checked address. The caller connects to
that address, never to the name again, so a DNS answer that changes between
the check and the connection (DNS rebinding) cannot redirect the call.

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

from corral.core.errors import ToolError, ToolErrorCode

__all__ = [
    "Destination",
    "IPAddress",
    "Resolver",
    "blocked_reason",
    "check_destination",
    "system_resolver",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]
"""Resolves ``(host, port)`` to IP address strings; raises ``OSError`` when it cannot."""

_DEFAULT_PORTS = {"http": 80, "https": 443}
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_CGNAT = ipaddress.IPv4Network("100.64.0.0/10")
_METADATA = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}


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


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, 6to4, Teredo client, NAT64)."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def blocked_reason(address: IPAddress) -> str | None:
    """Why ``address`` may not be called without ``allow_private``, or ``None`` when it may."""
    if address in _METADATA:
        return "a cloud metadata address"
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            inner = blocked_reason(embedded)
            if inner is not None:
                return f"{inner} (embedded in {address})"
    checks: list[tuple[bool, str]] = [
        (address.is_unspecified, "unspecified"),
        (address.is_loopback, "loopback"),
        (address.is_link_local, "link-local"),
        (isinstance(address, ipaddress.IPv4Address) and address in _CGNAT, "shared (CGNAT)"),
        (address.is_multicast, "multicast"),
        (address.is_private, "private"),
        (address.is_reserved, "reserved"),
        (not address.is_global, "not globally routable"),
    ]
    for hit, reason in checks:
        if hit:
            return f"a {reason} address"
    return None


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
    url: str | httpx.URL, *, allow_private: bool = False, resolver: Resolver = system_resolver
) -> Destination:
    """Check ``url`` and pin it to one of its addresses; see the module docstring.

    Raises ``ToolError`` with code ``blocked_destination`` for a refused URL
    and ``unavailable`` (retryable) when the host does not resolve.
    ``allow_private`` turns the address check off; the URL is still pinned.
    """
    text = str(url)
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise _blocked(text, f"not a valid URL ({exc})") from exc
    if parsed.scheme not in _DEFAULT_PORTS:
        raise _blocked(text, f"scheme {parsed.scheme!r} is not allowed (only http and https)")
    host = parsed.raw_host.decode("ascii")
    if not host:
        raise _blocked(text, "the URL has no host")
    port = parsed.port or _DEFAULT_PORTS[parsed.scheme]
    try:
        addresses = [str(_parse_address(host))]
    except ValueError:
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
    if not allow_private:
        for address in parsed_addresses:
            reason = blocked_reason(address)
            if reason is not None:
                raise _blocked(text, f"{host} resolves to {address}, {reason}")
    return Destination(parsed, host, str(parsed_addresses[0]))
