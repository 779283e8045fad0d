"""The dedup index's rebuild at start: every id placed within the window, oldest first, from the
topic tables and the WAL, so a retry after a restart still gets its original answer.

Exact age order in bounded memory. A first pass reads only the log-append times of the rows that
carry an id (8 bytes an id), which fix the oldest time still within max_entries and cut the rest
into time ranges of about RANGE_IDS ids. Each range is then read on its own (file and row-group
statistics prune the other files), its ids hashed, sorted by time and remembered. Holding all ids
at once, even as Arrow columns of numbers, would cost tens of bytes an id plus the scan's buffers
(docs/decisions/0015-dedup-index-as-fixed-width-hashes.md).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from lakebroker.ingest_api.chunks import Chunk
from lakebroker.ingest_api.dedup import DedupIndex, dedup_ids, key_hashes
from lakebroker.ingest_api.hand_off import identified
from lakebroker.ingest_api.records import Record
from lakebroker.ingest_api.sequences import MarkKey, SequenceMarks, chunk_marks, marks_of
from lakebroker.ingest_api.wal import PartitionKey
from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from lakebroker.tables.topics import TopicConfig

RANGE_IDS = 262_144  # ids a time range holds (more where many share one time: a batch's chunk)
_SLICE = 65_536  # ids made Python objects at a time
_PLACED = pa.schema([("timestamp", pa.int64()), ("hash0", pa.int64()), ("hash1", pa.int64()),
                     ("partition", pa.int32()), ("offset", pa.int64())])  # an id at its key's hash (dedup.key_hash)
_ID_COLUMNS = ["partition", "offset", "timestamp", "message_id", "producer_id", "sequence"]
# Files read at once by a scan: on an object store each small file is a few requests, one after
# another. Memory grows by a record batch of the id columns per file.
LEARN_FILES_AT_ONCE = 8  # a takeover's scan: a few partitions' rows of the window, in small files
REBUILD_FILES_AT_ONCE = 4  # the rebuild at start: every table's rows of the window
Arrow: TypeAlias = pa.Array | pa.ChunkedArray


@dataclass(frozen=True)
class _Source:
    topic_id: str
    table: DeltaTable


def rebuild(index: DedupIndex, layout: Layout, topics: Sequence[TopicConfig], wal_records: list[Record],
            wal_chunks: list[Chunk], committed: Mapping[PartitionKey, int], *, window_s: float,
            unreadable: Collection[str] = (), marks: SequenceMarks | None = None) -> int:
    """Remember in `index` the ids placed within the window; returns how many. `committed` holds
    each partition's log end in its table: WAL items below it are read from the table. The tables
    of `unreadable` topic ids are not read (their ids are learnt when their partitions are claimed).
    `marks` learns each producer's highest sequence per partition within the window."""
    horizon_us = int((time.time() - window_s) * 1_000_000)
    sources = [_Source(t.topic_id, table) for t in topics if t.topic_id not in unreadable
               and (table := delta.open_table(layout.topic_table(t))) is not None]
    live = {bytes.fromhex(t.topic_id) for t in topics}
    if marks is not None:
        for source in sources:
            marks.raise_all(sequence_marks(source.topic_id, source.table, horizon_us))
        for chunk in wal_chunks:
            if chunk.topic_id in live and chunk.timestamp_us >= horizon_us:
                marks.raise_all(chunk_marks(chunk))
    wal = _wal_ids(wal_records, wal_chunks, committed, live, horizon_us)  # held in memory by recovery anyway
    stamps = np.concatenate([wal["timestamp"].to_numpy(), *(_times(s.table, horizon_us) for s in sources)])
    if not len(stamps):
        return 0
    stamps.sort()
    kept = stamps[max(0, len(stamps) - index.max_entries):]  # the newest max_entries: older ones would go
    starts = np.unique(kept[::RANGE_IDS]).tolist()
    del stamps, kept
    arrow = pa.default_memory_pool()
    for lo, hi in zip(starts, [*starts[1:], None], strict=True):
        ids = pa.concat_tables([_between(wal, lo, hi), *(_table_ids(s, lo, hi) for s in sources)])
        ordered = ids.take(pc.sort_indices(ids["timestamp"]))
        for start in range(0, ordered.num_rows, _SLICE):
            restore(index, ordered.slice(start, _SLICE))
        del ids, ordered
        arrow.release_unused()  # the range's buffers go back before the next range is read
    return len(index)


