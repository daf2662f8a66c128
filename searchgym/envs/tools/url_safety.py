"""URL safety for agent-chosen URLs: an SSRF guard (public addresses only) and a leakage blocklist.

The agent picks the URLs, so by default a URL is refused when its host is, or resolves to, any
loopback, private, link-local, multicast, reserved, unspecified or otherwise non-public address.
Numeric host spellings that resolvers accept (``2130706433``, ``0x7f.1``, ``0177.0.0.1``,
``[::1]``, IPv4-mapped IPv6) are decoded and checked like dotted quads. Only an explicit allowlist
lifts the guard. `SafeResolver` plugs the same check into aiohttp, so the connection goes to the
address that was checked (no second, rebindable DNS lookup). The domain blocklist keeps benchmark
answer pages out of search results and fetches.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp.abc import AbstractResolver
from yarl import URL

from searchgym.envs.tools.base import BackendError

if TYPE_CHECKING:
    from aiohttp.abc import ResolveResult  # aiohttp >= 3.10

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class UnsafeURL(BackendError):
    """The URL points at a non-public address (SSRF guard) or is not a fetchable http(s) URL."""


class BlockedURL(BackendError):
    """The URL's domain is on the blocklist (leakage guard: benchmark answer pages)."""


def parse_numeric_host(host: str) -> IPAddress | None:
    """Decode a host written as an IP in any form resolvers accept (inet_aton rules, IPv6); else None."""
    host = host.strip().rstrip(".").strip("[]")
    if not host:
        return None
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])  # dotted quad or IPv6 (zone id dropped)
    except ValueError:
        pass
    parts = host.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values: list[int] = []
    for part in parts:
        p = part.lower()
        try:
            if p.startswith("0x"):
                values.append(int(p[2:] or "0", 16))
            elif len(p) > 1 and p.startswith("0"):
                values.append(int(p, 8))
            elif p.isdigit():
                values.append(int(p, 10))
            else:
                return None
        except ValueError:
            return None
    # inet_aton: a.b.c.d, a.b.c (c is 16 bits), a.b (b is 24 bits), a (32 bits)
    *head, last = values
    if any(v > 255 for v in head) or last >= 1 << (8 * (4 - len(head))):
        return None
    number = last
    for i, v in enumerate(head):
        number |= v << (8 * (3 - i))
    return ipaddress.IPv4Address(number)


# Ranges that are never a public web server's address, whatever `ipaddress` says: every entry of IANA's IPv4 and
# IPv6 Special-Purpose Address Registries that is not globally reachable (or reachable only as anycast
# infrastructure), plus multicast, the deprecated site-local and 6bone ranges, and IPv4-compatible IPv6.
# (IPv4-mapped, 6to4 and NAT64 addresses are judged by the IPv4 address they embed.)
NON_PUBLIC_NETWORKS: tuple[IPNetwork, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        # IPv4 (RFC 6890 and its updates)
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.31.196.0/24",
        "192.52.193.0/24",
        "192.88.99.0/24",
        "192.168.0.0/16",
        "192.175.48.0/24",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "255.255.255.255/32",
        # IPv6 (RFC 6890, 8190 and later registrations)
        "::/128",
        "::1/128",
        "::/96",
        "64:ff9b:1::/48",
        "100::/64",
        "100:0:0:1::/64",
        "2001::/23",
        "2001:db8::/32",
        "2620:4f:8000::/48",
        "3ffe::/16",
        "3fff::/20",
        "5f00::/16",
        "fc00::/7",
        "fe80::/10",
        "fec0::/10",
        "ff00::/8",
    )
)
GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")  # IANA allocates public IPv6 unicast only from here


