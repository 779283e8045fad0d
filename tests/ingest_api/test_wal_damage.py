"""A corrupt record in the WAL: the damage is named, the partition is held (not the topic), and an
operator's `wal skip` records the loss and moves the partition on, with an explicit gap."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry

from lakebroker.delivery_worker.source import PartitionSource
from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.reader import read_messages
from lakebroker.tables import delta
from lakebroker.tables.errors import NotFound
from lakebroker.tables.lost_offsets import lost_offsets
from lakebroker.tables.settings import Settings
from lakebroker.tables.topics import Holes, new_topic
from tests.delivery_worker.inproc import until
from tests.ingest_api.test_recovery import crash

pytestmark = pytest.mark.fault


def offsets_in_delta(broker: Broker, topic: str, partition: int) -> list[int]:
    table = delta.open_table(broker.layout.topic_table(topic))
    if table is None:
        return []
    rows = table.to_pyarrow_table(columns=["partition", "offset"]).to_pylist()
    return sorted(r["offset"] for r in rows if r["partition"] == partition)


def corrupt_value(wal_dir: Path, value: bytes) -> str:
    """Flip one byte of the record whose value is `value` (its frame then fails its checksum)."""
    for path in sorted(wal_dir.glob("*.wal")):
        data = bytearray(path.read_bytes())
        at = data.find(value)
        if at >= 0:
            data[at] ^= 0xFF
            path.write_bytes(bytes(data))
            return path.name
    raise AssertionError(f"{value!r} is in no segment")


async def damaged_broker(tmp_path: Path) -> tuple[Settings, str]:
    """Topic t (2 partitions) and topic u; 30 messages to t/0, 10 to t/1, 5 to u, none in Delta;
    then the record at t/0 offset 7 is damaged in a sealed segment."""
    settings = Settings(data_dir=tmp_path / "data", flush_interval_ms=20, wal_segment_bytes=2048)
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    await broker.create_topic(new_topic("t", 2))
    await broker.create_topic(new_topic("u", 1))
    broker.flusher.close()  # nothing reaches Delta before the crash
    await broker._tasks[1]
    for i in range(30):
        await broker.local.produce("t", [NewMessage(value=b"p0-m%02d" % i, partition=0)], AckMode.WAL)
        if i < 10:
            await broker.local.produce("t", [NewMessage(value=b"p1-m%02d" % i, partition=1)], AckMode.WAL)
        if i < 5:
            await broker.local.produce("u", [NewMessage(value=b"u-m%02d" % i)], AckMode.WAL)
    await crash(broker)
    segments = sorted(broker.layout.wal_dir.glob("*.wal"))
    assert len(segments) >= 3
    segment = corrupt_value(broker.layout.wal_dir, b"p0-m07")
    assert segment != segments[-1].name, "the damage is in a sealed segment"
    return settings, segment


async def test_damage_holds_one_partition_names_it_and_a_skip_moves_it_on(tmp_path: Path) -> None:
    settings, segment = await damaged_broker(tmp_path)
    broker = Broker(settings, IngestMetrics(CollectorRegistry()))
    await broker.start()
    try:
        # The topic's other partition, and other topics, keep committing (they used to stop with it).
        await until(lambda: offsets_in_delta(broker, "t", 1) == list(range(10)), "t/1 in Delta", timeout=20)
        await until(lambda: offsets_in_delta(broker, "u", 0) == list(range(5)), "u in Delta", timeout=20)
        await until(lambda: offsets_in_delta(broker, "t", 0) == list(range(7)), "t/0 up to the damage", timeout=20)
        [placed] = await broker.local.produce("t", [NewMessage(value=b"later", partition=1)], AckMode.TABLE)
        assert placed.offset == 10

        # The damage is named: partition, offsets and the WAL bytes, in readiness and a metric.
        [damage] = broker.damage.all()
        assert (damage.topic, damage.partition, damage.first, damage.last) == ("t", 0, 7, 7)
        assert segment in damage.spans
        lost_gauge = broker.metrics.registry.get_sample_value(
            "lakebroker_wal_lost_offsets", {"topic": "t", "partition": "0"})
        assert lost_gauge == 1
        assert broker.flusher.held_items(damage.key) == 22, "offsets 8-29 wait behind the hole"
        await broker.flusher.flush_once()
        assert offsets_in_delta(broker, "t", 0) == list(range(7)), "nothing is committed around the hole"
        with pytest.raises(NotFound):
            await broker.skip_lost("t", 1, "test")

        loss = await broker.skip_lost("t", 0, "test")
        assert (loss.first_offset, loss.last_offset, loss.skipped_by) == (7, 7, "test")
        await until(lambda: offsets_in_delta(broker, "t", 0) == [*range(7), *range(8, 30)], "t/0 past the skip",
                    timeout=20)
        [placed] = await broker.local.produce("t", [NewMessage(value=b"after", partition=0)], AckMode.TABLE)
        assert placed.offset == 30, "offsets stay dense past the loss: none is assigned twice"
        assert broker.damage.all() == []
        assert broker.metrics.registry.get_sample_value(
            "lakebroker_wal_lost_offsets", {"topic": "t", "partition": "0"}) == 0

        # The loss is recorded: in _system/lost_offsets, and on the topic table that readers trust.
        [recorded] = lost_offsets(broker.layout)
        assert (recorded.topic, recorded.partition, recorded.first_offset, recorded.last_offset) == ("t", 0, 7, 7)
        table = delta.open_table(broker.layout.topic_table("t"))
        assert table is not None and Holes.of(table.metadata().configuration).lost == {0: ((7, 7),)}

        # Consumers see an explicit gap, never an error nor a silent one.
        topic = broker.topic("t")
        page = read_messages(broker.layout, topic, 0, 0, 100, broker.committed_end(topic, 0))
        assert [m["offset"] for m in page["messages"]] == [*range(7), *range(8, 31)]
        assert page["lost_offsets"] == [{"first_offset": 7, "last_offset": 7}]
        source = PartitionSource(broker.layout, topic, 0)
        assert source.committed_end() == 31
        rows, covered = source.read(5, 31)
        assert [r["offset"] for r in rows] == [5, 6, *range(8, 31)] and covered == 31
        rows, covered = source.read(7, 8)
        assert rows == [] and covered == 8, "a read of the lost offsets alone moves past them"
    finally:
        await broker.stop()

    again = Broker(settings, IngestMetrics(CollectorRegistry()))
    await again.start()
    try:
        assert again.damage.all() == [], "the skip is durable: a restart finds nothing to hold"
        [placed] = await again.local.produce("t", [NewMessage(value=b"restarted", partition=0)], AckMode.TABLE)
        assert placed.offset == 31
    finally:
        await again.stop()


def lakebroker(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lakebroker", "--data-dir", str(data), *args],
                          capture_output=True, text=True, timeout=120)


async def test_wal_inspect_names_the_damage_and_wal_skip_records_it(tmp_path: Path) -> None:
    """The operator's commands, on a data dir no server holds (the skip runs an embedded broker)."""
    settings, segment = await damaged_broker(tmp_path)
    before = {p.name: p.read_bytes() for p in sorted(settings.data_dir.joinpath("wal").glob("*.wal"))}
    inspected = lakebroker(settings.data_dir, "wal", "inspect", "--json")
    assert inspected.returncode == 0, inspected.stderr
    found = orjson.loads(inspected.stdout)
    assert [c["segment"] for c in found["corrupt"]] == [segment]
    assert [(d["topic"], d["partition"], d["first_offset"], d["last_offset"]) for d in found["damage"]] == \
        [("t", 0, 7, 7)]
    assert sum(s["records"] for s in found["segments"]) == 30 + 10 + 5 - 1
    after = {p.name: p.read_bytes() for p in sorted(settings.data_dir.joinpath("wal").glob("*.wal"))}
    assert after == before, "inspect changes nothing"

    refused = lakebroker(settings.data_dir, "wal", "skip", "t", "1", "--yes")
    assert refused.returncode == 1 and "partition 1 of 't' has no WAL damage to skip" in refused.stderr

    skipped = lakebroker(settings.data_dir, "wal", "skip", "t", "0", "--yes")
    assert skipped.returncode == 0, skipped.stderr
    assert "recorded offsets 7-7 of partition 0 of t as lost" in skipped.stdout

    inspected = lakebroker(settings.data_dir, "wal", "inspect", "--json")
    found = orjson.loads(inspected.stdout)
    assert found["damage"] == []
    assert [(s["topic"], s["first_offset"], s["last_offset"], s["skipped_by"]) for s in found["skipped"]] == \
        [("t", 7, 7, "cli")]
    text = lakebroker(settings.data_dir, "wal", "inspect")
    assert text.returncode == 0 and "lost offsets awaiting a skip: none" in text.stdout


