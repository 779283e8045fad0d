from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from lakebroker.ingest_api import wal as wal_module
from lakebroker.ingest_api.records import FRAME_HEADER, Record, decode, encode
from lakebroker.ingest_api.wal import GROUP_HEAD_BYTES, Wal, delete_segments, group_head

pytestmark = pytest.mark.fault

TOPIC_ID = bytes(16)


def rec(offset: int, partition: int = 0, value: bytes | None = b"v") -> Record:
    return Record("t", TOPIC_ID, partition, offset, 1_700_000_000_000_000 + offset, f"k{offset}", value, "text",
                  {"h": "1"}, f"id{offset}", None, None)


def open_wal(path: Path, segment_bytes: int = 1 << 20) -> Wal:
    return Wal(path, segment_bytes=segment_bytes, fsync=True)


def two_writes_in_a_segment(path: Path) -> Path:
    """Records 0-2 as one write, then record 3 as a second, in one segment: its path."""
    wal = open_wal(path)
    wal.recover()
    wal.append([encode(rec(i)) for i in range(3)], [rec(i) for i in range(3)])
    wal.append([encode(rec(3))], [rec(3)])
    wal.close()
    return sorted(path.glob("*.wal"))[-1]


def three_in_a_segment(path: Path) -> tuple[list[Record], Path]:
    """Records 0-2 appended as one group and the WAL closed: the records and their segment."""
    wal = open_wal(path)
    wal.recover()
    records = [rec(i) for i in range(3)]
    wal.append([encode(r) for r in records], records)
    wal.close()
    return records, sorted(path.glob("*.wal"))[-1]


def test_record_round_trip_keeps_every_field() -> None:
    r = Record("orders", b"x" * 16, 7, 123, 456, None, None, "json", None, None, "prod", 9)
    assert decode(encode(r)[FRAME_HEADER.size :]) == r
    r2 = rec(5)
    assert decode(encode(r2)[FRAME_HEADER.size :]) == r2


def test_recover_replays_appended_records(tmp_path: Path) -> None:
    wal = open_wal(tmp_path)
    assert wal.recover().records == []
    records = [rec(i) for i in range(10)]
    wal.append([encode(r) for r in records[:4]], records[:4])
    wal.append([encode(r) for r in records[4:]], records[4:])
    wal.close()
    assert open_wal(tmp_path).recover().records == records


def test_torn_tail_is_truncated_and_not_replayed(tmp_path: Path) -> None:
    records, segment = three_in_a_segment(tmp_path)
    whole = segment.read_bytes()
    end = GROUP_HEAD_BYTES + sum(len(encode(r)) for r in records)
    assert len(whole) > end and whole.count(0, end) == len(whole) - end  # room zeroed ahead of the groups
    torn = encode(rec(3))[:-5]  # a crash in the middle of writing record 3, into that room
    with segment.open("r+b") as f:
        f.seek(end)
        f.write(torn)
    report = open_wal(tmp_path).recover()
    assert report.records == records
    assert report.torn_bytes == len(torn)
    assert report.corrupt == []
    assert segment.read_bytes() == whole[:end]


