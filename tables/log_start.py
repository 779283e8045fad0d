"""A partition's log-start offset: the lowest offset still in its topic table.

The one rule, for every reader (pull consume, subscriptions, delivery, retention, replication):
the lowest known offset of the partition's files; when retention emptied the partition, its log
end (the flusher's txn version). A file without statistics says nothing about its offsets, so it
does not count.

Files and log end must come from ONE snapshot. Mixed, a log end read after the files can count
rows the flusher committed in between as removed: retention would move groups past live messages.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from deltalake import DeltaTable

from lakebroker.tables import delta
from lakebroker.tables.errors import OffsetGap
from lakebroker.tables.topics import Holes, TopicConfig


def log_start(min_offsets: Iterable[int | None], committed_end: int) -> int:
    """The rule: `min_offsets` are the partition's files' lowest offsets, `committed_end` its committed end,
    both from the same snapshot."""
    lows = [int(low) for low in min_offsets if low is not None]
    return min(lows) if lows else committed_end


@dataclass(frozen=True)
class PartitionLog:
    """One partition as one snapshot saw it."""

    partition: int
    files: int
    rows: int
    size_bytes: int
    log_start: int
    committed_end: int


def partition_logs(table: DeltaTable, partitions: int) -> dict[int, PartitionLog]:
    """Every partition's files, log start and committed end, from the table object's one snapshot."""
    files = delta.partition_files(table)
    out = {}
    for p in range(partitions):
        found = files.get(p)
        end = delta.committed_end(table, p)
        start = log_start([None if found is None else found.min_offset], end)
        out[p] = PartitionLog(p, found.files if found else 0, found.rows if found else 0,
                              found.size_bytes if found else 0, start, end)
    return out


def log_starts(table: DeltaTable, partitions: int) -> dict[int, int]:
    """Every partition's log start, from the table object's one snapshot."""
    return {p: log.log_start for p, log in partition_logs(table, partitions).items()}


def check_dense(topic: TopicConfig, partition: int, offsets: list[int], start: int, end: int,
                holes: Holes | None = None) -> None:
    """Raise OffsetGap unless `offsets` (sorted) are exactly start..end-1, but for the lost ranges
    `holes` names: a topic that is not key-compacted has no other holes between its log start and
    its log end."""
    if offsets == list(range(start, end)):
        return
    lost = {o for first, last in (holes.lost_between(partition, start, end) if holes else ()) for o in
            range(first, last + 1)}
    if lost and offsets == sorted(set(range(start, end)) - lost):
        return
    missing = sorted(set(range(start, end)) - set(offsets) - lost)
    what = f"is missing offsets {missing[0]}-{missing[-1]}" if missing else "holds an offset twice"
    raise OffsetGap(
        f"partition {partition} of {topic.name!r} {what} in {start}-{end - 1}, below its committed end, "
        "and the table was never key-compacted: the table is damaged (restore it or fail over to a replica)"
    )
