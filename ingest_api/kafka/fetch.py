"""What a Kafka consumer's Fetch reads: a partition's committed rows from its topic table, followed
commit by commit (tables/log_tail.py, as delivery reads them), as one record batch.

The records a Fetch returns are the partition's committed ones: up to its committed end, which is
the high watermark the answer gives (a message acknowledged at `ack=wal` becomes visible once the
flusher commits it, within `flush_interval_ms`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from lakebroker.ingest_api.kafka import record_batches
from lakebroker.tables.layout import Layout
from lakebroker.tables.log_tail import TopicLogTail
from lakebroker.tables.topics import TopicConfig

# Rows read per partition and Fetch at most, before `partition_max_bytes` cuts them.
MAX_ROWS = 10_000


@dataclass(frozen=True, slots=True)
class Read:
    records: bytes  # one record batch; empty when the partition has nothing from the offset on
    log_start: int


class TopicReads:
    """One followed log per topic table, shared by every connection. Blocking: run in a thread."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._tails: dict[str, tuple[TopicLogTail, threading.Lock]] = {}
        self._lock = threading.Lock()

    def read(self, topic: TopicConfig, partition: int, offset: int, end: int, max_bytes: int,
             leader_epoch: int) -> Read:
        """The rows at `offset` and after, below `end` (the committed end), as a batch of about
        `max_bytes` at most, but always whole and at least one row (Kafka's KIP-74: a consumer
        makes progress past a record larger than its limit)."""
        tail, lock = self._tail(topic)
        rows_wanted = max(1, min(MAX_ROWS, max_bytes // 16))
        with lock:
            tail.refresh()
            start = self._log_start(tail, partition, end)
            if offset < start or offset >= end:
                return Read(b"", start)
            plan = tail.plan(partition, offset, min(end, offset + rows_wanted))
            rest = tail.plan(partition, offset, end)
        rows = plan.run()
        if rows.num_rows == 0:  # a run of compacted-away offsets: read on to the next row there is
            rows = rest.run()
        if rows.num_rows == 0:
            return Read(b"", start)
        rows = rows.sort_by("offset")
        return Read(record_batches.encode(_within(rows, max_bytes), leader_epoch), start)

    def log_start(self, topic: TopicConfig, partition: int, end: int) -> int:
        tail, lock = self._tail(topic)
        with lock:
            tail.refresh()
            return self._log_start(tail, partition, end)

    def forget(self, topic_id: str) -> None:
        with self._lock:
            self._tails.pop(topic_id, None)

    def _tail(self, topic: TopicConfig) -> tuple[TopicLogTail, threading.Lock]:
        with self._lock:
            found = self._tails.get(topic.topic_id)
            if found is None:
                found = self._tails[topic.topic_id] = (TopicLogTail(self.layout.topic_table(topic)), threading.Lock())
            return found

    @staticmethod
    def _log_start(tail: TopicLogTail, partition: int, end: int) -> int:
        """The lowest offset of the partition's live files (retention removes whole files); its
        committed end when it has none."""
        starts = [0 if f.min_offset is None else f.min_offset for f in tail.files(partition)]
        return min(min(starts, default=end), end)


def _within(rows: pa.Table, max_bytes: int) -> pa.Table:
    """The first rows whose keys and values add up to `max_bytes`, and at least one."""
    sizes = pc.add(pc.fill_null(pc.binary_length(rows.column("value")), 0),
                           pc.fill_null(pc.utf8_length(rows.column("key")), 0))
    running = pc.cumulative_sum(sizes).to_numpy()
    keep = max(1, int((running <= max_bytes).sum()))
    return rows.slice(0, keep)