def test_a_large_group_is_written_as_it_is_and_a_small_one_after_it_into_zeroed_room(tmp_path: Path) -> None:
    """Zeroing ahead keeps a small group's fdatasync free of a file-size change; a group of
    PLAIN_WRITE_BYTES or more is not worth writing twice, and the WAL reads the same either way."""
    wal = open_wal(tmp_path, segment_bytes=1 << 30)
    wal.recover()
    segment = sorted(tmp_path.glob("*.wal"))[-1]
    big = [rec(i, value=b"x" * 1000) for i in range(wal_module.PLAIN_WRITE_BYTES // 1000 + 1)]
    wal.append([encode(r) for r in big], big)
    end = GROUP_HEAD_BYTES + sum(len(encode(r)) for r in big)
    assert segment.stat().st_size == end  # nothing zeroed beyond it
    small = [rec(len(big))]
    wal.append([encode(r) for r in small], small)
    end += GROUP_HEAD_BYTES + len(encode(small[0]))
    assert segment.stat().st_size >= end + wal_module.ZERO_AHEAD
    wal.close()
    report = open_wal(tmp_path).recover()
    assert report.records == big + small and report.torn_bytes == 0 and report.corrupt == []


def test_zeroed_room_after_the_last_group_is_neither_torn_nor_corrupt(tmp_path: Path) -> None:
    records, _ = three_in_a_segment(tmp_path)
    again = open_wal(tmp_path)
    report = again.recover()  # the old segment, zeros and all, is now sealed behind a new one
    assert report.records == records and report.torn_bytes == 0 and report.corrupt == []
    more = [rec(3)]
    again.append([encode(r) for r in more], more)
    again.close()
    report = open_wal(tmp_path).recover()
    assert report.records == records + more and report.torn_bytes == 0 and report.corrupt == []


def test_a_zeroed_page_inside_the_last_write_is_a_torn_write_and_truncated(tmp_path: Path) -> None:
    """Power lost mid-write: a middle page of the last write reads as zeros while a later page of
    the same write survives. That write's fdatasync never returned, so nothing from the bad frame
    on was acknowledged: truncated there, not replayed around as corruption (which would leave an
    offset gap that stops the partition)."""
    records, segment = three_in_a_segment(tmp_path)
    data = bytearray(segment.read_bytes())
    start1 = GROUP_HEAD_BYTES + len(encode(records[0]))
    start2 = start1 + len(encode(records[1]))
    data[start1:start2] = bytes(start2 - start1)
    segment.write_bytes(bytes(data))
    report = open_wal(tmp_path).recover()
    assert report.records == [records[0]]
    assert report.corrupt == [] and report.torn_bytes == start2 - start1 + len(encode(records[2]))
    assert segment.stat().st_size == start1
    assert not (tmp_path / "quarantine").exists()


def test_zeros_inside_an_earlier_write_are_corruption_not_an_end(tmp_path: Path) -> None:
    """A later write's fdatasync made every earlier page durable, so a lost frame before the last
    write is damage: reported, and the frames after it are kept."""
    segment = two_writes_in_a_segment(tmp_path)
    data = bytearray(segment.read_bytes())
    start1 = GROUP_HEAD_BYTES + len(encode(rec(0)))
    start2 = start1 + len(encode(rec(1)))
    data[start1:start2] = bytes(start2 - start1)
    segment.write_bytes(bytes(data))
    report = open_wal(tmp_path).recover()
    assert [r.offset for r in report.records] == [0, 2, 3]
    assert [(c.start, c.end) for c in report.corrupt] == [(start1, start2)] and report.torn_bytes == 0


def test_corrupt_record_is_reported_skipped_and_quarantined(tmp_path: Path) -> None:
    segment = two_writes_in_a_segment(tmp_path)
    data = bytearray(segment.read_bytes())
    first = GROUP_HEAD_BYTES + len(encode(rec(0)))
    data[first + 20] ^= 0xFF  # flip a bit inside record 1's body
    segment.write_bytes(bytes(data))
    report = open_wal(tmp_path).recover()
    assert [r.offset for r in report.records] == [0, 2, 3]
    assert len(report.corrupt) == 1
    assert report.corrupt[0].start == first
    assert (tmp_path / "quarantine" / segment.name).exists()


def test_damage_in_a_sealed_segment_is_corruption(tmp_path: Path) -> None:
    """Only the newest segment can hold a torn write: damage in the last write of a sealed one is
    corruption, even with nothing after it in that segment."""
    records, segment = three_in_a_segment(tmp_path)
    wal = open_wal(tmp_path)  # seals that segment behind a new one
    wal.recover()
    wal.append([encode(rec(3))], [rec(3)])
    wal.close()
    data = bytearray(segment.read_bytes())
    data[GROUP_HEAD_BYTES + len(encode(records[0])) + 20] ^= 0xFF
    segment.write_bytes(bytes(data))
    report = open_wal(tmp_path).recover()
    assert [r.offset for r in report.records] == [0, 2, 3]
    assert len(report.corrupt) == 1 and report.torn_bytes == 0


def test_sealed_segment_is_released_only_once_committed(tmp_path: Path) -> None:
    wal = open_wal(tmp_path, segment_bytes=200)
    wal.recover()
    for i in range(6):
        wal.append([encode(rec(i))], [rec(i)])
    sealed_before = len(list(tmp_path.glob("*.wal")))
    assert sealed_before >= 3
    assert wal.release(lambda key: 0) == []  # nothing committed: nothing released
    released = wal.release(lambda key: 3)  # records 0-2 committed
    assert released and all(path.exists() for path in released), "released, for the caller to delete"
    delete_segments(released)
    assert not any(path.exists() for path in released)
    remaining = [r.offset for r in open_wal(tmp_path).recover().records]
    assert set(range(3, 6)) <= set(remaining)  # nothing uncommitted was released
    assert len(remaining) < 6  # and committed segments were


def append_under_fd_limit(directory: str) -> None:
    """Child process: append while no descriptor can be opened (EMFILE), then with the limit lifted."""
    import json
    import resource

    wal = open_wal(Path(directory), segment_bytes=200)
    wal.recover()
    probe = os.dup(0)
    os.close(probe)  # the lowest free descriptor: with the limit there, every os.open fails
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    outcomes: list[bool] = []

    def append(offset: int) -> None:
        try:
            wal.append([encode(rec(offset))], [rec(offset)])
            outcomes.append(True)
        except OSError:
            outcomes.append(False)

    resource.setrlimit(resource.RLIMIT_NOFILE, (probe, hard))
    for offset in range(6):  # ~93 bytes each: the third crosses segment_bytes and must roll
        append(offset)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    for offset in range(6, 9):
        append(offset)
    wal.close()
    print(json.dumps(outcomes))


def test_failed_segment_roll_keeps_wal_state_consistent(tmp_path: Path) -> None:
    """os.open of the next segment fails for real (RLIMIT_NOFILE in a child process) after a
    group is durable: that group must not be answered as failed and then replayed, and later
    appends must still work."""
    script = f"from tests.ingest_api.test_wal import append_under_fd_limit as run; run({str(tmp_path)!r})"
    child = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120,
    )
    assert child.returncode == 0, child.stderr
    outcomes: list[bool] = json.loads(child.stdout.splitlines()[-1])
    replayed = [r.offset for r in open_wal(tmp_path).recover().records]
    answered_ok = [i for i, ok in enumerate(outcomes) if ok]
    assert replayed == answered_ok, f"appends answered {outcomes}, recovery replayed offsets {replayed}"
    assert "could not roll" in child.stderr, f"the roll never failed, so nothing was tested: {child.stderr}"
    assert outcomes[6:] == [True, True, True], f"appends after the limit was lifted: {outcomes[6:]}"
    assert len(list(tmp_path.glob("*.wal"))) > 1, "the segment was never rolled once descriptors were free"


def test_resync_over_binary_payloads_checksums_only_frame_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A corrupt multi-MB binary frame mid-segment and a torn multi-MB tail: resync looks only
    at positions that start like a frame, so the checksum count stays bounded by the frames."""
    rng = random.Random(10)
    wal = open_wal(tmp_path, segment_bytes=1 << 30)
    wal.recover()
    records = [rec(0), rec(1, value=rng.randbytes(3 << 20)), rec(2)]
    wal.append([encode(r) for r in records], records)
    wal.close()
    segment = sorted(tmp_path.glob("*.wal"))[-1]
    data = bytearray(segment.read_bytes())
    start1 = GROUP_HEAD_BYTES + len(encode(records[0]))
    start2 = start1 + len(encode(records[1]))
    data[start1 + (1 << 20)] ^= 0xFF  # damage record 1's payload
    frame3 = encode(rec(3, value=rng.randbytes(3 << 20)))
    torn = frame3[:-100]  # a crash while writing record 3, the next write
    end = start2 + len(encode(records[2]))
    segment.write_bytes(bytes(data[:end]) + group_head(len(frame3)) + torn + bytes(4096))

    checksums = 0
    real_crc_ok = wal_module.frame_crc_ok

    def counting_crc_ok(length: int, crc: int, body: bytes) -> bool:
        nonlocal checksums
        checksums += 1
        return real_crc_ok(length, crc, body)

    monkeypatch.setattr(wal_module, "frame_crc_ok", counting_crc_ok)
    report = open_wal(tmp_path).recover()
    assert [r.offset for r in report.records] == [0, 2]
    assert report.records == [records[0], records[2]]
    assert [(c.start, c.end) for c in report.corrupt] == [(start1, start2)]
    assert report.torn_bytes == len(torn)
    assert checksums <= 9, f"{checksums} checksum attempts to recover 4 frames and 2 group heads"


def test_a_clean_stop_leaves_nothing_to_replay(tmp_path: Path) -> None:
    """Everything flushed at a clean stop: the WAL is emptied, so the next start reads no segment
    it would only skip (a full WAL segment of committed batches cost a restart tens of MB)."""
    from fastapi.testclient import TestClient

    from lakebroker.server import build_app
    from lakebroker.tables.settings import Settings

    settings = Settings(data_dir=tmp_path / "data", deliver_in_serve=False)
    with TestClient(build_app(settings)) as c:
        c.post("/v1/topics", json={"name": "t", "partitions": 2}).raise_for_status()
        for i in range(20):
            assert c.post("/v1/topics/t/messages", json={"value": i, "id": f"m{i}"}).status_code == 200
        c.post("/v1/topics/t/batch", json={"messages": [{"value": i} for i in range(50)]}).raise_for_status()
    segments = sorted((tmp_path / "data" / "wal").glob("*.wal"))
    assert [p.stat().st_size for p in segments] == [0], segments
    with TestClient(build_app(settings)) as c:  # and what was produced is all there, ids remembered
        assert c.post("/v1/topics/t/messages", json={"value": 0, "id": "m0"}).json()["duplicate"] is True
        ends = c.get("/v1/topics/t").json()["partition_offsets"]
        assert sum(p["committed_offset"] for p in ends) == 70
    numbers = [int(p.stem) for p in (tmp_path / "data" / "wal").glob("*.wal")]
    assert numbers and min(numbers) > int(segments[0].stem) - 1  # numbering never goes back


def _writes(path: Path, syncs: list[bool], segment_bytes: int = 1 << 20) -> list[int]:
    """One record a write, offsets 0.., each synced or not as `syncs` says: each write's start."""
    wal = open_wal(path, segment_bytes)
    wal.recover()
    starts = []
    for i, sync in enumerate(syncs):
        starts.append(wal._size)
        wal.append([encode(rec(i))], [rec(i)], sync=sync)
    wal._fd, fd = -1, wal._fd  # a crash: no clean close (which would sync)
    os.close(fd)
    return starts


def test_a_lost_page_of_an_unsynced_write_is_a_torn_tail_with_every_write_after_it(tmp_path: Path) -> None:
    """ack=none groups are written without an fdatasync. After a power loss any of their pages may be
    missing while later pages survive: the first bad one ends the log there (those messages were never
    promised durable), and nothing after it is replayed around a gap, so no partition is held."""
    starts = _writes(tmp_path, [True, False, False, False])
    segment = sorted(tmp_path.glob("*.wal"))[-1]
    data = bytearray(segment.read_bytes())
    data[starts[1] + GROUP_HEAD_BYTES + 20] ^= 0xFF  # a page of write 1 lost; writes 2 and 3 reached the disk
    segment.write_bytes(bytes(data))
    report = open_wal(tmp_path).recover()
    assert [r.offset for r in report.records] == [0]
    assert report.corrupt == [] and report.torn_bytes > 0
    assert not (tmp_path / "quarantine").exists()


def test_a_write_synced_after_an_unsynced_one_makes_it_durable_and_damage_in_it_corruption(tmp_path: Path) -> None:
    """Write 2's fdatasync covered write 1; write 3's head shows that write 2's returned. A bad frame
    in write 1 is then damage, as for any synced write: reported, quarantined, the rest replayed."""
    starts = _writes(tmp_path, [True, False, True, False])
    segment = sorted(tmp_path.glob("*.wal"))[-1]
    data = bytearray(segment.read_bytes())
    data[starts[1] + GROUP_HEAD_BYTES + 20] ^= 0xFF
    segment.write_bytes(bytes(data))
    report = open_wal(tmp_path).recover()
    assert [r.offset for r in report.records] == [0, 2, 3]
    assert len(report.corrupt) == 1 and report.torn_bytes == 0


def test_a_segment_rolled_after_an_unsynced_write_is_synced_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    """The next segment's writes must not outlive an unsynced tail of the one before it: damage in a
    sealed segment is corruption, so its last write is synced before the roll."""
    synced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(wal_module.os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])
    _writes(tmp_path, [False, False, False], segment_bytes=1)  # every write fills its segment
    assert len(sorted(tmp_path.glob("*.wal"))) == 4
    assert len(synced) >= 3, "each unsynced write synced before its segment was sealed"
    assert [r.offset for r in open_wal(tmp_path).recover().records] == [0, 1, 2]


