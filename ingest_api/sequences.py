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

A Kafka producer's sequences in a partition follow on with no gap, and its runs are checked for
that (`next_expected`): a run that starts past the next sequence is refused as out of order, as
Kafka's brokers refuse it, until the runs before it have landed. Taken as it came, it would raise
the mark past them, and a run delayed behind it (appended again by the partition's former owner
after a failover, say) would be answered as a retry and never stored.

Kafka's sequences wrap to 0 past 2^31 - 1 (a producer sending 10,000 records a second to a
partition wraps in under three days); the marks count on past it, so a Kafka run's sequences are
read as the count nearest its producer's next one (`ColumnarProduce._follow_on`), and stored so.

A request whose rows in a partition are one producer's consecutive sequences (a Kafka record
batch, always) is a run, and is deduplicated as one: each producer and partition keeps its last
few runs and where they were stored (`Runs`), as Kafka's brokers keep a producer's last five
batches, so a retried run is answered with its original offsets, and a run in flight is waited
for, for one entry per request rather than one dedup id per message.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakebroker.ingest_api.chunks import Chunk
from lakebroker.tables.errors import InvalidRequest

MarkKey = tuple[str, int, str]  # topic id, partition, producer id
KAFKA_SEQUENCES = 2**31  # a Kafka producer's sequences are int32: past 2^31 - 1 they wrap to 0
MAX_PRODUCERS = 1_000_000  # marks kept (the oldest go first): ~200 bytes each
RECENT_RUNS = 8  # settled runs kept per producer and partition (Kafka keeps 5 batches)
# A stored piece of a run: its first sequence, that message's offset, its count, its log-append time (µs)
Segment = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class RunPlacement:
    """Where a run was stored: one segment per chunk of it (a run's chunks keep their order, but
    other requests' single messages may be placed between them)."""

    segments: tuple[Segment, ...]

    @property
    def timestamp_us(self) -> int:
        return self.segments[-1][3]

    def placed(self, first: int, last: int) -> tuple[np.ndarray, np.ndarray]:
        """The offset and log-append time of each sequence from `first` to `last`, which the run holds."""
        offsets: list[np.ndarray] = []
        times: list[np.ndarray] = []
        for start, offset, count, timestamp_us in self.segments:
            lo, hi = max(first, start), min(last, start + count - 1)
            if lo <= hi:
                offsets.append(np.arange(offset + lo - start, offset + hi - start + 1, dtype=np.int64))
                times.append(np.full(hi - lo + 1, timestamp_us, np.int64))
        return np.concatenate(offsets), np.concatenate(times)


@dataclass(slots=True)
class _Run:
    first: int
    last: int
    placed: RunPlacement | asyncio.Future[RunPlacement]


class OutOfOrderSequence(InvalidRequest):
    """Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER: a producer's run starts past its next sequence in the
    partition. Retriable: the client sends it again once the runs before it are answered."""

    status = 409
    code = "out_of_order_sequence"

    def __init__(self, message: str, partition: int) -> None:
        super().__init__(message)
        self.partition = partition


class Found(enum.Enum):
    NEW = "new"  # none of the sequences is known
    # Neither new nor within one known run: the per-message path sorts it out, once the producer's
    # runs in flight have settled
    OVERLAP = "overlap"


class SequenceMarks:
    def __init__(self, window_s: float, max_producers: int = MAX_PRODUCERS) -> None:
        self.window_s = window_s
        self.max_producers = max_producers
        self._marks: dict[MarkKey, tuple[int, float]] = {}  # -> (highest sequence, when it was raised: epoch s)
        self._runs: dict[MarkKey, list[_Run]] = {}  # runs in flight, and the last RECENT_RUNS settled

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
            oldest = next(iter(self._marks))
            del self._marks[oldest]
            if oldest in self._runs:  # runs in flight stay: a retry of one must still find it
                flying = [r for r in self._runs[oldest] if isinstance(r.placed, asyncio.Future)]
                if flying:
                    self._runs[oldest] = flying
                else:
                    del self._runs[oldest]

    def raise_all(self, marks: Iterable[tuple[MarkKey, int, float]]) -> None:
        for key, sequence, at_s in marks:
            self.raise_to(key, sequence, at_s)

    def forget_topic(self, topic_id: str) -> None:
        for key in [k for k in self._marks if k[0] == topic_id]:
            del self._marks[key]
        for key in [k for k in self._runs if k[0] == topic_id]:
            del self._runs[key]

    def find_run(self, key: MarkKey, first: int, last: int) -> Found | RunPlacement | asyncio.Future[RunPlacement]:
        """What the producer's sequences `first`..`last` in the partition are: new, a retry of a
        known run (where it was stored, or its future while in flight), or an overlap."""
        runs = self._runs.get(key, ())
        for run in runs:
            if run.first <= first and last <= run.last:
                if isinstance(run.placed, RunPlacement) and not self.covers(key, last):
                    break  # outside the window: as if forgotten
                return run.placed
        crossing = [r for r in runs if r.first <= last and first <= r.last]
        if crossing or self.covers(key, first) or self.covers(key, last):
            return Found.OVERLAP
        return Found.NEW

    def next_expected(self, key: MarkKey) -> int | None:
        """The sequence the producer's next run in the partition starts at: one past the highest it
        has stored (within the window) or has on its way; None for a producer not known here."""
        highest = [r.last for r in self._runs.get(key, ()) if isinstance(r.placed, asyncio.Future)]
        mark = self._marks.get(key)
        if mark is not None and mark[1] >= time.time() - self.window_s:
            highest.append(mark[0])
        return max(highest) + 1 if highest else None

    def in_flight(self, key: MarkKey) -> list[asyncio.Future[RunPlacement]]:
        return [r.placed for r in self._runs.get(key, ()) if isinstance(r.placed, asyncio.Future)]

    def begin_run(self, key: MarkKey, first: int, last: int, placed: asyncio.Future[RunPlacement]) -> None:
        """A new run is on its way: a retry of it waits for `placed`; once stored, the mark rises to
        `last` and the run is kept; if it failed, it is forgotten, so a retry stores it."""
        run = _Run(first, last, placed)
        self._runs.setdefault(key, []).append(run)

        def settled(future: asyncio.Future[RunPlacement]) -> None:
            runs = self._runs.get(key)
            if runs is None or run not in runs:
                return  # the topic or the mark has gone meanwhile
            if future.cancelled() or future.exception() is not None:
                runs.remove(run)
                return
            run.placed = placement = future.result()
            self.raise_to(key, last, placement.timestamp_us / 1e6)
            done = [r for r in runs if isinstance(r.placed, RunPlacement)]
            for old in done[:-RECENT_RUNS]:
                runs.remove(old)

        placed.add_done_callback(settled)


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