def restore(index: DedupIndex, placed: pa.Table) -> None:
    """Remember ids as `_PLACED` rows hold them, in row order (oldest first)."""
    columns = (c.to_pylist() for c in placed.columns)
    for ts, h0, h1, partition, offset in zip(*columns, strict=True):
        index.restore(h0, h1, (partition, offset, ts))


def placed_by_others(layout: Layout, topic: TopicConfig, ranges: Mapping[int, tuple[int, int]], *,
                     window_s: float, marks: SequenceMarks | None = None, table: DeltaTable | None = None) -> pa.Table:
    """The ids within the window at partition -> [start, end) offsets of a topic table, oldest first,
    as `_PLACED`: what other nodes placed in partitions this node takes over, so that a retry of a
    message the old owner acknowledged gets its first answer here too. `marks` learns those rows'
    producer sequences. `table`: a snapshot that holds every row below the ends (else it is loaded)."""
    wanted = {p: r for p, r in ranges.items() if r[0] < r[1]}
    if not wanted:
        return _PLACED.empty_table()
    if table is None:
        try:
            table = delta.open_table(layout.topic_table(topic))
        except TableNotFoundError:  # the topic deleted and made again meanwhile: a new table, no rows of others
            return _PLACED.empty_table()
    if table is None:
        return _PLACED.empty_table()
    where: pc.Expression | None = None
    for p, (start, end) in wanted.items():
        one = (pc.field("partition") == p) & (pc.field("offset") >= start) & (pc.field("offset") < end)
        where = one if where is None else where | one
    assert where is not None
    horizon_us = int((time.time() - window_s) * 1_000_000)
    # One scan for the ids and the marks, several files at a time: the partitions stay closed until
    # it ends, and on an object store each small file is a few requests.
    highest: dict[MarkKey, tuple[int, float]] = {}
    ids = []
    for b in delta.read_batches(table, (pc.field("timestamp") >= delta.timestamp_literal(horizon_us)) & _has_id()
                                & where, _ID_COLUMNS, files_at_once=LEARN_FILES_AT_ONCE):
        ids.append(_batch_ids(topic.topic_id, b))
        if marks is not None:
            _fold_marks(highest, topic.topic_id, b)
    if marks is not None:
        marks.raise_all([(key, sequence, at_s) for key, (sequence, at_s) in highest.items()])
    placed = pa.concat_tables(ids) if ids else _PLACED.empty_table()
    return placed.take(pc.sort_indices(placed["timestamp"]))


def sequence_marks(topic_id: str, table: DeltaTable, since_us: int) -> list[tuple[MarkKey, int, float]]:
    """Each producer's highest sequence per partition among a table's rows from `since_us` on, a
    record batch at a time: one entry per producer and partition in memory, not per row."""
    where = (pc.field("timestamp") >= delta.timestamp_literal(since_us)) & pc.field("producer_id").is_valid()
    highest: dict[MarkKey, tuple[int, float]] = {}
    for batch in delta.read_batches(table, where, ["partition", "producer_id", "sequence", "timestamp"],
                                    files_at_once=REBUILD_FILES_AT_ONCE):
        _fold_marks(highest, topic_id, batch)
    return [(key, sequence, at_s) for key, (sequence, at_s) in highest.items()]


def _fold_marks(highest: dict[MarkKey, tuple[int, float]], topic_id: str, batch: pa.RecordBatch) -> None:
    """Raise `highest` (each producer's highest sequence per partition, and when) by a batch's rows."""
    some = pa.table({"partition": batch["partition"], "producer_id": batch["producer_id"],
                     "sequence": batch["sequence"], "timestamp": pc.cast(batch["timestamp"], pa.int64())})
    for key, sequence, at_s in marks_of(topic_id, some):
        known = highest.get(key)
        highest[key] = (max(sequence, known[0]), max(at_s, known[1])) if known else (sequence, at_s)


def handed_ids(items: Sequence[Record | Chunk], node: str, *, window_s: float) -> pa.Table:
    """The ids within the window that `hand_off.identified` gives WAL items at their own offsets,
    as `_PLACED`: the ids their copies carry wherever this node handed them."""
    given = [identified(i, node) for i in items]
    return _wal_ids([r for r in given if isinstance(r, Record)], [c for c in given if isinstance(c, Chunk)], {},
                    {i.topic_id for i in given}, int((time.time() - window_s) * 1_000_000))


def _has_id() -> pc.Expression:
    return pc.field("message_id").is_valid() | pc.field("producer_id").is_valid()


