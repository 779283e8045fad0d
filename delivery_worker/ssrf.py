"""Refuses webhook URLs that point inside the network, unless `allow_private_webhooks` is set."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from tables.errors import InvalidRequest


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
        address = ipaddress.ip_address(info[4][0])
        if not address.is_global:
            raise InvalidRequest(
                f"webhook host {parts.hostname!r} resolves to {address}, a private, loopback or link-local "
                "address; set allow_private_webhooks (LAKEBROKER_ALLOW_PRIVATE_WEBHOOKS=1) to allow it"
            )
    return url
