"""Subscriptions: a consumer group that pushes one topic to one webhook endpoint.

Stored as rows of the `_system/subscriptions` state table (tables/state_table.py). The
API writes configuration; delivery workers read it and write back only `disabled_reason`
(after a 410 Gone), so both sides change it under optimistic concurrency.
"""

from __future__ import annotations

import base64
import secrets as secrets_module
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from lakebroker.tables.errors import AlreadyExists, InvalidRequest, NotFound
from lakebroker.tables.filters import Filter
from lakebroker.tables.filters import parse as parse_filter
from lakebroker.tables.layout import Layout, validate_name
from lakebroker.tables.schemas import SUBSCRIPTIONS_SCHEMA, SUBSCRIPTIONS_SCHEMA_VERSION
from lakebroker.tables.state_table import Rows, StateTable

# An endpoint's circuit (delivery_worker/breaker.py): open after this many failures in a row, a
# run that random failures of a healthy endpoint (even one in three) all but never reach.
DEFAULT_BREAKER_FAILURES = 20
DEFAULT_BREAKER_COOLDOWN_MS = 30_000
# Its failure share, when a subscription sets breaker_failure_ratio: over a minute, from 20 attempts.
DEFAULT_BREAKER_WINDOW_MS = 60_000
DEFAULT_BREAKER_MIN_REQUESTS = 20
DEFAULT_DISABLE_AFTER_MS = 5 * 86_400_000  # Svix's five days
# Svix's schedule, shortened at the top end: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h.
DEFAULT_RETRY_SCHEDULE_MS = (5_000, 300_000, 1_800_000, 7_200_000, 18_000_000, 36_000_000, 36_000_000)


class Ordering(StrEnum):
    PARTITION = "partition"  # one message in flight per partition (Kafka's order)
    KEY = "key"  # one message in flight per key; keyless messages keep partition order among themselves
    NONE = "none"  # as many as the window allows


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets_module.token_bytes(24)).decode()


def validate_secret(secret: str) -> str:
    if not secret.startswith("whsec_"):
        raise InvalidRequest("secret must be a Standard Webhooks secret: 'whsec_' followed by base64")
    try:
        key = base64.b64decode(secret[len("whsec_") :], validate=True)
    except ValueError:
        raise InvalidRequest("secret must be 'whsec_' followed by valid base64") from None
    if not 24 <= len(key) <= 64:
        raise InvalidRequest("secret key must be 24 to 64 bytes (before base64)")
    return secret


def mask(secret: str) -> str:
    return secret[:10] + "…" if len(secret) > 10 else "whsec_…"


@dataclass(frozen=True)
class Subscription:
    name: str
    topic: str
    url: str
    ordering: Ordering = Ordering.KEY  # why: docs/webhooks.md, "Ordering"
    max_in_flight: int = 16
    rate_limit_per_s: float | None = None
    max_attempts: int = 8
    retry_schedule_ms: tuple[int, ...] = DEFAULT_RETRY_SCHEDULE_MS
    timeout_ms: int = 10_000
    batch_size: int = 1
    secrets: tuple[str, ...] = ()
    paused: bool = False
    disabled_reason: str | None = None
    seek_epoch: int = 0
    seek_offsets: dict[int, int] | None = None
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    filter: str | None = None  # only the messages it matches are delivered (tables/filters.py)
    breaker_failures: int = DEFAULT_BREAKER_FAILURES  # endpoint failures in a row that open its circuit; 0: never
    breaker_cooldown_ms: int = DEFAULT_BREAKER_COOLDOWN_MS  # open this long before a probe
    disable_after_ms: int = DEFAULT_DISABLE_AFTER_MS  # failing this long without a success disables it; 0: never
    failing_since: datetime | None = None  # set by a worker when its circuit opens, cleared when it closes
    breaker_failure_ratio: float | None = None  # this share of failures in the window opens it too; None: off
    breaker_window_ms: int = DEFAULT_BREAKER_WINDOW_MS
    breaker_min_requests: int = DEFAULT_BREAKER_MIN_REQUESTS  # attempts in the window before the share counts

    def __post_init__(self) -> None:
        validate_name(self.name, "subscription")
        validate_name(self.topic)
        if not 1 <= self.max_in_flight <= 1000:
            raise InvalidRequest("max_in_flight must be between 1 and 1000")
        if self.rate_limit_per_s is not None and not 0 < self.rate_limit_per_s <= 100_000:
            raise InvalidRequest("rate_limit_per_s must be above 0 and at most 100000, or null for no limit")
        if not 1 <= self.max_attempts <= 100:
            raise InvalidRequest("max_attempts must be between 1 and 100")
        if not self.retry_schedule_ms or any(not 0 <= d <= 86_400_000 for d in self.retry_schedule_ms):
            raise InvalidRequest("retry_schedule_ms needs 1 or more delays, each from 0 to 86400000 ms")
        if not 100 <= self.timeout_ms <= 120_000:
            raise InvalidRequest("timeout_ms must be between 100 and 120000")
        if not 1 <= self.batch_size <= 1000:
            raise InvalidRequest("batch_size must be between 1 and 1000")
        if not 0 <= self.breaker_failures <= 10_000:
            raise InvalidRequest("breaker_failures must be between 0 (never open) and 10000")
        if not 1_000 <= self.breaker_cooldown_ms <= 3_600_000:
            raise InvalidRequest("breaker_cooldown_s must be between 1 and 3600")
        if self.breaker_failure_ratio is not None and not 0 < self.breaker_failure_ratio <= 1:
            raise InvalidRequest("breaker_failure_ratio must be above 0 and at most 1, or null for none")
        if not 1_000 <= self.breaker_window_ms <= 3_600_000:
            raise InvalidRequest("breaker_window_s must be between 1 and 3600")
        if not 1 <= self.breaker_min_requests <= 100_000:
            raise InvalidRequest("breaker_min_requests must be between 1 and 100000")
        if not 0 <= self.disable_after_ms <= 365 * 86_400_000:
            raise InvalidRequest("disable_after_s must be between 0 (never) and 31536000 (a year)")
        if not self.secrets or len(self.secrets) > 2:
            raise InvalidRequest("a subscription signs with one secret, or two while rotating")
        for s in self.secrets:
            validate_secret(s)
        self.message_filter()  # InvalidFilter (422) if it means nothing

    def message_filter(self) -> Filter | None:
        return None if self.filter is None else parse_filter(self.filter)

    @property
    def active(self) -> bool:
        return not self.paused and self.disabled_reason is None

    @property
    def endpoint_state(self) -> str:
        if self.disabled_reason is not None:
            return "disabled"
        return "paused" if self.paused else "active"

    def public(self, *, reveal_secret: bool = False, reveal_url: bool = True) -> dict[str, Any]:
        """The subscription as the API shows it: the secret masked unless revealed, and the URL
        (which often carries a secret of its own) as its origin alone unless revealed."""
        out = asdict(self)
        if not reveal_url:
            out["url"] = redact_url(self.url)
        out["ordering"] = self.ordering.value
        out["retry_schedule_ms"] = list(self.retry_schedule_ms)
        out["created_at"] = self.created_at.isoformat()
        out["failing_since"] = None if self.failing_since is None else self.failing_since.isoformat()
        out["endpoint_state"] = self.endpoint_state
        del out["secrets"], out["seek_offsets"]
        out["secret"] = self.secrets[0] if reveal_secret else mask(self.secrets[0])
        return out


