"""Reads a partition's committed messages from its topic table (blocking; run in a thread).

A worker's pipelines on one topic table share one log tail (`SharedLogTail`): an idle worker
then looks for new commits once per table per poll interval, not once per partition and
subscription (docs/decisions/0018-readers-follow-delta-logs-commit-by-commit.md).
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from lakebroker.tables import delta
from lakebroker.tables.filters import Filter
from lakebroker.tables.layout import Layout
from lakebroker.tables.log_start import check_dense, log_start
from lakebroker.tables.log_tail import TopicLogTail
from lakebroker.tables.schemas import TOPIC_SCHEMA
from lakebroker.tables.topics import Holes, TopicConfig

log = logging.getLogger(__name__)


def _ascending(offsets: pa.ChunkedArray) -> bool:
    """Whether the offsets already come in order (then the rows need no sorted copy)."""
    flat = offsets.combine_chunks()
    return len(flat) < 2 or bool(pc.all(pc.less(flat.slice(0, len(flat) - 1), flat.slice(1))).as_py())


class SharedLogTail:
    """One topic table's log tail, shared by the pipelines (threads) that read it: every use
    holds the lock, since a refresh rewrites the file index that reads walk (a read holds it
    only while it plans from the index)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._tail = TopicLogTail(uri)
        self._lock = threading.Lock()
        self.refreshed_at = -float("inf")  # time.monotonic() of the last refresh begun

    def committed_end(self, partition: int) -> int:
        """Catch up with the newest commit; the partition's committed end (0: no table or no rows yet)."""
        with self._lock:
            self.refreshed_at = time.monotonic()
            if self._tail.refresh() < 0:
                return 0
            return self._tail.committed_end(partition)

    def known_committed_end(self, partition: int, within_s: float) -> int | None:
        """The partition's committed end as of a refresh begun less than `within_s` ago, without I/O;
        None if the last refresh is older, if the answer would take I/O (no table yet, or a txn
        not read yet), or if another thread holds the tail."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._tail.version < 0 or time.monotonic() - self.refreshed_at >= within_s:
                return None
            return self._tail.known_committed_end(partition)
        finally:
            self._lock.release()

    def log_start(self, partition: int, committed_end: int) -> int:
        with self._lock:
            return log_start((f.min_offset for f in self._tail.files(partition)), committed_end)

    def holes(self) -> Holes:
        """Where the table, as of the last refresh, may legitimately lack offsets (tables.topics.Holes)."""
        with self._lock:
            return self._tail.holes

    def read(self, partition: int, start: int, end: int) -> pa.Table | None:
        """The tail's read (None: no table yet). Only planning it holds the tail: the files are
        read and decoded outside, while the other pipelines on the table keep polling."""
        with self._lock:
            if self._tail.version < 0:
                return None
            planned = self._tail.plan(partition, start, end)
        try:
            return planned.run()
        except FileNotFoundError:  # a file vacuumed after a rewrite we have not seen yet
            with self._lock:
                self._tail.refresh()
                planned = self._tail.plan(partition, start, end)
            return planned.run()


class LogTails:
    """A worker's shared tails, one per topic table (a re-created topic gets a new one)."""

    def __init__(self) -> None:
        self._tails: dict[tuple[str, str], SharedLogTail] = {}

    def get(self, uri: str, topic_id: str) -> SharedLogTail:
        key = (uri, topic_id)
        if key not in self._tails:
            self._tails[key] = SharedLogTail(uri)
        return self._tails[key]

    def retain(self, keys: set[tuple[str, str]]) -> None:
        """Forget the tails no running pipeline reads any more."""
        self._tails = {k: t for k, t in self._tails.items() if k in keys}


