"""Producer sequences: the highest sequence each producer has made durable in each partition.

A batch whose messages carry `producer_id` and `sequence` as Arrow columns takes on the contract
of Kafka's idempotent producer: a producer's sequences increase in each partition it writes, with
one request in flight per producer and partition (a Spark task sending its rows in order, say).
A message whose sequence is at or below its producer's highest one in its partition is then a
retry, answered as a duplicate, even once its own id has left the dedup index, which is bounded
by count: a re-run of a write of any size within the dedup window stores nothing twice, for one
entry per producer and partition rather than one per message.

The marks are rebuilt at start from the WAL and the tables (`dedup_rebuild`), and learnt from the
table when a node takes a partition over (`dedup_rebuild.sequence_marks`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from lakebroker.ingest_api.chunks import Chunk

MarkKey = tuple[str, int, str]  # topic id, partition, producer id
MAX_PRODUCERS = 1_000_000  # marks kept (the oldest go first): ~200 bytes each


class SequenceMarks:
    def __init__(self, window_s: float, max_producers: int = MAX_PRODUCERS) -> None:
        self.window_s = window_s
        self.max_producers = max_producers
        self._marks: dict[MarkKey, tuple[int, float]] = {}  # -> (highest sequence, when it was raised: epoch s)

    def __len__(self) -> int:
        return len(self._marks)

    def covers(self, key: MarkKey, sequence: int) -> bool:
        """Whether `sequence` is at or below the producer's mark in the partition (within the window)."""
        mark = self._marks.get(key)
        return mark is not None and sequence <= mark[0] and mark[1] >= time.time() - self.window_s

    def raise_to(self, key: MarkKey, sequence: int, at_s: float | None = None) -> None:
        at_s = time.time() if at_s is None else at_s
        mark = self._marks.pop(key, None)  # re-inserted: the dict's order is the marks' age
        self._marks[key] = (sequence if mark is None else max(mark[0], sequence), max(at_s, mark[1] if mark else 0.0))
        if len(self._marks) > self.max_producers:
            del self._marks[next(iter(self._marks))]

    def raise_all(self, marks: Iterable[tuple[MarkKey, int, float]]) -> None:
        for key, sequence, at_s in marks:
            self.raise_to(key, sequence, at_s)

    def forget_topic(self, topic_id: str) -> None:
        for key in [k for k in self._marks if k[0] == topic_id]:
            del self._marks[key]


def marks_of(topic_id: str, rows: pa.Table) -> list[tuple[MarkKey, int, float]]:
    """The marks rows hold (`partition`, `producer_id`, `sequence`, and `timestamp` in epoch µs as
    int64): each producer's highest sequence per partition, and when it was stored."""
    rows = rows.filter(pc.and_(pc.is_valid(rows["producer_id"]), pc.is_valid(rows["sequence"])))
    if not rows.num_rows:
        return []
    grouped = rows.group_by(["partition", "producer_id"]).aggregate([("sequence", "max"), ("timestamp", "max")])
    return [((topic_id, p, producer), sequence, ts / 1e6) for p, producer, sequence, ts in zip(
        grouped["partition"].to_pylist(), grouped["producer_id"].to_pylist(), grouped["sequence_max"].to_pylist(),
        grouped["timestamp_max"].to_pylist(), strict=True)]


def chunk_marks(chunk: Chunk) -> list[tuple[MarkKey, int, float]]:
    """The marks a WAL chunk holds (none if its messages carry no producer id)."""
    columns = chunk.columns
    if columns["producer_id"].null_count == chunk.rows:
        return []
    n = chunk.rows
    rows = pa.table({"partition": pa.repeat(pa.scalar(chunk.partition, pa.int32()), n),
                     "producer_id": columns["producer_id"], "sequence": columns["sequence"],
                     "timestamp": pa.repeat(pa.scalar(chunk.timestamp_us, pa.int64()), n)})
    return marks_of(chunk.topic_id.hex(), rows)
