"""The WAL's columnar chunk frames beside per-record frames: round trip, mixed recovery, a torn
chunk at the tail, and a corrupt chunk skipped without losing the frames after it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from ingest_api.chunks import CHUNK_SCHEMA, Chunk, chunk_bytes, decode_chunk, encode_chunk
from ingest_api.records import FRAME_HEADER, Record, encode
from ingest_api.wal import Wal

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


def test_records_and_chunks_recover_together_in_order(tmp_path: Path) -> None:
    groups: list[list[Record | Chunk]] = [[rec(0), chunk(0, 5), rec(1)], [chunk(5, 3)], [rec(2)]]
    write(tmp_path, groups)
    report = Wal(tmp_path, segment_bytes=1 << 20, fsync=True).recover()
    assert report.records == [rec(0), rec(1), rec(2)]
    assert [(c.offset, c.rows) for c in report.chunks] == [(0, 5), (5, 3)]
    assert report.chunks[1].columns.equals(chunk(5, 3).columns)
    assert report.torn_bytes == 0 and report.corrupt == []


def test_a_torn_chunk_at_the_tail_is_truncated(tmp_path: Path) -> None:
    segment = write(tmp_path, [[chunk(0, 4)]])
    end = len(encode_chunk(chunk(0, 4)))
    torn = encode_chunk(chunk(4, 50))[:-100]  # a crash in the middle of writing the next batch
    with segment.open("r+b") as f:
        f.seek(end)
        f.write(torn)
    report = Wal(tmp_path, segment_bytes=1 << 20, fsync=True).recover()
    assert [(c.offset, c.rows) for c in report.chunks] == [(0, 4)]
    assert report.torn_bytes == len(torn.rstrip(b"\0")) and report.corrupt == []  # Arrow pads with zeros
    assert len(segment.read_bytes().rstrip(b"\0")) <= end


def test_a_corrupt_chunk_is_skipped_and_the_frames_after_it_kept(tmp_path: Path) -> None:
    segment = write(tmp_path, [[chunk(0, 4), chunk(4, 6), rec(0)]])
    first = len(encode_chunk(chunk(0, 4)))
    data = bytearray(segment.read_bytes())
    data[first + 60] ^= 0xFF  # inside the second chunk's Arrow stream
    segment.write_bytes(bytes(data))
    report = Wal(tmp_path, segment_bytes=1 << 20, fsync=True).recover()
    assert [(c.offset, c.rows) for c in report.chunks] == [(0, 4)]
    assert report.records == [rec(0)]
    assert [(s.start, s.end) for s in report.corrupt] == [(first, first + len(encode_chunk(chunk(4, 6))))]
    assert (tmp_path / "quarantine" / segment.name).exists()
