"""Which destinations of outbound calls are refused, decided without any I/O.

Shared by the check of an ``http`` Tool's ``url`` when it is applied
(:mod:`corral.resources.kinds`) and by the SSRF guard that checks every call
again after resolving the host (:mod:`corral.tools.ssrf`):

- :func:`blocked_reason` classifies an IP address: loopback, link-local and
  cloud metadata, private, CGNAT, unspecified, multicast, reserved, and the same
  hidden inside IPv4-mapped, 6to4, Teredo or NAT64 IPv6 addresses.
- :func:`literal_address` reads a host that *is* an address, in every spelling a
  resolver accepts as one: ``127.0.0.1`` and ``[::1]``, but also ``2130706433``,
  ``0x7f.1`` and ``127.1`` (the numbers-and-dots forms of ``inet_aton`` and of the
  WHATWG URL standard), which would otherwise look like names.
- :func:`url_problem` checks a whole URL: http or https, a well-formed host, no
  credentials, and (unless private destinations are allowed) no blocked literal
  address and no ``localhost`` name.
- :class:`PrivateAllowList` is the operator's list of the private destinations a
  tool with ``allow_private`` may reach (``CORRAL_ALLOWED_PRIVATE_DESTINATIONS``):
  a tool's ``allow_private`` alone reaches none.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

import httpx


def _network(entry: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """The address or network ``entry`` names (``[::1]`` too), ``None`` when it names none."""
    try:
        return ipaddress.ip_network(entry.strip("[]"), strict=False)
    except ValueError:
        return None


__all__ = [
    "ALLOWED_PRIVATE_VARIABLE",
    "SCHEMES",
    "IPAddress",
    "PrivateAllowList",
    "blocked_reason",
    "literal_address",
    "url_problem",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: the schemes outbound calls may use, with their default ports
SCHEMES = {"http": 80, "https": 443}

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_CGNAT = ipaddress.IPv4Network("100.64.0.0/10")
_METADATA = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
_HOST_NAME = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?")
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]*|[0-9]+")
#: the operator's allow-list of private destinations (comma separated)
ALLOWED_PRIVATE_VARIABLE = "CORRAL_ALLOWED_PRIVATE_DESTINATIONS"


@dataclass(frozen=True)
class PrivateAllowList:
    """The private destinations a tool with ``allow_private`` may reach, as the operator
    names them: IP addresses, networks (``10.0.0.0/8``, ``::1/128``) and host names
    (``db.internal``: whatever it resolves to). Empty: ``allow_private`` reaches nothing
    that the SSRF guard would block."""

    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    hosts: frozenset[str] = frozenset()

    @staticmethod
    def parse(text: str) -> PrivateAllowList:
        """Read the comma separated entries of :data:`ALLOWED_PRIVATE_VARIABLE`.

        Raises ``ValueError`` naming an entry that is neither an address, a network
        nor a host name.
        """
        networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        hosts: set[str] = set()
        for raw in text.split(","):
            entry = raw.strip()
            if not entry:
                continue
            network = _network(entry)
            if network is not None:
                networks.append(network)
                continue
            if not _HOST_NAME.fullmatch(entry) or _NUMBER.fullmatch(entry.split(".")[-1]):
                raise ValueError(
                    f"{ALLOWED_PRIVATE_VARIABLE}: {entry!r} is not an address, a network "
                    "or a host name"
                )
            hosts.add(entry.lower().removesuffix("."))
        return PrivateAllowList(tuple(networks), frozenset(hosts))

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> PrivateAllowList:
        env = os.environ if environ is None else environ
        return _parsed(env.get(ALLOWED_PRIVATE_VARIABLE, ""))

    def allows(self, host: str, address: IPAddress) -> bool:
        """Whether ``host`` (as the URL names it), resolved to ``address``, is listed."""
        if host.lower().removesuffix(".") in self.hosts:
            return True
        return any(address.version == n.version and address in n for n in self.networks)

    def describe(self) -> str:
        entries = [*map(str, self.networks), *sorted(self.hosts)]
        return ", ".join(entries) or "unset"


_parsed_cache: dict[str, PrivateAllowList] = {}


def _parsed(text: str) -> PrivateAllowList:
    found = _parsed_cache.get(text)
    if found is None:
        found = _parsed_cache[text] = PrivateAllowList.parse(text)
    return found


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
            return f"{'an' if reason[0] in 'aeiou' else 'a'} {reason} address"
    return None


def literal_address(host: str) -> IPAddress | None:
    """The address ``host`` spells, or ``None`` when it is a name.

    Raises ``ValueError`` for a host that ends in a number but is no valid IPv4
    address (``999.0.0.1``, ``1.2.3.4.5``, ``08.0.0.1``): a resolver would not
    look it up as a name either.
    """
    with contextlib.suppress(ValueError):  # not an address as written: maybe a numeric form
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]").split("%", 1)[0])
    parts = host.removesuffix(".").split(".")
    if not _NUMBER.fullmatch(parts[-1]):
        return None
    if len(parts) > 4 or not all(_NUMBER.fullmatch(part) for part in parts):
        raise ValueError(f"{host!r} is not a valid IPv4 address")
    numbers = [_parse_number(part, host) for part in parts]
    *leading, last = numbers
    if any(n > 255 for n in leading) or last >= 256 ** (5 - len(numbers)):
        raise ValueError(f"{host!r} is not a valid IPv4 address (a part is out of range)")
    value = last
    for index, number in enumerate(leading):
        value += number << (8 * (3 - index))
    return ipaddress.IPv4Address(value)


def _parse_number(part: str, host: str) -> int:
    """One part of a numbers-and-dots address: ``0x`` hex, ``0`` octal, else decimal."""
    if part[:2] in ("0x", "0X"):
        return int(part[2:] or "0", 16)
    if len(part) > 1 and part.startswith("0"):
        if not set(part) <= set("01234567"):
            raise ValueError(f"{host!r} is not a valid IPv4 address ({part!r} is not octal)")
        return int(part, 8)
    return int(part)


def url_problem(url: str, *, allow_private: bool = False) -> str | None:
    """Why ``url`` may not be called, or ``None``; resolving a name is left to the caller.

    ``allow_private`` lifts only the address check: the scheme, host and
    credentials rules always hold.
    """
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        return f"not a valid URL ({exc})"
    if parsed.scheme not in SCHEMES:
        return f"scheme {parsed.scheme!r} is not allowed (only http and https)"
    host = parsed.raw_host.decode("ascii")
    if not host:
        return "the URL has no host"
    if parsed.userinfo:
        return "credentials in the URL are not allowed (use 'auth' with a Secret)"
    try:
        address = literal_address(host)
    except ValueError as exc:
        return str(exc)
    if address is None and not _HOST_NAME.fullmatch(host):
        return f"{host!r} is not a valid host name"
    if allow_private:
        return None
    if address is None:
        name = host.lower().removesuffix(".")
        if name == "localhost" or name.endswith(".localhost"):
            return f"{host} is a loopback name (set allow_private to call it)"
        return None
    reason = blocked_reason(address)
    if reason is None:
        return None
    # Name the address a numbers-and-dots spelling (0x7f.1) stands for.
    spelled = isinstance(address, ipaddress.IPv4Address) and host != str(address)
    spelled_as = f" ({host} is {address})" if spelled else ""
    return f"{address} is {reason}{spelled_as}; set allow_private to call it"