class PartitionSource:
    def __init__(self, layout: Layout, topic: TopicConfig, partition: int, tail: SharedLogTail | None = None, *,
                 keep: Filter | None = None, count_filtered: Callable[[int], None] = lambda n: None) -> None:
        """`keep`: the subscription's filter; the rows it passes over are counted by `count_filtered`
        and left out of what `read` returns, inside the range it covers (so they are committed past)."""
        self.uri = layout.topic_table(topic)
        self.topic = topic
        self.partition = partition
        self.tail = tail or SharedLogTail(self.uri)
        self._table: DeltaTable | None = None
        self.keep = keep
        self._count_filtered = count_filtered

    def committed_end(self) -> int:
        """Offsets below this are committed to the table (the flusher's txn version)."""
        return self.tail.committed_end(self.partition)

    def known_committed_end(self, within_s: float) -> int | None:
        """The committed end another pipeline on this table saw less than `within_s` ago, without I/O."""
        return self.tail.known_committed_end(self.partition, within_s)

    def log_start(self, committed_end: int) -> int:
        """The lowest offset still in the table (retention moves it up), as of the last refresh."""
        return self.tail.log_start(self.partition, committed_end)

    def read(self, start: int, end: int) -> tuple[list[dict[str, Any]], int]:
        """Rows with start <= offset < end in offset order (those the filter keeps), and the end of
        the range they cover.

        Key compaction makes holes, and so does a recorded WAL loss (the range the table's
        lost-offsets property names, read past here). In any other topic the rows stop at a hole,
        and a hole at `start` raises OffsetGap (retention's removals lie below the log start, which
        the pipeline moves to, with a retention-skip commit, before it reads)."""
        if start >= end:
            return [], start
        found = self._rows(start, end)
        if found is None:  # no table yet
            return [], start
        out, offsets = found
        holes = self.tail.holes()
        if holes.anywhere:
            covered = end
        elif holes.lost.get(self.partition):
            covered = self._past_lost(offsets, start, end, holes)
        else:
            dense = next((i for i, o in enumerate(offsets) if o != start + i), len(offsets))
            if dense == 0:  # a hole right at the start: the error to report (the rest waits behind it)
                check_dense(self.topic, self.partition, offsets, start, end)
            covered = start + dense  # up to the first hole, if any
        if out and out[-1]["offset"] >= covered:
            out = [r for r in out if r["offset"] < covered]
        if self.keep is not None and (passed := bisect.bisect_left(offsets, covered) - len(out)):
            self._count_filtered(passed)
        return out, covered

    def _rows(self, start: int, end: int) -> tuple[list[dict[str, Any]], list[int]] | None:
        """The rows in [start, end) that the filter keeps, as dicts in offset order, and the offsets
        of all the rows there (None: no table yet).

        The values are copied into Python one decoded chunk at a time (a row group's rows at most:
        tables/parquet_files.py), each chunk let go before the next, so a read of large values holds
        about one copy of them at once, not the decoded table, a sorted copy and every row's copy
        together. The rows own their values: none keeps the read's buffers alive, so what the
        read-ahead's byte bounds count is what it holds, whenever each row is done."""
        table = self.tail.read(self.partition, start, end)
        if table is None:
            return None
        if not _ascending(table.column("offset")):
            table = table.sort_by("offset")  # files read out of offset order
        offsets: list[int] = table.column("offset").to_pylist()
        if self.keep is not None:
            table = table.filter(self.keep.matches(table))
        index = table.schema.get_field_index("value")
        values = table.column(index).chunks
        out: list[dict[str, Any]] = table.set_column(index, "value", pa.nulls(table.num_rows, pa.binary())).to_pylist()
        del table  # the values' buffers are now held by `values` alone
        row = 0
        while values:
            for value in values.pop(0).to_pylist():
                out[row]["value"] = value
                row += 1
        return out, offsets

    def _past_lost(self, offsets: list[int], start: int, end: int, holes: Holes) -> int:
        """As `read`, where the partition has recorded lost offsets: the end of the range the rows
        cover, stepping over those."""
        covered = start
        for offset in offsets:
            covered = holes.past_lost(self.partition, covered)
            if offset != covered:
                break
            covered += 1
        else:
            covered = min(holes.past_lost(self.partition, covered), end)
        if covered == start:
            check_dense(self.topic, self.partition, offsets, start, end, holes)
        for first, last in holes.lost_between(self.partition, start, covered):
            log.warning("partition %d of %r: offsets %d-%d were lost to WAL damage and skipped by an operator "
                        "(_system/lost_offsets); moving past them", self.partition, self.topic.name, first, last)
        return covered

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
