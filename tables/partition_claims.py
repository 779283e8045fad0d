"""A node's claim of partitions in their topic's table (tables/fencing.py), as its heartbeat gave them.

Claims run on a fresh snapshot, again after a concurrent commit, and never bring back a table that
was deleted before or while they ran: a node that has not yet seen a delete must not."""

from __future__ import annotations

from collections.abc import Mapping

from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from lakebroker.tables import delta, fencing
from lakebroker.tables.conflicts import retry_conflicts
from lakebroker.tables.topics import TopicConfig, TopicGone, TopicStore

Claimed = dict[int, tuple[int, int | None]]  # partition -> (claimed end, this node's own end before)


def claim_partitions(store: TopicStore, topic: TopicConfig, epochs: Mapping[int, int], *,
                     node: str) -> tuple[Claimed, DeltaTable]:
    """Claim `epochs` (partition -> epoch) for `node`: each partition's claimed end and the node's
    end before the claim, with the table as the claim left it (it holds every row below the ends).
    TopicGone if the topic was deleted, before or while it claimed. Deposed if the table holds a
    newer epoch; CommitFailedError if claims kept racing other commits."""

    def once() -> tuple[Claimed, DeltaTable]:
        table = store.live_table(topic)
        before = {p: fencing.node_end(table, node, p) for p in epochs}
        # No claim where the table holds this epoch already (this node held the partition last) or
        # where there can be no earlier owner to fence (a partition's first epoch, never claimed).
        stored = {p: fencing.stored_epoch(table, p) for p in epochs}
        kept = {p for p, epoch in epochs.items() if stored[p] == epoch or (stored[p] == 0 and epoch == 1)}
        ends = {p: delta.committed_end(table, p) for p in kept}
        if len(kept) < len(epochs):
            ends.update(fencing.claim(table, {p: e for p, e in epochs.items() if p not in kept}, node=node))
        return {p: (ends[p], before[p]) for p in epochs}, table

    claimed = retry_conflicts(once, what=f"claiming partitions of {topic.name}", attempts=20, pause_s=0.05,
                              conflicts=(CommitFailedError,))
    if store.remove_if_deleted(topic):  # a delete that removed the table as this claim wrote to it
        raise TopicGone(f"topic {topic.name!r} was deleted while this node claimed its partitions")
    return claimed