def _times(table: DeltaTable, since_us: int) -> np.ndarray:
    """The log-append times (epoch µs) of a table's rows that carry an id, from `since_us` on."""
    where = (pc.field("timestamp") >= delta.timestamp_literal(since_us)) & _has_id()
    parts = [b["timestamp"].cast(pa.int64()).to_numpy()
             for b in delta.read_batches(table, where, ["timestamp"], files_at_once=REBUILD_FILES_AT_ONCE)]
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def _table_ids(source: _Source, lo: int, hi: int | None) -> pa.Table:
    where = (pc.field("timestamp") >= delta.timestamp_literal(lo)) & _has_id()
    if hi is not None:
        where &= pc.field("timestamp") < delta.timestamp_literal(hi)
    ids = [_batch_ids(source.topic_id, b)
           for b in delta.read_batches(source.table, where, _ID_COLUMNS, files_at_once=REBUILD_FILES_AT_ONCE)]
    return pa.concat_tables(ids) if ids else _PLACED.empty_table()


def _batch_ids(topic_id: str, batch: pa.RecordBatch) -> pa.Table:
    """A batch of `_ID_COLUMNS` rows as `_PLACED`."""
    return _placed([topic_id] * batch.num_rows, batch["timestamp"].cast(pa.int64()),
                   dedup_ids(batch["message_id"], batch["producer_id"], batch["sequence"], batch["partition"]),
                   batch["partition"],
                   batch["offset"])


def _between(placed: pa.Table, lo: int, hi: int | None) -> pa.Table:
    ts = placed["timestamp"]
    keep = pc.greater_equal(ts, lo) if hi is None else pc.and_(pc.greater_equal(ts, lo), pc.less(ts, hi))
    return placed.filter(keep)


def _wal_ids(records: list[Record], chunks: list[Chunk], committed: Mapping[PartitionKey, int], live: set[bytes],
             horizon_us: int) -> pa.Table:
    """The ids of WAL items within the window that are not yet in their table (those are read
    there: counted twice, they would crowd out others within max_entries); a deleted topic's are
    left out."""
    seen: list[pa.Table] = [_PLACED.empty_table()]
    for start in range(0, len(records), _SLICE):
        some = [r for r in records[start:start + _SLICE] if r.timestamp_us >= horizon_us and r.topic_id in live
                and (r.message_id is not None or r.producer_id is not None)
                and r.offset >= committed.get((r.topic_id, r.partition), 0)]
        if some:
            ids = dedup_ids(pa.array([r.message_id for r in some], pa.string()),
                            pa.array([r.producer_id for r in some], pa.string()),
                            pa.array([r.sequence for r in some], pa.int64()),
                            pa.array([r.partition for r in some], pa.int32()))
            seen.append(_placed([r.topic_id.hex() for r in some], pa.array([r.timestamp_us for r in some], pa.int64()),
                                ids, pa.array([r.partition for r in some], pa.int32()),
                                pa.array([r.offset for r in some], pa.int64())))
    for c in chunks:
        skip = max(0, committed.get((c.topic_id, c.partition), 0) - c.offset)  # rows already in the table
        if c.timestamp_us < horizon_us or c.topic_id not in live:
            continue
        rows = c.columns.slice(skip)  # producer ids: only those a node gave messages it handed on (hand_off.py)
        ids = dedup_ids(rows["message_id"], rows["producer_id"], rows["sequence"], c.partition)
        if ids.null_count == len(ids):
            continue
        n = len(ids)
        seen.append(_placed([c.topic_id.hex()] * n, pa.array(np.full(n, c.timestamp_us, np.int64)), ids,
                            pa.array(np.full(n, c.partition, np.int32)),
                            pa.array(np.arange(c.offset + skip, c.offset + skip + n, dtype=np.int64))))
    return pa.concat_tables(seen).combine_chunks()


def _placed(topic_ids: list[str], timestamp_us: Arrow, ids: Arrow, partition: Arrow, offset: Arrow) -> pa.Table:
    """The rows that carry an id, as `_PLACED`: each (topic id, id) by its hash."""
    valid = pc.is_valid(ids)
    keys = [(t, i) for t, i in zip(topic_ids, ids.to_pylist(), strict=True) if i is not None]
    hashes = key_hashes(keys)
    return pa.table([pc.filter(timestamp_us, valid), hashes[:, 0], hashes[:, 1], pc.filter(partition, valid),
                     pc.filter(offset, valid)], schema=_PLACED)