async def test_the_api_names_the_damage_and_skips_it(tmp_path: Path) -> None:
    """/readyz and GET /v1/wal/damage name the held partition; POST /v1/wal/damage/skip (admin)
    records the loss; a pull read shows the gap as `lost_offsets`."""
    from fastapi.testclient import TestClient

    from lakebroker.server import build_app

    settings, _ = await damaged_broker(tmp_path)
    with TestClient(build_app(settings)) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 503
        [problem] = ready.json()["problems"]
        assert "partition 0 of 't': offsets 7-7 (1) were lost to WAL damage" in problem
        assert "lakebroker wal skip t 0" in problem
        damage = client.get("/v1/wal/damage").json()
        [held] = client.get("/v1/dashboard").json()["lost_offsets"]
        assert (held["topic"], held["partition"], held["first_offset"], held["state"]) == ("t", 0, 7, "held")
        assert [(d["topic"], d["partition"], d["first_offset"], d["last_offset"]) for d in damage] == [("t", 0, 7, 7)]
        assert client.post("/v1/wal/damage/skip", json={"topic": "t", "partition": "0"}).status_code == 422
        missing = client.post("/v1/wal/damage/skip", json={"topic": "nope", "partition": 0})
        assert missing.status_code == 404 and "nope" in missing.json()["error"]["message"]
        skipped = client.post("/v1/wal/damage/skip", json={"topic": "t", "partition": 0})
        assert skipped.status_code == 200, skipped.text
        assert (skipped.json()["first_offset"], skipped.json()["last_offset"]) == (7, 7)
        assert client.get("/v1/wal/damage").json() == []
        assert [loss["first_offset"] for loss in client.get("/v1/wal/lost").json()] == [7]
        await until(lambda: [(d["first_offset"], d["state"]) for d in client.get("/v1/dashboard").json()[
            "lost_offsets"]] == [(7, "skipped")], "the dashboard shows the skipped loss", timeout=10)
        await until(lambda: client.get("/readyz").status_code == 200, "ready once skipped", timeout=20)
        page = client.get("/v1/topics/t/partitions/0/messages", params={"offset": 5, "limit": 5}).json()
        assert [m["offset"] for m in page["messages"]] == [5, 6, 8, 9]
        assert page["lost_offsets"] == [{"first_offset": 7, "last_offset": 7}]
