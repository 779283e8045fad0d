from __future__ import annotations

from pathlib import Path

import pytest

from ingest_api.records import Record, decode, encode
from ingest_api.wal import Wal

pytestmark = pytest.mark.fault

TOPIC_ID = bytes(16)


def rec(offset: int, partition: int = 0, value: bytes | None = b"v") -> Record:
    return Record("t", TOPIC_ID, partition, offset, 1_700_000_000_000_000 + offset, f"k{offset}", value, "text",
                  {"h": "1"}, f"id{offset}", None, None)


def open_wal(path: Path, segment_bytes: int = 1 << 20) -> Wal:
    return Wal(path, segment_bytes=segment_bytes, fsync=True)


def test_record_round_trip_keeps_every_field() -> None:
    r = Record("orders", b"x" * 16, 7, 123, 456, None, None, "json", None, None, "prod", 9)
    assert decode(encode(r)[8:]) == r
    r2 = rec(5)
    assert decode(encode(r2)[8:]) == r2


def test_recover_replays_appended_records(tmp_path: Path) -> None:
    wal = open_wal(tmp_path)
    assert wal.recover().records == []
    records = [rec(i) for i in range(10)]
    wal.append([encode(r) for r in records[:4]], records[:4])
    wal.append([encode(r) for r in records[4:]], records[4:])
    wal.close()
    assert open_wal(tmp_path).recover().records == records


def test_torn_tail_is_truncated_and_not_replayed(tmp_path: Path) -> None:
    wal = open_wal(tmp_path)
    wal.recover()
    records = [rec(i) for i in range(3)]
    wal.append([encode(r) for r in records], records)
    wal.close()
    segment = sorted(tmp_path.glob("*.wal"))[-1]
    whole = segment.read_bytes()
    torn = encode(rec(3))[:-5]  # a crash in the middle of writing record 3
    segment.write_bytes(whole + torn)
    report = open_wal(tmp_path).recover()
    assert report.records == records
    assert report.torn_bytes == len(torn)
    assert report.corrupt == []
    assert segment.read_bytes() == whole


def test_corrupt_record_is_reported_skipped_and_quarantined(tmp_path: Path) -> None:
    wal = open_wal(tmp_path)
    wal.recover()
    records = [rec(i) for i in range(3)]
    wal.append([encode(r) for r in records], records)
    wal.close()
    segment = sorted(tmp_path.glob("*.wal"))[-1]
    data = bytearray(segment.read_bytes())
    first = len(encode(records[0]))
    data[first + 20] ^= 0xFF  # flip a bit inside record 1's body
    segment.write_bytes(bytes(data))
    report = open_wal(tmp_path).recover()
    assert [r.offset for r in report.records] == [0, 2]
    assert len(report.corrupt) == 1
    assert report.corrupt[0].start == first
    assert (tmp_path / "quarantine" / segment.name).exists()


def test_sealed_segment_is_released_only_once_committed(tmp_path: Path) -> None:
    wal = open_wal(tmp_path, segment_bytes=200)
    wal.recover()
    for i in range(6):
        wal.append([encode(rec(i))], [rec(i)])
    sealed_before = len(list(tmp_path.glob("*.wal")))
    assert sealed_before >= 3
    assert wal.release(lambda key: 0) == 0  # nothing committed: nothing deleted
    assert wal.release(lambda key: 3) >= 1  # records 0-2 committed
    remaining = [r.offset for r in open_wal(tmp_path).recover().records]
    assert set(range(3, 6)) <= set(remaining)  # nothing uncommitted was released
    assert len(remaining) < 6  # and committed segments were
