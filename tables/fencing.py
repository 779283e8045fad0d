"""Partition fencing inside the topic table: a deposed owner's commit is refused by Delta itself.

A partition's owner holds a lease with an epoch (tables/ownership.py), but a lease is a promise
about time, and paused processes and skewed clocks break such promises. What keeps two owners
from both writing a partition is the topic table. Every commit that adds rows to partition p
records, as Delta application transactions in the same commit:

- `lakebroker.partition.<p>` = the partition's new log end (tables/delta.py),
- `lakebroker.owner.<p>` = the writer's epoch,
- `lakebroker.node.<node>.<p>` = the same log end, for the writing node.

A new owner's first act is a claim: a commit with no rows that records `owner.<p>` = its epoch.
delta-rs refuses a commit when any commit after its read snapshot wrote one of its application
ids ("Concurrent transaction"), whatever the versions, so the deposed owner's next commit, planned
on a snapshot from before the claim, fails in the table rather than by a check made before it.
delta-rs checks no order between versions, though: a writer that brings its snapshot up to date
must read `owner.<p>` again before committing on it (`deposed`), or it would commit over a claim.

The node's own end answers a restarted node's question "which of my WAL records are in the table":
those below `node.<node>.<p>`. The rest were never committed; if another node owns the partition
now, they go to it and get new offsets there.
"""

from __future__ import annotations

from collections.abc import Mapping

from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from lakebroker.tables import delta
from lakebroker.tables.errors import LakebrokerError
from lakebroker.tables.schemas import TOPIC_SCHEMA

Epochs = Mapping[int, int]  # partition -> epoch


class Deposed(LakebrokerError):
    """A partition's owner found a newer epoch in the table: another node owns it now."""

    status = 503  # retryable: the partition has another owner now
    code = "partition_moved"

    def __init__(self, message: str, newer: Mapping[int, int]) -> None:
        super().__init__(message)
        self.newer = dict(newer)  # partition -> the newer epoch found
        self.partitions = frozenset(newer)


def owner_app_id(partition: int) -> str:
    return f"lakebroker.owner.{partition}"


def node_app_id(node: str, partition: int) -> str:
    return f"lakebroker.node.{node}.{partition}"


def stored_epoch(table: DeltaTable, partition: int) -> int:
    """The epoch of the partition's newest claim or commit in this snapshot (0: never owned)."""
    return table.transaction_version(owner_app_id(partition)) or 0


def node_end(table: DeltaTable, node: str, partition: int) -> int | None:
    """The log end after the node's newest commit to the partition (None: it never committed one)."""
    return table.transaction_version(node_app_id(node, partition))


def deposed(table: DeltaTable, epochs: Epochs) -> set[int]:
    """The partitions whose epoch in this snapshot is not ours: another node claimed them (newer), or
    a writer that should have been fenced committed after our claim (older). After either, this
    node cannot tell its rows from another's, so it must stop writing. (0: never claimed, as for a
    table's only writer, tests and benchmarks, before its first commit.)"""
    return {p for p, epoch in epochs.items() if stored_epoch(table, p) not in (0, epoch)}


def commit_txns(node: str, epochs: Epochs, ends: Mapping[int, int]) -> dict[str, int]:
    """The application transactions of a commit that moves each partition's log end to `ends`."""
    txns: dict[str, int] = {}
    for p, end in ends.items():
        txns[delta.partition_app_id(p)] = end
        txns[owner_app_id(p)] = epochs[p]
        txns[node_app_id(node, p)] = end
    return txns


def claim(table: DeltaTable, epochs: Epochs, *, node: str) -> dict[int, int]:
    """Record `epochs` as the partitions' owner epochs in one commit with no rows; returns each
    partition's committed end in the snapshot the claim was made on (where the new owner goes on).

    Raises Deposed when the snapshot already holds an epoch at least as new (a newer owner claimed
    first), and CommitFailedError when a commit since the snapshot wrote one of the partitions: the
    caller loads the table again and claims again, so it never goes on from a stale end. Commits
    since the snapshot to other partitions (their owners flush every interval) wrote none of the
    claim's application ids: delta-rs lands the claim after them, and the ends stay true."""
    stored = {p: stored_epoch(table, p) for p in epochs}
    stale = {p: stored[p] for p, epoch in epochs.items() if stored[p] >= epoch}
    if stale:
        raise Deposed(f"partitions {sorted(stale)} were claimed at an epoch at least as new", stale)
    ends = {p: delta.committed_end(table, p) for p in epochs}
    # Not the node's end (node_end): that stays where the node's last commit left it. Its WAL may hold
    # messages it took before another owner's commits passed their offsets, appended again only after
    # this claim; until they are committed, a restart must not take them for rows already in the table.
    txns = [Transaction(owner_app_id(p), epoch) for p, epoch in epochs.items()]
    props = CommitProperties(
        app_transactions=txns,
        custom_metadata={"lakebroker.operation": "claim", "lakebroker.node": node},
        max_commit_retries=delta.COMMIT_REBASES,
    )
    write_deltalake(table, TOPIC_SCHEMA.empty_table(), mode="append",
                    commit_properties=props, post_commithook_properties=delta.commit_hooks(table))
    return ends
