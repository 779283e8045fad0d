"""Consumer-group offsets: the `_system/consumer_offsets` Delta table.

Rows are appended, never updated: each commit adds one row per partition whose offset
moved, with the reason (ack, seek, retention-skip, reset, start). A group's position is the newest row
per (group, topic, partition); the offsets-compaction job drops superseded rows. The
offset is the *next* offset to deliver, as in Kafka.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from tables import delta
from tables.layout import Layout
from tables.schemas import OFFSETS_SCHEMA, OFFSETS_SCHEMA_VERSION

GroupPartition = tuple[str, str, int]  # (group, topic, partition)


class OffsetReason(StrEnum):
    ACK = "ack"  # delivered or dead-lettered
    SEEK = "seek"  # moved by an operator
    RETENTION_SKIP = "retention-skip"  # retention deleted messages the group had not delivered
    START = "start"  # where a new group begins
    RESET = "reset"  # the group was past the log end (a restored or failed-over table): moved back to it


class OffsetsTable:
    def __init__(self, layout: Layout) -> None:
        self.uri = layout.offsets_table
        self._table: DeltaTable | None = None

    def _open(self) -> DeltaTable:
        if self._table is None:
            self._table = delta.ensure_table(self.uri, OFFSETS_SCHEMA, partition_by=None,
                                             version=OFFSETS_SCHEMA_VERSION)
        else:
            self._table.update_incremental()
        return self._table

    def commit(self, group: str, topic: str, offsets: Mapping[int, int], reason: OffsetReason) -> None:
        self.commit_many([(group, topic, p, o) for p, o in offsets.items()], reason)

    def commit_many(self, positions: list[tuple[str, str, int, int]], reason: OffsetReason) -> None:
        """One commit for many (group, topic, partition, offset): a worker commits all it owns at once."""
        if not positions:
            return
        now = datetime.now(UTC)
        ordered = sorted(positions)
        rows = pa.table(
            {
                "group": [g for g, _, _, _ in ordered],
                "topic": [t for _, t, _, _ in ordered],
                "partition": pa.array([p for _, _, p, _ in ordered], pa.int32()),
                "offset": pa.array([o for _, _, _, o in ordered], pa.int64()),
                "committed_at": pa.array([now] * len(ordered), pa.timestamp("us", tz="UTC")),
                "reason": [reason.value] * len(ordered),
            },
            schema=OFFSETS_SCHEMA,
        )
        delta.append(self._open(), rows, metadata={"lakebroker.operation": f"offsets-{reason.value}"})

    def latest(self, group: str | None = None) -> dict[GroupPartition, tuple[int, str]]:
        """The current offset and the reason it last moved, per (group, topic, partition)."""
        table = self._open()
        flt = None if group is None else pc.field("group") == group
        rows = table.to_pyarrow_dataset().to_table(filter=flt) if flt is not None else table.to_pyarrow_table()
        out: dict[GroupPartition, tuple[int, str, datetime]] = {}
        for r in rows.to_pylist():
            key = (r["group"], r["topic"], r["partition"])
            seen = out.get(key)
            if seen is None or r["committed_at"] >= seen[2]:
                out[key] = (r["offset"], r["reason"] or "", r["committed_at"])
        return {k: (v[0], v[1]) for k, v in out.items()}
