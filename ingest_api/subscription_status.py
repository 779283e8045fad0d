"""A subscription's status per partition: committed offset, lag, in-flight, last error, state.

One owner for the figures `GET /v1/subscriptions/{name}` and the dashboard both show. The
shared tables (offsets, leases, dead letters) are read once by `read_groups`, for one group
or all of them, and `subscription_status` combines that read with the broker's log ends and
what the delivery workers report: the in-process worker directly, the others through the
status they heartbeat into their leases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from delivery_worker.leases import Lease, LeaseTable, Pair
from delivery_worker.worker import DeliveryWorker
from ingest_api.broker import Broker
from tables.dead_letters import DeadLetterTable
from tables.layout import Layout
from tables.offsets import GroupPartition, OffsetsTable
from tables.subscriptions import Subscription


@dataclass(frozen=True)
class GroupTables:
    """One read of the tables that hold consumer-group state."""

    committed: dict[GroupPartition, tuple[int, str]]
    leases: dict[Pair, Lease]
    dead_letters: dict[str, int]  # group -> letters not yet replayed


def read_groups(layout: Layout, group: str | None = None, *, offsets: OffsetsTable | None = None,
                dead_letters: dict[str, int] | None = None) -> GroupTables:
    """Read offsets, leases and dead-letter counts for `group`, or for every group (blocking).

    A caller that reads often passes its own long-lived `offsets` (it follows the table's log
    incrementally), and `dead_letters` when it has read that table already."""
    committed = (offsets or OffsetsTable(layout)).latest(group)
    leases = LeaseTable(layout, "api", 10).leases()
    if dead_letters is None:
        dead = DeadLetterTable(layout)
        dead_letters = ({group: dead.count(group)} if group is not None
                        else {g: n for g, (n, _) in dead.unreplayed().items()})
    return GroupTables(committed, leases, dead_letters)


def subscription_status(broker: Broker, worker: DeliveryWorker | None, sub: Subscription,
                        groups: GroupTables) -> dict[str, Any]:
    """The subscription's public configuration, its dead-letter count and per-partition status."""
    topic = broker.topics.get(sub.topic)
    live = worker.status(sub.name) if worker is not None else {}
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
            "log_end_offset": end,
            "lag": max(0, end - offset),
            "in_flight": reported.get("in_flight", 0),
            "delivered": reported.get("delivered", 0),
            "dead_lettered": reported.get("dead_lettered", 0),
            "retention_skipped": reported.get("skipped", 0),
            "last_status": reported.get("last_status"),
            "last_error": reported.get("last_error"),
            "state": sub.endpoint_state if not sub.active else reported.get("state", "idle"),
            "owner": lease.owner if lease is not None else None,
        })
    return {**sub.public(), "dead_letters": groups.dead_letters.get(sub.name, 0), "partitions": partitions}
