"""Lost offsets: the `_system/lost_offsets` table.

A record in a WAL segment that fails its checksum can never be replayed. If it had not reached
Delta, its partition's table would have a hole there, and the flusher never commits past a hole,
so the partition stops. An operator moves it on with `lakebroker wal skip`: the loss is recorded
here first, then one commit to the topic table moves the partition's log end past the lost
offsets and names them in the table's `lakebroker.lostOffsets` property (tables/topics.py
`Holes`), which is how readers tell the recorded loss from damage. That commit is the partition
owner's, fenced by its epoch as a flush is (tables/fencing.py). A skip that crashed in between
is done again by the next `wal skip`, and `lost_offsets` returns its record once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from lakebroker.tables import delta, fencing
from lakebroker.tables.conflicts import retry_conflicts
from lakebroker.tables.errors import OffsetGap
from lakebroker.tables.layout import Layout
from lakebroker.tables.schemas import LOST_OFFSETS_PROPERTY, LOST_OFFSETS_SCHEMA, LOST_OFFSETS_SCHEMA_VERSION
from lakebroker.tables.topics import with_lost


@dataclass(frozen=True)
class LostOffsets:
    topic: str
    topic_id: str
    partition: int
    first_offset: int
    last_offset: int  # inclusive
    wal_damage: str  # which WAL bytes were unreadable: "<segment> bytes <start>-<end>", comma-separated
    skipped_at: datetime
    skipped_by: str

    @property
    def count(self) -> int:
        return self.last_offset - self.first_offset + 1


def record_loss(layout: Layout, loss: LostOffsets) -> None:
    table = delta.ensure_table(layout.lost_offsets_table, LOST_OFFSETS_SCHEMA, partition_by=None,
                               version=LOST_OFFSETS_SCHEMA_VERSION)
    row = {name: getattr(loss, name) for name in LOST_OFFSETS_SCHEMA.names}
    delta.append(table, pa.Table.from_pylist([row], schema=LOST_OFFSETS_SCHEMA),
                 metadata={"lakebroker.operation": "wal-skip"})


def skip_in_table(table: DeltaTable, topic: str, partition: int, first: int, last: int,
                  metadata: dict[str, str], *, node: str, epoch: int) -> int:
    """Move a partition's log end from `first` past `last` in one commit that names the range in
    the table's lost-offsets property; returns the new log end. Done already (a skip redone after
    a crash): nothing is committed. Raises OffsetGap if the log end is anywhere else.

    Fenced as the owner's flush is (tables/fencing.py): the commit records `epoch`, the partition's
    epoch as `node` owns it, and raises fencing.Deposed once another node has claimed the partition."""

    def once() -> int:
        if fencing.deposed(table, {partition: epoch}):
            raise fencing.Deposed(f"partition {partition} of {topic!r} has another owner: nothing skipped",
                                  {partition: fencing.stored_epoch(table, partition)})
        end = delta.committed_end(table, partition)
        if end > last:
            return end
        if end != first:
            raise OffsetGap(f"partition {partition} of {topic!r} ends at {end} in Delta, not at its first "
                            f"lost offset {first}: nothing skipped")
        config = table.metadata().configuration
        try:
            delta.set_properties(table, {LOST_OFFSETS_PROPERTY: with_lost(config, partition, first, last)},
                                 txns=fencing.commit_txns(node, {partition: epoch}, {partition: last + 1}),
                                 metadata={"lakebroker.operation": "wal-skip", **metadata})
        except CommitFailedError:
            # A commit since this snapshot won, perhaps a claim: decide again on the table as it is now.
            table.update_incremental()
            raise
        return last + 1

    return retry_conflicts(once, what=f"skipping lost offsets of partition {partition} of {topic!r}",
                           attempts=20, pause_s=0.05)


def lost_offsets(layout: Layout, *, topic: str | None = None) -> list[LostOffsets]:
    """Every recorded loss, oldest first; one recorded twice (a skip redone) is returned once."""
    table = delta.open_table(layout.lost_offsets_table)
    if table is None:
        return []
    seen: dict[tuple[str, int, int, int], LostOffsets] = {}
    for r in delta.read_rows(table, delta.matching({"topic": topic})).sort_by("skipped_at").to_pylist():
        loss = LostOffsets(**r)
        seen.setdefault((loss.topic_id, loss.partition, loss.first_offset, loss.last_offset), loss)
    return list(seen.values())
