"""What a maintenance job will do to a table, decided from the Delta log alone (no data read, no Spark).

Every data file of a topic table holds a contiguous, ascending range of one partition's offsets:
the flusher appends each batch as its own file, and compaction only ever merges *adjacent* files
(sorted by offset). So a partition's files, ordered by their lowest offset, are disjoint ranges.
That invariant is what makes both plans here cheap and exact:

* compaction bins adjacent small files, so compacted files keep disjoint ranges and an offset-range
  read still prunes to the files that hold it;
* retention removes a *prefix* of files, so a partition's log-start offset only moves forward and
  never leaves a hole, and an expired file is dropped whole, without reading or rewriting it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from lakebroker.tables.log_start import log_start

# A file below this fraction of the target size is "small": worth merging with its neighbours.
SMALL_FRACTION = 0.75
# Delta (Spark and delta-rs) truncates timestamp statistics to milliseconds: the true maximum of
# a file may lie up to 999 µs after its recorded maximum.
STATS_TIMESTAMP_SLACK_US = 999


def _stat_time_us(value: Any) -> int | None:
    if value is None:
        return None
    moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return int(moment.timestamp()) * 1_000_000 + moment.microsecond


def _stat_int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return int(value)
    try:
        return int(value)
    except ValueError:
        return _stat_time_us(value)


@dataclass(frozen=True)
class FileEntry:
    """One `add` action of a snapshot: a data file and its statistics."""

    path: str
    partition: int | None
    size: int
    rows: int | None
    min_values: Mapping[str, Any] = field(default_factory=dict)
    max_values: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_add(cls, path: str, partition_values: Mapping[str, str | None] | None, size: int,
                 stats: str | None) -> FileEntry:
        parsed: dict[str, Any] = json.loads(stats) if stats else {}
        raw = (partition_values or {}).get("partition")
        return cls(path=path, partition=None if raw is None else int(raw), size=int(size),
                   rows=parsed.get("numRecords"), min_values=parsed.get("minValues") or {},
                   max_values=parsed.get("maxValues") or {})

    def min_int(self, column: str) -> int | None:
        """The column's lowest value as an int (timestamps as epoch microseconds)."""
        return _stat_int(self.min_values.get(column))

    def max_int(self, column: str) -> int | None:
        return _stat_int(self.max_values.get(column))

    @property
    def min_offset(self) -> int | None:
        return self.min_int("offset")

    @property
    def max_offset(self) -> int | None:
        return self.max_int("offset")

    def min_time_us(self, column: str = "timestamp") -> int | None:
        return _stat_time_us(self.min_values.get(column))

    def max_time_us(self, column: str = "timestamp") -> int | None:
        """An upper bound of the column's true maximum (the statistic plus its truncation)."""
        value = _stat_time_us(self.max_values.get(column))
        return None if value is None else value + STATS_TIMESTAMP_SLACK_US


def by_partition(files: Iterable[FileEntry]) -> dict[int | None, list[FileEntry]]:
    out: dict[int | None, list[FileEntry]] = {}
    for f in files:
        out.setdefault(f.partition, []).append(f)
    return out


# -- compaction ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bin:
    files: tuple[FileEntry, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def rows(self) -> int:
        return sum(f.rows or 0 for f in self.files)


def plan_bins(files: Iterable[FileEntry], *, target_bytes: int, min_files: int, order_column: str) -> list[Bin]:
    """Group *adjacent* small files (in `order_column` order) into bins of at most `target_bytes`.

    A file of at least SMALL_FRACTION of the target is left as it is and separates bins, so a bin
    never spans it and the rewritten files keep disjoint, ascending ranges. Files without
    statistics for the order column are left alone. Only bins of `min_files` or more files are
    worth rewriting.
    """
    ordered = sorted((f for f in files if f.min_int(order_column) is not None),
                     key=lambda f: (f.min_int(order_column), f.path))
    small_limit = target_bytes * SMALL_FRACTION
    bins: list[Bin] = []
    current: list[FileEntry] = []
    current_size = 0

    def close() -> None:
        nonlocal current, current_size
        if len(current) >= min_files:
            bins.append(Bin(tuple(current)))
        current, current_size = [], 0

    for f in ordered:
        if f.size >= small_limit:
            close()
            continue
        if current and current_size + f.size > target_bytes:
            close()
        current.append(f)
        current_size += f.size
    close()
    return bins


# -- retention -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PartitionRetention:
    """What retention does to one partition."""

    partition: int
    drop: tuple[FileEntry, ...]  # whole files, a prefix of the partition in offset order
    keep: tuple[FileEntry, ...]
    trim: FileEntry | None  # the first kept file, when it straddles the time cutoff and trimming is on
    reason: str  # time | size | time+size | none

    @property
    def rows_dropped(self) -> int:
        return sum(f.rows or 0 for f in self.drop)

    @property
    def bytes_dropped(self) -> int:
        return sum(f.size for f in self.drop)

    def log_start(self, committed_end: int) -> int:
        """The partition's lowest offset after the whole-file drops (committed_end when none remain)."""
        return log_start((f.min_offset for f in self.keep), committed_end)


def plan_retention(partition: int, files: Iterable[FileEntry], *, now_us: int, retention_ms: int | None,
                   retention_bytes: int | None, trim_partial: bool) -> PartitionRetention:
    """Kafka's rules, applied to files as Kafka applies them to segments.

    In offset order, the oldest file is removed while its newest row is older than `retention_ms`
    (time), or while the partition would still hold at least `retention_bytes` without it (size).
    The first file that meets neither rule stops the walk, so removal is always a prefix.
    A file lacking statistics stops the walk too: nothing is removed on a guess.
    """
    ordered = sorted(files, key=lambda f: (f.min_offset if f.min_offset is not None else 2**63, f.path))
    cutoff_us = None if retention_ms is None else now_us - retention_ms * 1000
    total = sum(f.size for f in ordered)
    drop: list[FileEntry] = []
    reasons: set[str] = set()
    for f in ordered:
        if f.min_offset is None or f.max_offset is None:
            break
        newest = f.max_time_us()
        by_time = cutoff_us is not None and newest is not None and newest < cutoff_us
        by_size = retention_bytes is not None and total - f.size >= retention_bytes
        if not (by_time or by_size):
            break
        drop.append(f)
        total -= f.size
        reasons.update(r for r, hit in (("time", by_time), ("size", by_size)) if hit)
    keep = ordered[len(drop):]
    trim = None
    if trim_partial and cutoff_us is not None and keep:
        first = keep[0]
        oldest = first.min_time_us()
        if first.min_offset is not None and oldest is not None and oldest < cutoff_us:
            trim = first
            reasons.add("time")
    reason = "+".join(sorted(reasons)) or "none"
    return PartitionRetention(partition, tuple(drop), tuple(keep), trim, reason)


def plan_log_start(partition: int, files: Iterable[FileEntry], log_start: int) -> PartitionRetention:
    """Advance a partition to a given log-start offset (how a replica follows its primary).

    Files entirely below `log_start` are dropped whole; the one file that straddles it is trimmed.
    """
    ordered = sorted(files, key=lambda f: (f.min_offset if f.min_offset is not None else 2**63, f.path))
    drop = [f for f in ordered if f.max_offset is not None and f.max_offset < log_start]
    keep = [f for f in ordered if f not in drop]
    straddling = [f for f in keep if f.min_offset is not None and f.min_offset < log_start]
    return PartitionRetention(partition, tuple(drop), tuple(keep), straddling[0] if straddling else None,
                              "primary" if drop or straddling else "none")
