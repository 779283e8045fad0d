"""A subscription's status per partition: committed offset, lag, in-flight, last error, state.

One owner for the figures `GET /v1/subscriptions/{name}` and the dashboard both show. The
shared tables (offsets, leases, dead letters, and on request the retention skips) are read once
by `read_groups`, for one group or all of them, and `subscription_status` combines that read
with the broker's log ends and what the delivery workers report: a worker on the ingest event
loop (delivery_mode=inprocess) directly, the others (serve's delivery process, `lakebroker
deliver` workers) through the status they heartbeat into their leases.

Two figures tell of messages retention removed before the group delivered them:
`retention_skips` is the durable record the retention job writes when it moves the group forward
(`_system/retention_skips`, every skip since the subscription was created), and
`retention_skipped` is what the partition's current delivery worker found already removed when
it read (a live counter, reset when the partition changes worker).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.live_status import LiveStatus
from lakebroker.tables.dead_letters import DeadLetterTable
from lakebroker.tables.layout import Layout
from lakebroker.tables.leases import Lease, LeaseTable, Pair
from lakebroker.tables.offsets import GroupPartition, OffsetsTable
from lakebroker.tables.offsets import pull_group_lags as offsets_lags
from lakebroker.tables.retention_skips import RetentionSkip, SkipSummary, retention_skips, summarize
from lakebroker.tables.subscriptions import Subscription


@dataclass(frozen=True)
class GroupTables:
    """One read of the tables that hold consumer-group state."""

    committed: dict[GroupPartition, tuple[int, str]]
    leases: dict[Pair, Lease]
    dead_letters: dict[str, int]  # group -> letters not yet replayed
    retention_skips: tuple[RetentionSkip, ...] = ()  # read only when asked for


def read_groups(layout: Layout, group: str | None = None, *, offsets: OffsetsTable | None = None,
                dead_letters: dict[str, int] | None = None, with_retention_skips: bool = False) -> GroupTables:
    """Read offsets, leases and dead-letter counts for `group`, or for every group (blocking),
    and the retention skips when `with_retention_skips` (the dashboard does not show them).

    A caller that reads often passes its own long-lived `offsets` (it follows the table's log
    incrementally), and `dead_letters` when it has read that table already."""
    committed = (offsets or OffsetsTable(layout)).latest(group)
    leases = LeaseTable(layout, "api", 10).leases()
    if dead_letters is None:
        dead = DeadLetterTable(layout)
        dead_letters = ({group: dead.count(group)} if group is not None
                        else {g: n for g, (n, _) in dead.unreplayed().items()})
    skips = tuple(retention_skips(layout, group=group)) if with_retention_skips else ()
    return GroupTables(committed, leases, dead_letters, skips)


def pull_group_lags(broker: Broker, committed: Mapping[GroupPartition, tuple[int, str]]) -> list[dict[str, Any]]:
    """The groups that are no subscription, with the lag to each partition's end as this broker counts it."""
    return offsets_lags(committed, broker.topics, broker.committed_end)


def _skips_public(summary: SkipSummary | None) -> dict[str, Any]:
    if summary is None:
        return {"skips": 0, "messages": 0, "last": None}
    last = summary.last
    return {"skips": summary.skips, "messages": summary.messages,
            "last": {"skipped_at": last.skipped_at.isoformat(), "from_offset": last.from_offset,
                     "to_offset": last.to_offset, "messages": last.skipped_messages, "run_id": last.run_id}}


def subscription_status(broker: Broker, worker: LiveStatus | None, sub: Subscription,
                        groups: GroupTables) -> dict[str, Any]:
    """The subscription's public configuration, its dead-letter count and per-partition status."""
    topic = broker.topics.get(sub.topic)
    live = worker.status(sub.name) if worker is not None else {}
    # Only this subscription's skips: a group of the same name deleted before it does not count.
    skips = summarize(s for s in groups.retention_skips
                      if s.group == sub.name and s.topic == sub.topic and s.skipped_at >= sub.created_at)
    partitions = []
    for p in range(topic.partitions if topic else 0):
        assert topic is not None
        offset, reason = groups.committed.get((sub.name, sub.topic, p), (0, "start"))
        end = broker.committed_end(topic, p)
        lease = groups.leases.get((sub.name, p))
        reported: dict[str, Any] = {}
        if p in live:
            reported = live[p].as_dict()
        elif lease is not None and lease.status:
            reported = orjson.loads(lease.status)
        partitions.append({
            "partition": p,
            "committed_offset": offset,
            "last_commit_reason": reason,
            "high_watermark": end,
            "log_end_offset": end,  # deprecated: high_watermark
            "lag": max(0, end - offset),
            "in_flight": reported.get("in_flight", 0),
            "delivered": reported.get("delivered", 0),
            "dead_lettered": reported.get("dead_lettered", 0),
            "retention_skipped": reported.get("skipped", 0),
            "retention_skips": _skips_public(skips.get((sub.name, sub.topic, p))),
            "last_status": reported.get("last_status"),
            "last_error": reported.get("last_error"),
            "state": sub.endpoint_state if not sub.active else reported.get("state", "idle"),
            "owner": lease.owner if lease is not None else None,
        })
    return {**sub.public(), "dead_letters": groups.dead_letters.get(sub.name, 0), "partitions": partitions,
            "health": health(sub, partitions)}


def health(sub: Subscription, partitions: list[dict[str, Any]]) -> dict[str, Any]:
    """The endpoint's health, from the partitions' states: disabled, open (a worker's circuit),
    failing (retrying), or healthy."""
    states = {p["state"] for p in partitions}
    errors = [p["last_error"] for p in partitions if p["last_error"]]
    since = None if sub.failing_since is None else sub.failing_since.isoformat()
    if sub.disabled_reason is not None or "disabled" in states:  # a worker's pipeline met 410 Gone
        return {"state": "disabled", "since": since,
                "last_error": sub.disabled_reason or (errors[0] if errors else None)}
    if "circuit_open" in states:
        return {"state": "open", "since": since, "last_error": errors[0] if errors else None}
    if "backing_off" in states or since is not None:
        return {"state": "failing", "since": since, "last_error": errors[0] if errors else None}
    return {"state": "healthy", "since": None, "last_error": None}
