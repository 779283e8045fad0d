"""Refuses webhook URLs that are malformed, or that point inside the network unless
`allow_private_webhooks` is set.

An IPv6 address can carry an IPv4 address inside it (IPv4-mapped, IPv4-compatible, 6to4, Teredo,
NAT64), and the network delivers to that IPv4 address; Python's `is_global` judges only the outer
address (`64:ff9b::a9fe:a9fe` is NAT64 for 169.254.169.254 and counts as global). So the embedded
address is judged too, when a subscription is made and on every connection the worker dials.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from urllib.parse import urlsplit

from lakebroker.tables.errors import InvalidWebhookUrl

_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052
_NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215: the IPv4 address sits around the u-octet
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # deprecated, still routed by some stacks


def check_webhook_url(url: str, *, allow_private: bool) -> str:
    if len(url) > 2048:
        raise InvalidWebhookUrl("webhook url is longer than 2048 characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535", a port that is no number
        raise InvalidWebhookUrl(f"webhook url {url!r} is malformed: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidWebhookUrl(f"webhook url {url!r} must be an absolute http:// or https:// URL")
    if parts.username or parts.password:
        raise InvalidWebhookUrl("webhook url must not embed credentials; use the signing secret instead")
    host = parts.hostname
    problem = host_syntax_problem(host)
    if problem is not None:
        raise InvalidWebhookUrl(problem)
    if allow_private:
        return url
    try:
        infos = socket.getaddrinfo(host, port or 443, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        raise InvalidWebhookUrl(f"webhook host {host!r} does not resolve") from None
    for info in infos:
        problem = private_address(host, str(info[4][0]))
        if problem is not None:
            raise InvalidWebhookUrl(problem)
    return url


def host_syntax_problem(host: str) -> str | None:
    """Why `host` (an IP address or a DNS name) cannot be dialled as written; None if it can."""
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    try:
        name = host.encode("idna").decode("ascii")
    except UnicodeError:
        return f"webhook host {host!r} is not a valid DNS name: a label is empty or longer than 63 characters"
    labels = name.removesuffix(".").split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return (f"webhook host {host!r} is not a valid DNS name: at most 253 characters, in labels of 1 to 63 "
                "letters, digits, hyphens or underscores, none starting or ending with a hyphen")
    return None


def private_address(host: str, address: str) -> str | None:
    """Why `host`, resolved to `address`, must not be called; None if the address is public. The one
    rule, applied when a subscription is made and again on every connection the worker dials."""
    ip = ipaddress.ip_address(address)
    if ip.is_global and all(inner.is_global for inner in embedded_ipv4(ip)):
        return None
    return (f"webhook host {host!r} resolves to {address}, a private, loopback or link-local "
            "address; set allow_private_webhooks (LAKEBROKER_ALLOW_PRIVATE_WEBHOOKS=1) to allow it")


def embedded_ipv4(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses that traffic to `ip` reaches through a translation or tunnel."""
    if isinstance(ip, ipaddress.IPv4Address):
        return []
    packed = ip.packed
    found: list[ipaddress.IPv4Address] = []
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)  # the relay server and the client behind it
    if ip in _NAT64_WELL_KNOWN or ip in _IPV4_COMPATIBLE:
        found.append(ipaddress.IPv4Address(packed[12:]))
    if ip in _NAT64_LOCAL_USE:
        found.append(ipaddress.IPv4Address(packed[6:8] + packed[9:11]))
    return found