def redact_url(url: str) -> str:
    """`url` without what may be secret: credentials, path, query and fragment
    (`https://hooks.example.com/…`). For logs and for callers who may not see the whole URL."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<malformed url>"
    if ":" in host:
        host = f"[{host}]"
    origin = f"{parts.scheme}://{host}" + ("" if port is None else f":{port}")
    return origin + ("/…" if parts.path.strip("/") or parts.query or parts.fragment else "/")


def _to_row(sub: Subscription) -> dict[str, Any]:
    row = asdict(sub)
    row["ordering"] = sub.ordering.value
    row["retry_schedule_ms"] = list(sub.retry_schedule_ms)
    row["secrets"] = list(sub.secrets)
    row["seek_offsets"] = None if sub.seek_offsets is None else list(sub.seek_offsets.items())
    return row


def _from_row(row: dict[str, Any]) -> Subscription:
    row = dict(row)
    row["ordering"] = Ordering(row["ordering"])
    row["retry_schedule_ms"] = tuple(row["retry_schedule_ms"])
    row["secrets"] = tuple(row["secrets"])
    row["seek_offsets"] = None if row["seek_offsets"] is None else dict(row["seek_offsets"])
    # Rows written before these columns (schema versions 1 to 4) hold nulls: the defaults.
    for name, default in (("breaker_failures", DEFAULT_BREAKER_FAILURES),
                          ("breaker_cooldown_ms", DEFAULT_BREAKER_COOLDOWN_MS),
                          ("breaker_window_ms", DEFAULT_BREAKER_WINDOW_MS),
                          ("breaker_min_requests", DEFAULT_BREAKER_MIN_REQUESTS),
                          ("disable_after_ms", DEFAULT_DISABLE_AFTER_MS)):
        if row.get(name) is None:
            row[name] = default
    return Subscription(**row)


class SubscriptionStore:
    def __init__(self, layout: Layout) -> None:
        self._table = StateTable(layout.subscriptions_table, SUBSCRIPTIONS_SCHEMA, SUBSCRIPTIONS_SCHEMA_VERSION)

    def load(self) -> dict[str, Subscription]:
        return {r["name"]: _from_row(r) for r in self._table.read()}

    def get(self, name: str) -> Subscription:
        validate_name(name, "subscription")
        sub = self.load().get(name)
        if sub is None:
            raise NotFound(f"subscription {name!r} does not exist")
        return sub

    def create(self, sub: Subscription) -> Subscription:
        def change(rows: Rows) -> tuple[Rows, Subscription]:
            if any(r["name"] == sub.name for r in rows):
                raise AlreadyExists(f"subscription {sub.name!r} already exists")
            return sorted([*rows, _to_row(sub)], key=lambda r: r["name"]), sub

        return self._table.mutate(change)

    def update(self, name: str, **changes: Any) -> Subscription:
        def change(rows: Rows) -> tuple[Rows, Subscription]:
            for i, r in enumerate(rows):
                if r["name"] == name:
                    updated = replace(_from_row(r), **changes)
                    return [*rows[:i], _to_row(updated), *rows[i + 1 :]], updated
            raise NotFound(f"subscription {name!r} does not exist")

        return self._table.mutate(change)

    def delete(self, name: str) -> None:
        def change(rows: Rows) -> tuple[Rows, None]:
            if not any(r["name"] == name for r in rows):
                raise NotFound(f"subscription {name!r} does not exist")
            return [r for r in rows if r["name"] != name], None

        self._table.mutate(change)
