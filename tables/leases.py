"""Partition leases: which worker delivers which (subscription, partition).

Every worker heartbeats into `_system/delivery_leases` (a state table changed under
optimistic concurrency). From the live members, each computes the same assignment:
pairs sorted, dealt round-robin over members sorted by id. A worker takes a pair only once
its previous lease has expired or been released, and stops delivering a pair before it
releases it or before its lease runs out, so two workers never deliver one partition at
once. A dead worker's pairs are taken over after `lease_ttl_s`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from lakebroker.tables.layout import Layout
from lakebroker.tables.schemas import LEASES_SCHEMA, LEASES_SCHEMA_VERSION
from lakebroker.tables.state_table import Rows, StateTable

Pair = tuple[str, int]  # (subscription, partition)


@dataclass(frozen=True)
class Lease:
    group: str
    partition: int
    owner: str | None
    epoch: int
    expires_at: datetime
    seek_epoch: int
    status: str | None

    def live(self, now: datetime) -> bool:
        return self.owner is not None and self.expires_at > now


def _lease(row: dict[str, Any]) -> Lease:
    return Lease(row["group"], row["partition"], row["owner"], row["epoch"], row["expires_at"], row["seek_epoch"],
                 row["status"])


def assign(pairs: list[Pair], members: list[str]) -> dict[Pair, str]:
    ordered = sorted(members)
    return {pair: ordered[i % len(ordered)] for i, pair in enumerate(sorted(pairs))} if ordered else {}


def lease_epochs(layout: Layout) -> dict[Pair, int]:
    """Each leased (group, partition)'s epoch, for a writer without a lease of its own (an
    administrative offsets commit) to fence with."""
    table = StateTable(layout.leases_table, LEASES_SCHEMA, LEASES_SCHEMA_VERSION)
    return {(r["group"], r["partition"]): r["epoch"] for r in table.read() if r["kind"] == "lease"}


class LeaseTable:
    def __init__(self, layout: Layout, worker_id: str, ttl_s: float) -> None:
        self.table = StateTable(layout.leases_table, LEASES_SCHEMA, LEASES_SCHEMA_VERSION)
        self.worker_id = worker_id
        self.ttl = timedelta(seconds=ttl_s)

    def leases(self) -> dict[Pair, Lease]:
        return {(r["group"], r["partition"]): _lease(r) for r in self.table.read() if r["kind"] == "lease"}

    def desired(self, pairs: list[Pair]) -> set[Pair]:
        """The pairs this worker should deliver, judged from the table as it is now."""
        now = datetime.now(UTC)
        members: set[str] = {r["owner"] for r in self.table.read() if r["kind"] == "member" and r["expires_at"] > now}
        members.add(self.worker_id)
        return {p for p, owner in assign(pairs, [m for m in members if m]).items() if owner == self.worker_id}

    def heartbeat(self, pairs: list[Pair], release: set[Pair], statuses: dict[Pair, str],
                  applied_seeks: dict[Pair, int]) -> dict[Pair, Lease]:
        """Renew, take and release leases in one commit; returns the leases this worker holds.
        `statuses` holds the status of every pair this worker runs a pipeline for."""

        def change(rows: Rows) -> tuple[Rows, dict[Pair, Lease]]:
            now = datetime.now(UTC)
            expires = now + self.ttl
            stale = now - self.ttl * 10
            members = [r for r in rows if r["kind"] == "member" and r["owner"] != self.worker_id
                       and r["expires_at"] > stale]
            members.append({"kind": "member", "group": "", "partition": -1, "owner": self.worker_id, "epoch": 0,
                            "expires_at": expires, "seek_epoch": 0, "status": None})
            live = [m["owner"] for m in members if m["expires_at"] > now]
            plan = assign(pairs, live)
            by_pair = {(r["group"], r["partition"]): dict(r) for r in rows if r["kind"] == "lease"}
            for pair in set(plan) | set(by_pair):
                row = by_pair.get(pair)
                mine = row is not None and row["owner"] == self.worker_id and row["expires_at"] > now
                if mine and row is not None and (pair in release or pair not in plan):
                    # `statuses` names the pairs with a running pipeline: a pair without one has
                    # nothing to stop first, so it goes now (kept, it would be renewed for good).
                    if pair in release or pair not in statuses:
                        row.update(owner=None, status=statuses.get(pair, row["status"]))
                    else:
                        row.update(expires_at=expires, status=statuses[pair])  # kept until its pipeline stops
                elif mine and row is not None:
                    row.update(expires_at=expires, status=statuses.get(pair, row["status"]),
                               seek_epoch=max(row["seek_epoch"], applied_seeks.get(pair, 0)))
                elif plan.get(pair) == self.worker_id and pair not in release:
                    if row is None:
                        by_pair[pair] = {"kind": "lease", "group": pair[0], "partition": pair[1],
                                         "owner": self.worker_id, "epoch": 1, "expires_at": expires,
                                         "seek_epoch": applied_seeks.get(pair, 0), "status": None}
                    elif row["owner"] is None or row["expires_at"] <= now:
                        row.update(owner=self.worker_id, epoch=row["epoch"] + 1, expires_at=expires)
            leases = sorted(by_pair.values(), key=lambda r: (r["group"], r["partition"]))
            held = {(r["group"], r["partition"]): _lease(r) for r in leases
                    if r["owner"] == self.worker_id and r["expires_at"] > now}
            return sorted(members, key=lambda r: r["owner"]) + leases, held

        return self.table.mutate(change)

    def renew(self, pairs: set[Pair]) -> dict[Pair, Lease]:
        """Extend this worker's membership and the leases of `pairs` it still holds, taking,
        releasing and rebalancing nothing (that is `heartbeat`'s); returns the leases renewed.
        A membership or lease already expired stays so: others may have planned without it."""

        def change(rows: Rows) -> tuple[Rows, dict[Pair, Lease]]:
            now = datetime.now(UTC)
            out = [dict(r) for r in rows]
            renewed: dict[Pair, Lease] = {}
            for r in out:
                if r["owner"] != self.worker_id or r["expires_at"] <= now:
                    continue
                if r["kind"] == "member":
                    r["expires_at"] = now + self.ttl
                elif r["kind"] == "lease" and (r["group"], r["partition"]) in pairs:
                    r["expires_at"] = now + self.ttl
                    renewed[(r["group"], r["partition"])] = _lease(r)
            return out, renewed

        return self.table.mutate(change)

    def raise_epoch(self, pair: Pair, epoch: int) -> Lease | None:
        """Lift the epoch of a lease this worker holds to at least `epoch`; None if it is not held.

        Offsets can carry epochs this table has forgotten (a subscription re-created under its
        name, a data dir restored or failed over to a replica), and a fencing token must outrank
        every commit made before its lease began."""

        def change(rows: Rows) -> tuple[Rows, Lease | None]:
            now = datetime.now(UTC)
            out = [dict(r) for r in rows]
            for r in out:
                if r["kind"] == "lease" and (r["group"], r["partition"]) == pair:
                    if r["owner"] != self.worker_id or r["expires_at"] <= now:
                        return rows, None
                    r["epoch"] = max(r["epoch"], epoch)
                    return out, _lease(r)
            return rows, None

        return self.table.mutate(change)

    def forget_group(self, group: str) -> None:
        self.table.mutate(lambda rows: ([r for r in rows if r["group"] != group], None))

    def record_seek(self, group: str, partitions: dict[int, int], epoch: int) -> set[int]:
        """For partitions no live worker holds, mark the seek applied; returns those partitions."""

        def change(rows: Rows) -> tuple[Rows, set[int]]:
            now = datetime.now(UTC)
            applied: set[int] = set()
            out = [dict(r) for r in rows]
            by_pair = {(r["group"], r["partition"]): r for r in out if r["kind"] == "lease"}
            for p in partitions:
                row = by_pair.get((group, p))
                if row is None:
                    out.append({"kind": "lease", "group": group, "partition": p, "owner": None, "epoch": 0,
                                "expires_at": now, "seek_epoch": epoch, "status": None})
                    applied.add(p)
                elif row["owner"] is None or row["expires_at"] <= now:
                    row["seek_epoch"] = epoch
                    applied.add(p)
            return out, applied

        return self.table.mutate(change)
