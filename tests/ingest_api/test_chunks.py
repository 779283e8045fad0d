"""Columnar chunks: their WAL frames beside per-record frames (round trip, mixed recovery, a torn
chunk at the tail, a corrupt chunk skipped without losing the frames after it), their rows as the
flusher assembles them, and a chunk that straddles the table's log-end committed from there on."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api.chunks import (
    CHUNK_SCHEMA,
    Chunk,
    chunk_bytes,
    chunk_frame,
    chunks_to_arrow,
    decode_chunk,
    encode_chunk,
    spans_by_bytes,
    split_by_bytes,
)
from lakebroker.ingest_api.flusher import Flusher
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.records import FRAME_HEADER, RECORD_OVERHEAD, Record, encode
from lakebroker.ingest_api.wal import GROUP_HEAD_BYTES, Wal, _write_all, group_head
from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import new_topic

pytestmark = pytest.mark.fault

TOPIC_ID = bytes(range(16))


def chunk(offset: int, rows: int, partition: int = 1) -> Chunk:
    columns = pa.Table.from_pylist(
        [{"key": None if i % 3 == 0 else f"k{i}", "value": None if i == 1 else b"v" * i, "format": "text",
          "headers": [("h", str(i))] if i % 2 else None, "message_id": f"id{offset + i}" if i % 2 else None,
          "producer_id": None, "sequence": None} for i in range(rows)],
        schema=CHUNK_SCHEMA,
    )
    return Chunk("t", TOPIC_ID, partition, offset, 1_700_000_000_000_000 + offset, columns, chunk_bytes(columns))


def rec(offset: int) -> Record:
    return Record("t", TOPIC_ID, 0, offset, 1_700_000_000_000_000, None, b"r%d" % offset, "text", None, None, None,
                  None)


def write(path: Path, groups: list[list[Record | Chunk]]) -> Path:
    wal = Wal(path, segment_bytes=1 << 20, fsync=True)
    wal.recover()
    for group in groups:
        wal.append([encode(x) if isinstance(x, Record) else encode_chunk(x) for x in group], group)
    wal.close()
    return sorted(path.glob("*.wal"))[-1]


def test_chunk_round_trip_keeps_every_column() -> None:
    c = chunk(40, 7)
    back = decode_chunk(encode_chunk(c)[FRAME_HEADER.size :])
    assert back.columns.equals(c.columns)
    assert (back.topic, back.topic_id, back.partition, back.offset, back.timestamp_us, back.size) == \
        (c.topic, c.topic_id, c.partition, c.offset, c.timestamp_us, c.size)
    rows = back.to_arrow(skip=2).to_pylist()
    assert [r["offset"] for r in rows] == list(range(42, 47)) and {r["partition"] for r in rows} == {1}


def test_a_chunk_frame_holds_the_stream_an_arrow_writer_writes() -> None:
    """The frame's stream is assembled from serialized pieces: it must be the bytes pa.ipc.new_stream
    writes, here for a slice of a table whose columns are chunked at different rows."""
    whole = pa.concat_tables([chunk(0, 9).columns, chunk(9, 6).columns])  # every column in chunks of 9 and 6
    value = whole.column("value").combine_chunks()
    rechunked = pa.chunked_array([value.slice(0, 5), value.slice(5)])  # the value column in chunks of 5 and 10
    columns = whole.set_column(whole.schema.get_field_index("value"), "value", rechunked).slice(2, 11)
    assert len({tuple(len(c) for c in columns.column(n).chunks) for n in columns.column_names}) > 1
    c = Chunk("t", TOPIC_ID, 1, 2, 1_700_000_000_000_000, columns, chunk_bytes(columns))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, CHUNK_SCHEMA) as writer:
        writer.write_table(columns)
    body = encode_chunk(c)[FRAME_HEADER.size:]
    assert body.endswith(sink.getvalue().to_pybytes())
    assert decode_chunk(body).columns.equals(columns)


def test_records_and_chunks_recover_together_in_order(tmp_path: Path) -> None:
    groups: list[list[Record | Chunk]] = [[rec(0), chunk(0, 5), rec(1)], [chunk(5, 3)], [rec(2)]]
    write(tmp_path, groups)
    report = Wal(tmp_path, segment_bytes=1 << 20, fsync=True).recover()
    assert report.records == [rec(0), rec(1), rec(2)]
    assert [(c.offset, c.rows) for c in report.chunks] == [(0, 5), (5, 3)]
    assert report.chunks[1].columns.equals(chunk(5, 3).columns)
    assert report.torn_bytes == 0 and report.corrupt == []


def test_a_group_written_in_pieces_is_the_frames_joined(tmp_path: Path) -> None:
    """The writer hands the WAL a chunk's frame as its head and its Arrow stream, never joined, and
    thousands of single-message frames: the segment holds exactly the joined frames."""
    big = chunk(0, 4000)
    assert sum(len(memoryview(piece)) for piece in chunk_frame(big)[1:]) > 64 * 1024  # written as it is
    records = [rec(i) for i in range(2500)]  # more pieces than one pwritev takes, joined first
    group: list[Record | Chunk] = [*records[:1200], big, *records[1200:]]
    pieces = [encode(r) for r in records[:1200]] + chunk_frame(big) + [encode(r) for r in records[1200:]]
    wal = Wal(tmp_path, segment_bytes=1 << 30, fsync=True)
    wal.recover()
    wal.append(pieces, group)
    wal.close()
    frames = b"".join(encode(x) if isinstance(x, Record) else encode_chunk(x) for x in group)
    expected = group_head(len(frames)) + frames
    segment = sorted(tmp_path.glob("*.wal"))[-1].read_bytes()
    assert segment[: len(expected)] == expected and segment[len(expected):].count(0) == len(segment) - len(expected)
    report = Wal(tmp_path, segment_bytes=1 << 30, fsync=True).recover()
    assert report.records == records and len(report.chunks) == 1 and report.chunks[0].columns.equals(big.columns)


def test_write_all_takes_more_pieces_than_one_pwritev(tmp_path: Path) -> None:
    pieces = [memoryview(b"%05d," % i) for i in range(3000)]
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        _write_all(fd, pieces, 10)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"\0" * 10 + b"".join(pieces)


def test_a_torn_chunk_at_the_tail_is_truncated(tmp_path: Path) -> None:
    segment = write(tmp_path, [[chunk(0, 4)]])
    end = GROUP_HEAD_BYTES + len(encode_chunk(chunk(0, 4)))
    torn = encode_chunk(chunk(4, 50))[:-100]  # a crash in the middle of writing the next batch
    with segment.open("r+b") as f:
        f.seek(end)
        f.write(torn)
    report = Wal(tmp_path, segment_bytes=1 << 20, fsync=True).recover()
    assert [(c.offset, c.rows) for c in report.chunks] == [(0, 4)]
    assert report.torn_bytes == len(torn.rstrip(b"\0")) and report.corrupt == []  # Arrow pads with zeros
    assert len(segment.read_bytes().rstrip(b"\0")) <= end


def test_a_corrupt_chunk_is_skipped_and_the_frames_after_it_kept(tmp_path: Path) -> None:
    segment = write(tmp_path, [[chunk(0, 4), chunk(4, 6)], [rec(0)]])  # a later write: not torn
    first = GROUP_HEAD_BYTES + len(encode_chunk(chunk(0, 4)))
    data = bytearray(segment.read_bytes())
    data[first + 60] ^= 0xFF  # inside the second chunk's Arrow stream
    segment.write_bytes(bytes(data))
    report = Wal(tmp_path, segment_bytes=1 << 20, fsync=True).recover()
    assert [(c.offset, c.rows) for c in report.chunks] == [(0, 4)]
    assert report.records == [rec(0)]
    assert [(s.start, s.end) for s in report.corrupt] == [(first, first + len(encode_chunk(chunk(4, 6))))]
    assert (tmp_path / "quarantine" / segment.name).exists()


def test_chunks_to_arrow_numbers_each_run_from_its_first_kept_message() -> None:
    a, b = chunk(10, 5, partition=0), chunk(3, 4, partition=2)
    table = chunks_to_arrow([(a, 2), (b, 0)])
    assert table.column("offset").to_pylist() == [12, 13, 14, 3, 4, 5, 6]
    assert table.column("partition").to_pylist() == [0, 0, 0, 2, 2, 2, 2]
    assert table.column("timestamp").cast(pa.int64()).to_pylist() == [a.timestamp_us] * 3 + [b.timestamp_us] * 4
    assert table.select(CHUNK_SCHEMA.names).equals(pa.concat_tables([a.columns.slice(2), b.columns]))
    assert table.equals(pa.concat_tables([a.to_arrow(skip=2), b.to_arrow()]))


def test_a_large_partition_run_is_cut_into_frames_of_bounded_size() -> None:
    rows = np.arange(100, 200)
    sizes = np.full(100, 1000, np.int64)
    pieces = split_by_bytes(rows, sizes, limit=10_640)  # ten messages of 1,064 accounted bytes each
    assert np.concatenate(pieces).tolist() == rows.tolist()
    assert all(len(p) <= 11 for p in pieces) and len(pieces) >= 9
    assert [p.tolist() for p in split_by_bytes(rows, sizes, limit=1 << 30)] == [rows.tolist()]


async def test_a_chunk_straddling_the_committed_end_is_committed_from_it(tmp_path: Path) -> None:
    """A crash after a Delta commit of offsets 0-4 but before the WAL released them: the replayed
    chunk 0-9 adds only 5-9, and a later chunk continues densely."""
    topic = new_topic("t", 3)
    flusher = Flusher(Settings(data_dir=tmp_path), Layout(tmp_path), lambda: {"t": topic},
                      IngestMetrics(CollectorRegistry()), lambda: None)
    flusher.own(topic)
    topic_id = bytes.fromhex(topic.topic_id)

    def mine(c: Chunk) -> Chunk:
        c.topic_id = topic_id
        return c

    first = mine(chunk(0, 10))
    flusher.add([mine(Chunk("t", topic_id, 1, 0, first.timestamp_us, first.columns.slice(0, 5), 0))])
    assert await flusher.flush_once()
    flusher.add([first, mine(chunk(10, 3))])
    assert await flusher.flush_once()
    table = delta.open_table(Layout(tmp_path).topic_table("t"))
    assert table is not None
    rows = table.to_pyarrow_table().sort_by("offset")
    assert rows.column("offset").to_pylist() == list(range(13))
    assert rows.select(CHUNK_SCHEMA.names).equals(pa.concat_tables([first.columns, chunk(10, 3).columns]))
    assert delta.txn_version(table, delta.partition_app_id(1)) == 13


def test_spans_by_bytes_cuts_a_range_where_split_by_bytes_cuts_its_rows() -> None:
    sizes = np.array([10, 500, 30, 700, 20, 20, 900, 5, 5, 400], np.int64)
    for start, end in ((0, 10), (2, 9), (3, 4), (5, 5 + 5)):
        for limit in (100, 1000, 1 << 20):
            rows = np.arange(start, end)
            expected = [(int(p[0]), int(p[-1]) + 1, int(sizes[p].sum()) + RECORD_OVERHEAD * len(p))
                        for p in split_by_bytes(rows, sizes[start:end], limit)]
            assert spans_by_bytes(sizes, start, end, limit) == expected, (start, end, limit)