def is_public(ip: IPAddress) -> bool:
    """True only for globally routable unicast addresses (IPv4 embedded in IPv6 judged as IPv4).

    An address must pass both `ipaddress`'s view and the explicit IANA-derived table above (which also
    refuses ranges Python still calls global, such as the deprecated site-local fec0::/10), and an IPv6
    address must lie in the global unicast space 2000::/3.
    """
    if any(ip.version == net.version and ip in net for net in NON_PUBLIC_NETWORKS):
        return False  # before unwrapping: Teredo (2001::/32) and the like are refused as a whole
    if isinstance(ip, ipaddress.IPv6Address):
        mapped = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if mapped is not None:
            return is_public(mapped)
        if ip in ipaddress.IPv6Network("64:ff9b::/96"):  # NAT64 well-known prefix embeds an IPv4
            return is_public(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        if ip not in GLOBAL_UNICAST_V6:
            return False
    return bool(
        ip.is_global
        and not (
            ip.is_multicast
            or ip.is_reserved
            or ip.is_unspecified
            or ip.is_loopback
            or ip.is_link_local
            or ip.is_private
        )
    )


def _host_matches(host: str, domain: str) -> bool:
    """True when host is domain or a subdomain of it."""
    return host == domain or host.endswith("." + domain)


@dataclass
class UrlPolicy:
    """Which URLs may be fetched: the SSRF guard with its allowlist, and the domain blocklist.

    `allow` entries lift the guard: ``"host"`` or ``"host:port"`` (a name or an IP; an IP entry also
    matches other spellings of that address) or a network ``"127.0.0.0/8"``. `block` entries are
    domains (their subdomains included) that are refused whatever the guard says.
    """

    allow: Iterable[str] = ()
    block: Iterable[str] = ()
    _names: list[tuple[str, int | None]] = field(init=False, repr=False)
    _ips: list[tuple[IPAddress, int | None]] = field(init=False, repr=False)
    _nets: list[IPNetwork] = field(init=False, repr=False)
    _block: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._names, self._ips, self._nets = [], [], []
        for entry in self.allow:
            entry = entry.strip().lower()
            if "/" in entry:
                self._nets.append(ipaddress.ip_network(entry, strict=False))
                continue
            host, port = _split_host_port(entry)
            ip = parse_numeric_host(host)
            if ip is not None:
                self._ips.append((ip, port))
            else:
                self._names.append((host.rstrip("."), port))
        self._block = tuple(d.strip().lower().strip(".") for d in self.block if d.strip())
        self.allow, self.block = tuple(self.allow), self._block

    def is_blocked(self, url: str) -> bool:
        """True when the URL's host is a blocklisted domain or one of its subdomains."""
        if not self._block:
            return False
        try:
            host = (URL(url).host or "").lower().rstrip(".")
        except (ValueError, TypeError):
            return False
        return any(_host_matches(host, d) for d in self._block)

    def name_allowed(self, host: str, port: int | None) -> bool:
        """True when the host name (as written) with this port is allowlisted."""
        host = host.lower().rstrip(".").strip("[]")
        return any(h == host and p in (None, port) for h, p in self._names)

    def ip_allowed(self, ip: IPAddress, port: int | None) -> bool:
        """True when the address (with this port) is allowlisted by an IP or network entry."""
        return any(a == ip and p in (None, port) for a, p in self._ips) or any(ip in n for n in self._nets)

    def address_ok(self, host: str, ip: IPAddress, port: int | None) -> bool:
        """True when connecting to ip for host:port is permitted (public, or allowlisted)."""
        return is_public(ip) or self.name_allowed(host, port) or self.ip_allowed(ip, port)

    def check_syntax(self, url: str) -> URL:
        """Parse an agent's URL and refuse what is not http(s) or is blocklisted (no network use)."""
        try:
            parsed = URL(url)
        except (ValueError, TypeError) as e:
            raise UnsafeURL(f"not a valid URL: {e}") from None
        if parsed.scheme not in ("http", "https"):
            raise UnsafeURL(
                f"only http and https URLs can be opened, not {parsed.scheme or 'a URL without a scheme'!r}"
            )
        if not parsed.host:
            raise UnsafeURL("the URL has no host")
        if parsed.user or parsed.password:
            raise UnsafeURL("URLs with credentials are refused")
        if self.is_blocked(str(parsed)):
            raise BlockedURL(f"{parsed.host} is blocklisted (leakage guard)")
        return parsed

    async def resolve(self, host: str, port: int, family: int = socket.AF_UNSPEC) -> list[IPAddress]:
        """Resolve host once and return its addresses, refusing if any is not permitted."""
        numeric = parse_numeric_host(host)
        if numeric is not None:
            ips: list[IPAddress] = [numeric]
        else:
            name = host.lower().rstrip(".")
            if name in ("localhost", "localhost.localdomain") or name.endswith(".localhost"):
                if not self.name_allowed(host, port):
                    raise UnsafeURL(f"{host} is a loopback name; refused")
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, port, family=family, type=socket.SOCK_STREAM)
            except socket.gaierror as e:
                raise BackendError(f"could not resolve {host}: {e.strerror or e}") from None
            parsed = list(dict.fromkeys(parse_numeric_host(str(info[4][0])) for info in infos))
            ips = [ip for ip in parsed if ip is not None]
            if not ips:
                raise BackendError(f"could not resolve {host}")
        bad = [ip for ip in ips if not self.address_ok(host, ip, port)]
        if bad:
            raise UnsafeURL(f"{host} resolves to the non-public address {bad[0]}; refused (SSRF guard)")
        return ips

    async def check(self, url: str) -> URL:
        """Full pre-connection check of a URL: syntax, blocklist, and every address its host resolves to."""
        parsed = self.check_syntax(url)
        await self.resolve(parsed.raw_host or parsed.host or "", parsed.port or 0)
        return parsed


def _split_host_port(entry: str) -> tuple[str, int | None]:
    """Split 'host', 'host:port', '[v6]:port' or a bare IPv6 into host and optional port."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:] else None
    if entry.count(":") == 1:
        host, port = entry.split(":")
        return host, int(port)
    return entry, None


class SafeResolver(AbstractResolver):
    """An aiohttp resolver that returns only addresses the policy permits, so the checked IP is the one dialled."""

    def __init__(self, policy: UrlPolicy):
        self.policy = policy

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[ResolveResult]:
        ips = await self.policy.resolve(host, port, family)
        return [
            {
                "hostname": host,
                "host": str(ip),
                "port": port,
                "family": socket.AF_INET6 if ip.version == 6 else socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
            for ip in ips
        ]

    async def close(self) -> None:
        return None