async def test_a_serving_broker_deletes_committed_segments_off_the_event_loop(tmp_path: Path) -> None:
    """Segments whose records are all committed are deleted while the broker serves, by a thread:
    unlinking a full segment (64 MB by default) held the event loop for milliseconds."""
    import asyncio
    import threading

    from prometheus_client import CollectorRegistry

    from lakebroker.ingest_api.broker import Broker
    from lakebroker.ingest_api.messages import AckMode, NewMessage
    from lakebroker.ingest_api.metrics import IngestMetrics
    from lakebroker.tables.settings import Settings
    from lakebroker.tables.topics import new_topic

    broker = Broker(Settings(data_dir=tmp_path / "data", wal_segment_bytes=2048, flush_interval_ms=20),
                    IngestMetrics(CollectorRegistry()))
    wal_dir = tmp_path / "data" / "wal"
    deleted_by: list[str] = []
    real_delete = wal_module.delete_segments

    def deleting(paths: list[Path]) -> None:
        deleted_by.append(threading.current_thread().name)
        real_delete(paths)

    await broker.start()
    try:
        await broker.create_topic(new_topic("t", 2))
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("lakebroker.ingest_api.broker.delete_segments", deleting)
            for i in range(40):  # ~200 bytes a frame: a new segment every ~10 messages
                await broker.local.produce("t", [NewMessage(value=b"x" * 100, key=f"k{i}")], AckMode.WAL)
            assert max(int(p.stem) for p in wal_dir.glob("*.wal")) >= 4, "the WAL rolled several segments"
            assert await broker.flusher.flush_once()
            for _ in range(200):  # the deletion runs in a thread after the commit: bounded wait
                if len(list(wal_dir.glob("*.wal"))) == 1:
                    break
                await asyncio.sleep(0.01)
        assert len(list(wal_dir.glob("*.wal"))) == 1, "every sealed segment was committed: only the active one stays"
        assert deleted_by and threading.main_thread().name not in deleted_by
    finally:
        await broker.stop()
