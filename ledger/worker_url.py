"""Worker URL policy: where the ledger may send replay orders.

A worker's URL (from its signed heartbeat) is where the ledger posts replay orders and
certification probes, so it must not let a registrant aim the ledger at something else (a
cloud metadata service, a link-local admin interface). The policy:

- **Syntax** (:func:`parse_worker_url`): ``http`` or ``https``; a host; no userinfo
  (``user@``), query or fragment; printable ASCII, at most :data:`MAX_URL_LENGTH` characters;
  a valid port. Anything else, a malformed IPv6 literal included, is 422 ``invalid_url``.
- **Addresses** (:class:`UrlPolicy`): a host name is resolved and *every* address it gives is
  checked. Refused, whatever else is allowed, unless explicitly allowed (below):
  :data:`REFUSED` (unspecified, link-local, cloud metadata, multicast, broadcast/reserved);
  IPv4-mapped and NAT64 IPv6 addresses are checked as the IPv4 address they carry. A refused
  address is 422 ``url_not_allowed``.
- **Allowed networks**: ``LEDGER_WORKER_NETWORKS`` (comma-separated CIDRs). Unset: every
  address outside :data:`REFUSED` (loopback included: the demo and tests run on 127.0.0.1).
  Set: only addresses inside a listed network. A refused address is allowed only when a listed
  network that contains it lies inside the refused range (``169.254.10.0/24`` allows that
  subnet; ``0.0.0.0/0`` does not allow link-local).

The ledger checks at registration (each heartbeat) and again when it connects to send an order
(``api/workers_client.py`` resolves, checks every address, then connects to a checked address,
so a name that re-resolves elsewhere between heartbeat and order is caught). Not covered: what
the worker does with the order (it may forward it), HTTP proxies (the worker client uses none),
and addresses that are routable but belong to someone else (list your networks to confine).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from ledger.errors import InvalidInput

MAX_URL_LENGTH = 500
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# A resolver: host and port to the addresses a connection may reach (textual IPs).
Resolver = Callable[[str, int], Sequence[str]]

REFUSED: tuple[tuple[str, IPNetwork], ...] = tuple(
    (why, ipaddress.ip_network(net))
    for why, net in (
        ("unspecified", "0.0.0.0/8"),
        ("unspecified", "::/128"),
        ("link-local", "169.254.0.0/16"),
        ("link-local", "fe80::/10"),
        ("cloud metadata", "fd00:ec2::254/128"),
        ("cloud metadata", "100.100.100.200/32"),
        ("multicast", "224.0.0.0/4"),
        ("multicast", "ff00::/8"),
        ("broadcast or reserved", "240.0.0.0/4"),
    )
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# host[:port]: a name (letters, digits, - . _ ~) or a bracketed IPv6 literal (zone: %25...)
_NETLOC = re.compile(r"(\[[0-9A-Fa-f:.]+(%25[A-Za-z0-9._~\-]+)?\]|[A-Za-z0-9._~\-]+)(:[0-9]{1,5})?")


@dataclass(frozen=True)
class WorkerUrl:
    url: str
    scheme: str
    host: str  # without brackets; an IP literal or a name
    port: int


def _invalid(url: str, why: str, what: str = "worker url") -> InvalidInput:
    return InvalidInput(f"{what} {url[:100]!r} {why}", code="invalid_url")


def parse_worker_url(url: str, what: str = "worker url") -> WorkerUrl:
    """Check a worker URL's syntax (or any http(s) base URL's, named ``what`` in messages:
    the collector's ``--engine-url``); raise InvalidInput ``invalid_url``."""
    if not isinstance(url, str) or not url:
        raise _invalid(str(url), "must be a non-empty string", what)
    if len(url) > MAX_URL_LENGTH:
        raise _invalid(url, f"is longer than {MAX_URL_LENGTH} characters", what)
    if not url.isascii() or not url.isprintable() or " " in url:
        raise _invalid(url, "must be printable ASCII without spaces", what)
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError as exc:  # e.g. "http://[::1" or a port that is not a number
        raise _invalid(url, f"does not parse: {exc}", what) from exc
    if parts.scheme not in ("http", "https"):
        raise _invalid(url, "must be http or https", what)
    if "@" in parts.netloc:
        raise _invalid(url, "must not hold userinfo (user@)", what)
    if not host:
        raise _invalid(url, "has no host", what)
    if not _NETLOC.fullmatch(parts.netloc):
        raise _invalid(
            url, "must have a host name, IPv4 or [IPv6] address and an optional port", what
        )
    if parts.netloc.startswith("[") and ip_literal(host.split("%", 1)[0]) is None:
        raise _invalid(url, "has a bracketed host that is not an IPv6 address", what)
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise _invalid(url, "must not have a query or fragment", what)
    return WorkerUrl(url, parts.scheme, host, port or (443 if parts.scheme == "https" else 80))


