"""Reads a partition's committed messages from its topic table (blocking; run in a thread)."""

from __future__ import annotations

from typing import Any

import pyarrow.compute as pc
from deltalake import DeltaTable

from tables import delta
from tables.layout import Layout
from tables.log_start import check_dense, log_start
from tables.log_tail import TopicLogTail
from tables.schemas import TOPIC_SCHEMA
from tables.topics import TopicConfig


class PartitionSource:
    def __init__(self, layout: Layout, topic: TopicConfig, partition: int) -> None:
        self.uri = layout.topic_table(topic.name)
        self.topic = topic
        self.partition = partition
        self._tail = TopicLogTail(self.uri)
        self._table: DeltaTable | None = None

    def log_end(self) -> int:
        """Offsets below this are committed to the table (the flusher's txn version)."""
        if self._tail.refresh() < 0:
            return 0
        return self._tail.txn(delta.partition_app_id(self.partition)) or 0

    def log_start(self, log_end: int) -> int:
        """The lowest offset still in the table (retention moves it up), as of the last refresh."""
        return log_start((f.min_offset for f in self._tail.files(self.partition)), log_end)

    def read(self, start: int, end: int) -> tuple[list[dict[str, Any]], int]:
        """Rows with start <= offset < end in offset order, and the end of the range they cover.

        Only key compaction makes holes. In any other topic the rows stop at a hole, and a hole at
        `start` raises OffsetGap (retention's removals lie below the log start, which the pipeline
        moves to, with a retention-skip commit, before it reads)."""
        if start >= end or self._tail.version < 0:
            return [], start
        try:
            rows = self._tail.read(self.partition, start, end)
        except FileNotFoundError:  # a file vacuumed after a rewrite we have not seen yet
            self._tail.refresh()
            rows = self._tail.read(self.partition, start, end)
        out: list[dict[str, Any]] = rows.sort_by("offset").to_pylist()
        if self.topic.may_have_holes:
            return out, end
        dense = next((i for i, r in enumerate(out) if r["offset"] != start + i), len(out))
        if dense == 0:  # a hole right at the start: the error to report (the rest waits behind it)
            check_dense(self.topic, self.partition, [r["offset"] for r in out], start, end)
        return out[:dense], start + dense  # up to the first hole, if any

    def read_offsets(self, offsets: list[int]) -> list[dict[str, Any]]:
        """Scattered offsets (dead-letter replays): rare, so the full delta-rs read is fine."""
        if self._table is None:
            self._table = delta.open_table(self.uri)
        else:
            self._table.update_incremental()
        table = self._table
        if table is None or not offsets:
            return []
        rows = delta.read_rows(
            table, (pc.field("partition") == self.partition) & pc.field("offset").isin(offsets),
            columns=TOPIC_SCHEMA.names,
        ).sort_by("offset")
        out: list[dict[str, Any]] = rows.to_pylist()
        return out
