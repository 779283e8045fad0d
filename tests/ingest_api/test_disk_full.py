"""A full disk answers a clear 507, loses nothing acknowledged, and recovers once space returns."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from lakebroker.ingest_api.group_commit import GroupCommitter, Pending
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.records import Record
from lakebroker.ingest_api.wal import ZERO_AHEAD, Wal
from lakebroker.server import build_app
from lakebroker.tables.errors import StorageUnavailable
from lakebroker.tables.settings import Settings
from tests.full_disk import fill
from tests.waiting import eventually

pytestmark = pytest.mark.fault


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_disk_full_gives_507_then_recovers(small_disk: Path) -> None:
    settings = Settings(data_dir=small_disk / "data", flush_interval_ms=20)
    with TestClient(build_app(settings)) as client:
        client.post("/v1/topics", json={"name": "orders", "partitions": 1})
        before = client.post("/v1/topics/orders/messages?ack=table", json={"value": "before", "id": "a"})
        assert before.status_code == 200
        ballast = small_disk / "ballast"
        fill(ballast)
        # The WAL's room zeroed ahead of its last group (ingest_api/wal.py) still takes a few.
        big = "x" * 100_000
        accepted = 0
        for _ in range(ZERO_AHEAD // len(big) + 2):
            refused = client.post("/v1/topics/orders/messages", json={"value": big})
            if refused.status_code != 200:
                break
            accepted += 1
        assert refused.status_code == 507, refused.text
        assert "disk full" in refused.json()["error"]["message"]
        ballast.unlink()
        after = client.post("/v1/topics/orders/messages?ack=table", json={"value": "after", "id": "b"})
        assert after.status_code == 200, after.text
        assert after.json()["offset"] == 1 + accepted  # the refused send left no gap
        assert client.get("/readyz").status_code == 200
        read = client.get("/v1/topics/orders/partitions/0/messages", params={"offset": 0}).json()
        values = [m["value"] for m in read["messages"]]
        assert values[0] == "before" and values[-1] == "after" and len(values) == 2 + accepted


def test_delta_commit_on_full_disk_is_retried_and_nothing_is_lost(small_disk: Path) -> None:

    settings = Settings(data_dir=small_disk / "data", flush_interval_ms=1500)
    with TestClient(build_app(settings)) as client:
        client.post("/v1/topics", json={"name": "orders", "partitions": 1})
        acked = client.post("/v1/topics/orders/messages", json={"value": "in the WAL"})
        assert acked.status_code == 200
        ballast = small_disk / "ballast"
        fill(ballast)  # before the flusher's first commit
        not_ready = eventually(lambda: (r := client.get("/readyz")).status_code == 503 and r, 20,
                               what="/readyz answering 503")
        assert "Delta commits are failing" in " ".join(not_ready.json()["problems"])
        ballast.unlink()
        body = eventually(lambda: (b := client.get("/v1/topics/orders/partitions/0/messages",
                                                   params={"offset": 0}).json())["messages"] and b, 20,
                          what="the WAL's message in the table")
        assert [m["value"] for m in body["messages"]] == ["in the WAL"]
        assert client.get("/readyz").status_code == 200


async def test_a_failed_write_fails_the_groups_handed_behind_it_and_leaves_no_gap(small_disk: Path) -> None:
    """The loop hands the WAL writer the next group while it writes the last one. When that write
    fails, a group already handed behind it holds the offsets after the failed ones: it must fail
    too, unwritten, and the offsets roll back to before the first, so a retry leaves no gap."""
    wal = Wal(small_disk / "wal", segment_bytes=1 << 30, fsync=True)
    wal.recover()
    durable: list[Record] = []
    committer = GroupCommitter(wal, {}, durable.extend, IngestMetrics(CollectorRegistry()))
    runner = asyncio.create_task(committer.run())
    loop = asyncio.get_running_loop()

    def message(value: bytes) -> Pending:
        return Pending(Record("t", bytes(16), 0, -1, 0, None, value, "text", None, None, None, None),
                       loop.create_future())

    first = message(b"first")
    committer.submit_one(first)
    await first.future  # type: ignore[misc]
    # a needs more room than the disk has; b would fit (the room a's failed write gives back).
    a, b, c = message(b"a" * 2 * ZERO_AHEAD), message(b"b" * 100), message(b"c" * 100)
    with wal._lock:  # the writer takes a's group, then waits here while b's is handed behind it
        committer.submit_one(a)
        while committer._writer is None or a.record.offset < 0 or not committer._writer.groups.empty():
            await asyncio.sleep(0.001)
        committer.submit_one(b)
        while b.record.offset < 0:
            await asyncio.sleep(0.001)
        assert (a.record.offset, b.record.offset) == (1, 2)
        fill(small_disk / "ballast")
    for failed in (a, b):
        with pytest.raises(StorageUnavailable, match="disk full"):
            await failed.future  # type: ignore[misc]
        assert isinstance(failed.outcome, StorageUnavailable)
    (small_disk / "ballast").unlink()
    committer.submit_one(c)
    assert await c.future == (0, 1, c.record.timestamp_us)  # type: ignore[misc]
    committer.close()
    await runner
    wal.close()

    assert durable == [first.record, c.record]
    again = Wal(small_disk / "wal", segment_bytes=1 << 30, fsync=True)
    assert [(r.offset, r.value) for r in again.recover().records] == [(0, b"first"), (1, b"c" * 100)]
    again.close()


async def test_a_failed_write_fails_the_messages_of_its_partitions_still_queued_behind_it(small_disk: Path) -> None:
    """Messages still queued behind a failed write (the writer's bound on rows in flight held them
    back) may not land before it in their partition: a producer's later batch stored ahead of its
    earlier one, which fails and is sent again, reorders the partition, and to Kafka's sequence
    check the earlier one's retry is then below the producer's mark, answered as a duplicate and
    never stored. They fail with it; another partition's queued messages go on."""
    wal = Wal(small_disk / "wal", segment_bytes=1 << 30, fsync=True)
    wal.recover()
    durable: list[Record] = []
    committer = GroupCommitter(wal, {}, durable.extend, IngestMetrics(CollectorRegistry()), max_group=1)
    runner = asyncio.create_task(committer.run())
    loop = asyncio.get_running_loop()

    def message(partition: int, value: bytes) -> Pending:
        return Pending(Record("t", bytes(16), partition, -1, 0, None, value, "text", None, None, None, None),
                       loop.create_future())

    first = message(0, b"first")
    committer.submit_one(first)
    await first.future  # type: ignore[misc]
    # a needs more room than the disk has; b and c would fit (the room a's failed write gives back).
    a, b, c = message(0, b"a" * 2 * ZERO_AHEAD), message(0, b"b" * 100), message(1, b"c" * 100)
    with wal._lock:  # the writer takes a's group and waits here; one row in flight is the bound
        committer.submit_one(a)
        while committer._writer is None or a.record.offset < 0 or not committer._writer.groups.empty():
            await asyncio.sleep(0.001)
        committer.submit_one(b)
        committer.submit_one(c)
        await asyncio.sleep(0.05)
        assert (b.record.offset, c.record.offset) == (-1, -1), "b and c wait behind the bound"
        fill(small_disk / "ballast")
    for failed in (a, b):
        with pytest.raises(StorageUnavailable, match="disk full"):
            await failed.future  # type: ignore[misc]
    assert await c.future == (1, 0, c.record.timestamp_us)  # type: ignore[misc]
    (small_disk / "ballast").unlink()
    again = message(0, b"b" * 100)
    committer.submit_one(again)
    assert (await again.future)[:2] == (0, 1)  # type: ignore[index]
    committer.close()
    await runner
    wal.close()
    assert [(r.partition, r.value) for r in durable] == [(0, b"first"), (1, b"c" * 100), (0, b"b" * 100)]