def ip_literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _effective(address: IPAddress) -> IPAddress:
    """The address a packet reaches: IPv4-mapped and NAT64 IPv6 carry an IPv4 address."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


@dataclass(frozen=True)
class UrlPolicy:
    """Which addresses worker URLs may reach. ``allowed`` None: any outside :data:`REFUSED`."""

    allowed: tuple[IPNetwork, ...] | None = None

    @classmethod
    def parse(cls, networks: str | None) -> UrlPolicy:
        """From ``LEDGER_WORKER_NETWORKS``: comma-separated CIDRs; empty or None: the default."""
        items = [n.strip() for n in (networks or "").split(",") if n.strip()]
        if not items:
            return cls()
        parsed = []
        for item in items:
            try:
                parsed.append(ipaddress.ip_network(item, strict=True))
            except ValueError as exc:
                raise InvalidInput(
                    f"worker network {item!r} is not a CIDR network ({exc})",
                    code="invalid_setting",
                ) from exc
        return cls(tuple(parsed))

    def check_address(self, text: str, url: str = "") -> None:
        """Raise InvalidInput ``url_not_allowed`` unless ``text`` (an IP) may be reached."""
        try:
            raw = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError as exc:
            raise _invalid(url, f"resolves to {text!r}, which is not an IP address") from exc
        address = _effective(raw)
        refused = [(why, net) for why, net in REFUSED if address in net]
        listed = [
            net for net in self.allowed or () if net.version == address.version and address in net
        ]
        if refused:
            why, net = refused[0]
            if not any(n.subnet_of(net) for n in listed):  # type: ignore[arg-type]
                raise self._refuse(url, raw, f"a {why} address ({net})")
        elif self.allowed is not None and not listed:
            raise self._refuse(url, raw, "outside LEDGER_WORKER_NETWORKS")

    @staticmethod
    def _refuse(url: str, address: IPAddress, why: str) -> InvalidInput:
        return InvalidInput(
            f"worker url {url[:100]!r} reaches {address}: {why}; not allowed (see "
            "LEDGER_WORKER_NETWORKS)",
            code="url_not_allowed",
            details={"address": str(address)},
        )

    def check_addresses(self, url: str, addresses: Sequence[str]) -> None:
        if not addresses:
            raise _invalid(url, "resolves to no address")
        for text in addresses:
            self.check_address(text, url)


def system_resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, as a TCP connection would look it up."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError) as exc:
        raise InvalidInput(
            f"worker host {host[:100]!r} does not resolve: {exc}", code="invalid_url"
        ) from exc
    return sorted({str(info[4][0]) for info in infos})


def check_worker_url(url: str, policy: UrlPolicy, resolve: Resolver = system_resolve) -> WorkerUrl:
    """Syntax, then every address the host resolves to (an IP literal is its own address)."""
    parsed = parse_worker_url(url)
    literal = ip_literal(parsed.host.split("%", 1)[0])
    addresses = [str(literal)] if literal is not None else list(resolve(parsed.host, parsed.port))
    policy.check_addresses(url, addresses)
    return parsed
