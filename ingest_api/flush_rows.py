"""The rows a flush commits, built from WAL items in runs, never one by one.

A columnar batch's chunk (chunks.py) is already a dense run of one partition, and single records
are gathered into runs first. Runs are trimmed to each partition's committed end by slicing, and
concatenated as Arrow tables, one per partition.
"""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa

from lakebroker.ingest_api.chunks import Chunk, chunks_to_arrow
from lakebroker.ingest_api.records import Record
from lakebroker.tables.errors import OffsetGap
from lakebroker.tables.schemas import TOPIC_SCHEMA


def records_to_arrow(records: list[Record]) -> pa.Table:
    records = sorted(records, key=lambda r: (r.partition, r.offset))
    return pa.table(
        {
            "partition": pa.array([r.partition for r in records], pa.int32()),
            "offset": pa.array([r.offset for r in records], pa.int64()),
            "timestamp": pa.array([r.timestamp_us for r in records], pa.timestamp("us", tz="UTC")),
            "key": pa.array([r.key for r in records], pa.string()),
            "value": pa.array([r.value for r in records], pa.binary()),
            "format": pa.array([r.format for r in records], pa.string()),
            "headers": pa.array(
                [None if r.headers is None else list(r.headers.items()) for r in records],
                pa.map_(pa.string(), pa.string()),
            ),
            "message_id": pa.array([r.message_id for r in records], pa.string()),
            "producer_id": pa.array([r.producer_id for r in records], pa.string()),
            "sequence": pa.array([r.sequence for r in records], pa.int64()),
        },
        schema=TOPIC_SCHEMA,
    )


class _Run(Protocol):
    """A dense run of one partition's rows: a Chunk, or a _RecordRun."""

    partition: int
    offset: int

    @property
    def end(self) -> int: ...

    def to_arrow(self, skip: int = 0) -> pa.Table: ...


def runs_of(items: list[Record | Chunk]) -> list[_Run]:
    """Every item as a dense run of one partition: chunks as they are, records gathered into
    runs of consecutive offsets (the single-message path's per-row work, kept off batches)."""
    runs: list[_Run] = [c for c in items if isinstance(c, Chunk)]
    records = sorted((r for r in items if isinstance(r, Record)), key=lambda r: (r.partition, r.offset))
    start = 0
    for i in range(1, len(records) + 1):
        if i == len(records) or records[i].partition != records[i - 1].partition \
                or records[i].offset != records[i - 1].offset + 1:
            if records:
                runs.append(_RecordRun(records[start:i]))
            start = i
    return runs


class _RecordRun:
    """Single records of consecutive offsets, converted to Arrow once, when flushed."""

    def __init__(self, records: list[Record]) -> None:
        self.partition, self.offset = records[0].partition, records[0].offset
        self._records = records

    @property
    def end(self) -> int:
        return self.offset + len(self._records)

    def to_arrow(self, skip: int = 0) -> pa.Table:
        return records_to_arrow(self._records[skip:])


def contiguous_from(ends: dict[int, int], runs: list[_Run]) -> list[tuple[_Run, int]]:
    """The runs at or past each partition's committed end, which must continue it densely, in
    (partition, offset) order, each with how many of its first rows are already in the table;
    `ends` moves to the new log-ends."""
    out: list[tuple[_Run, int]] = []
    for run in sorted(runs, key=lambda c: (c.partition, c.offset)):
        expected = ends[run.partition]
        if run.end <= expected:
            continue  # already in the table, or queued twice: committed once
        if run.offset > expected:
            raise OffsetGap(
                f"partition {run.partition}: a commit would start at offset {run.offset}, but the table ends at "
                f"{expected}; refused so no gap is committed"
            )
        out.append((run, expected - run.offset))
        ends[run.partition] = run.end
    return out


def by_partition(pieces: list[tuple[_Run, int]]) -> dict[int, list[tuple[_Run, int]]]:
    """The pieces of each partition, in their order: each partition's rows go to a file of their own."""
    out: dict[int, list[tuple[_Run, int]]] = {}
    for run, skip in pieces:
        out.setdefault(run.partition, []).append((run, skip))
    return out


def assemble(pieces: list[tuple[_Run, int]]) -> pa.Table:
    """One Arrow table of the pieces' rows, in order: neighbouring chunks built together."""
    tables: list[pa.Table] = []
    chunks: list[tuple[Chunk, int]] = []
    for run, skip in pieces:
        if isinstance(run, Chunk):
            chunks.append((run, skip))
            continue
        if chunks:
            tables.append(chunks_to_arrow(chunks))
            chunks = []
        tables.append(run.to_arrow(skip))
    if chunks:
        tables.append(chunks_to_arrow(chunks))
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)
