"""Refuses webhook URLs that point inside the network, unless `allow_private_webhooks` is set."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from lakebroker.tables.errors import InvalidRequest


def check_webhook_url(url: str, *, allow_private: bool) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest(f"webhook url {url!r} must be an absolute http:// or https:// URL")
    if parts.username or parts.password:
        raise InvalidRequest("webhook url must not embed credentials; use the signing secret instead")
    if len(url) > 2048:
        raise InvalidRequest("webhook url is longer than 2048 characters")
    try:
        port = parts.port
    except ValueError:
        raise InvalidRequest(f"webhook url {url!r} has an invalid port") from None
    if allow_private:
        return url
    try:
        infos = socket.getaddrinfo(parts.hostname, port or 443, proto=socket.IPPROTO_TCP)
    except socket.gaierror:
        raise InvalidRequest(f"webhook host {parts.hostname!r} does not resolve") from None
    for info in infos:
        problem = private_address(parts.hostname, str(info[4][0]))
        if problem is not None:
            raise InvalidRequest(problem)
    return url


def private_address(host: str, address: str) -> str | None:
    """Why `host`, resolved to `address`, must not be called; None if the address is public. The one
    rule, applied when a subscription is made and again on every connection the worker dials."""
    if ipaddress.ip_address(address).is_global:
        return None
    return (f"webhook host {host!r} resolves to {address}, a private, loopback or link-local "
            "address; set allow_private_webhooks (LAKEBROKER_ALLOW_PRIVATE_WEBHOOKS=1) to allow it")
