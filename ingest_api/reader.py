"""Reads from topic tables for the pull-consume API and topic details (blocking; run in a thread)."""

from __future__ import annotations

from typing import Any

import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from lakebroker.tables import delta
from lakebroker.tables.errors import OutOfRange, TableUnreadable
from lakebroker.tables.layout import Layout
from lakebroker.tables.log_start import PartitionLog, check_dense, partition_logs
from lakebroker.tables.message_format import message_json
from lakebroker.tables.schemas import TOPIC_SCHEMA
from lakebroker.tables.topics import Holes, TopicConfig

_COLUMNS = TOPIC_SCHEMA.names


def partition_files(layout: Layout, topic: TopicConfig) -> dict[int, PartitionLog]:
    """Every partition's files and log start, from one snapshot ({} before the table exists)."""
    table = open_topic_table(layout, topic)
    return {} if table is None else partition_logs(table, topic.partitions)


def open_topic_table(layout: Layout, topic: TopicConfig) -> DeltaTable | None:
    """The topic's table (None before it exists); TableUnreadable (503) when its log is damaged."""
    try:
        return delta.open_table(layout.topic_table(topic))
    except DeltaError as exc:
        raise unreadable(layout, topic, exc) from None


def unreadable(layout: Layout, topic: TopicConfig, exc: BaseException) -> TableUnreadable:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return TableUnreadable(f"topic {topic.name!r} is unavailable: its table {layout.topic_table(topic)} cannot be "
                           f"read ({first}); what it has taken waits in the WAL until the table is repaired or "
                           "restored")


def log_start(files: PartitionLog | None, committed_end: int) -> int:
    """Lowest offset still in the table, judged on the files' own snapshot (lakebroker.tables.log_start).
    Capped at `committed_end`: the snapshot may hold a commit the broker has not yet counted."""
    return committed_end if files is None else min(files.log_start, committed_end)


def offset_for_timestamp(layout: Layout, topic: TopicConfig, partition: int, timestamp_us: int) -> int | None:
    """First offset whose log-append time is at or after the timestamp; None if there is none yet."""
    table = open_topic_table(layout, topic)
    if table is None:
        return None
    rows = delta.read_rows(
        table,
        (pc.field("partition") == partition)
        & (pc.field("timestamp") >= delta.timestamp_literal(timestamp_us)),
        columns=["offset"],
    )
    if rows.num_rows == 0:
        return None
    return int(pc.min(rows["offset"]).as_py())


def read_messages(
    layout: Layout, topic: TopicConfig, partition: int, offset: int, limit: int, committed_end: int
) -> dict[str, Any]:
    # One snapshot for the log start and the rows: a retention commit between two reads would
    # make rows the first read still counted look missing (a false offset gap).
    table = open_topic_table(layout, topic)
    files = None if table is None else partition_logs(table, topic.partitions).get(partition)
    start = log_start(files, committed_end)
    if offset < start or offset > committed_end:
        raise OutOfRange(
            f"offset {offset} is outside partition {partition} of {topic.name!r}: "
            f"valid offsets are {start} to {committed_end} (log start to committed end)"
        )
    messages: list[dict[str, Any]] = []
    lost: list[dict[str, int]] = []
    next_offset = offset
    if offset < committed_end:
        stop = min(offset + limit, committed_end)
        assert table is not None  # committed_end > 0: the flusher created it
        rows = delta.read_rows(
            table,
            (pc.field("partition") == partition) & (pc.field("offset") >= offset) & (pc.field("offset") < stop),
            columns=_COLUMNS,
        ).sort_by("offset")
        holes = Holes.of(table.metadata().configuration)
        if not holes.anywhere:
            check_dense(topic, partition, rows["offset"].to_pylist(), offset, stop, holes)
        for row in rows.to_pylist():
            messages.append(message_json(row))
        lost = [{"first_offset": a, "last_offset": b} for a, b in holes.lost_between(partition, offset, stop)]
        # Key compaction and recorded losses leave holes: past a hole, or an empty range, the next read
        # starts after it.
        next_offset = messages[-1]["offset"] + 1 if messages else stop
    return {"messages": messages, "next_offset": next_offset, "log_start_offset": start,
            "high_watermark": committed_end, "committed_offset": committed_end, "lost_offsets": lost}
